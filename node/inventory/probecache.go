package inventory

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ProbeCacheDir is where finished Python and TensorFlow probes are kept,
// one file per Python environment, so that a node started again (or a
// second node on the machine) knows its software at once instead of
// importing TensorFlow again (seconds idle, minutes on a busy machine).
// Empty turns the cache off.
var ProbeCacheDir = defaultProbeCacheDir()

// ProbeCacheTTL bounds how long a kept probe is believed even when
// nothing it is keyed on has changed.
const ProbeCacheTTL = 24 * time.Hour

func defaultProbeCacheDir() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "deepmarket", "probes")
}

// probeEntry is one kept probe.
type probeEntry struct {
	Key        string    `json:"key"`
	Python     string    `json:"python"`
	TensorFlow string    `json:"tensorflow"`
	At         time.Time `json:"at"`
}

// probeKey names what a probe of python depends on: the interpreter
// (its path, where it resolves to, size and modification time), the
// package directories beside it and in the user's home (whose
// modification times change when a package is installed, upgraded or
// removed), and PYTHONPATH. Any change makes a new key, and the probe
// runs again. ok is false when python cannot be found: no caching then.
func probeKey(python string) (string, bool) {
	python, err := exec.LookPath(python)
	if err != nil {
		return "", false
	}
	if python, err = filepath.Abs(python); err != nil {
		return "", false
	}
	real, err := filepath.EvalSymlinks(python)
	if err != nil {
		return "", false
	}
	st, err := os.Stat(real)
	if err != nil {
		return "", false
	}
	var b strings.Builder
	fmt.Fprintf(&b, "python %s -> %s %d %d\n", python, real, st.Size(), st.ModTime().UnixNano())
	fmt.Fprintf(&b, "PYTHONPATH=%s\n", os.Getenv("PYTHONPATH"))
	seen := map[string]bool{}
	for _, prefix := range []string{filepath.Dir(filepath.Dir(python)), filepath.Dir(filepath.Dir(real))} {
		for _, pat := range []string{"pyvenv.cfg", "lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages", "local/lib/python3*/dist-packages"} {
			matches, _ := filepath.Glob(filepath.Join(prefix, pat))
			for _, m := range matches {
				if seen[m] {
					continue
				}
				seen[m] = true
				if st, err := os.Stat(m); err == nil {
					fmt.Fprintf(&b, "%s %d\n", m, st.ModTime().UnixNano())
				}
			}
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		matches, _ := filepath.Glob(filepath.Join(home, ".local/lib/python3*/site-packages"))
		for _, m := range matches {
			if st, err := os.Stat(m); err == nil {
				fmt.Fprintf(&b, "%s %d\n", m, st.ModTime().UnixNano())
			}
		}
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:]), true
}

// cachedProbe returns the kept probe for key, if there is one younger
// than ProbeCacheTTL.
func cachedProbe(key string) (py, tf string, ok bool) {
	if ProbeCacheDir == "" {
		return "", "", false
	}
	raw, err := os.ReadFile(filepath.Join(ProbeCacheDir, key[:32]+".json"))
	if err != nil {
		return "", "", false
	}
	var e probeEntry
	if json.Unmarshal(raw, &e) != nil || e.Key != key || e.Python == "" || time.Since(e.At) > ProbeCacheTTL || time.Since(e.At) < 0 {
		return "", "", false
	}
	return e.Python, e.TensorFlow, true
}

// keepProbe keeps a finished probe under key, written whole or not at
// all (a temporary file renamed into place). Failures only lose the
// cache.
func keepProbe(key, py, tf string) {
	if ProbeCacheDir == "" || py == "" {
		return
	}
	if err := os.MkdirAll(ProbeCacheDir, 0o755); err != nil {
		return
	}
	raw, err := json.Marshal(probeEntry{Key: key, Python: py, TensorFlow: tf, At: time.Now().UTC()})
	if err != nil {
		return
	}
	f, err := os.CreateTemp(ProbeCacheDir, ".probe-*")
	if err != nil {
		return
	}
	_, werr := f.Write(raw)
	if cerr := f.Close(); werr != nil || cerr != nil {
		os.Remove(f.Name())
		return
	}
	if os.Rename(f.Name(), filepath.Join(ProbeCacheDir, key[:32]+".json")) != nil {
		os.Remove(f.Name())
	}
}

// lockProbe waits, within ctx, to be the one process on the machine
// probing the environment named key, so that nodes started together
// import TensorFlow once between them rather than once each: the others
// find the first one's answer kept. It returns the unlock function; with
// the cache off, or a lock that cannot be made, it returns at once and
// the probe runs unshared.
func lockProbe(ctx context.Context, key string) (unlock func(), err error) {
	nop := func() {}
	if ProbeCacheDir == "" || os.MkdirAll(ProbeCacheDir, 0o755) != nil {
		return nop, nil
	}
	f, err := os.OpenFile(filepath.Join(ProbeCacheDir, key[:32]+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nop, nil
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nop, nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nop, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
