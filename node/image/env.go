package image

import (
	"fmt"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Rootfs is an image unpacked for a worker: its root filesystem and the
// environment its config sets (Env).
type Rootfs struct {
	Dir string
	Env []string
}

// Bounds on an image config's environment: a stranger's image must not
// make every launch copy megabytes of variables.
const (
	maxEnv      = 256
	maxEnvBytes = 64 << 10
)

// sandboxOwned are the variables the sandbox sets itself, whatever the
// image says: the job's home and temporary dir are its own dir.
var sandboxOwned = map[string]bool{"HOME": true, "TMPDIR": true, "PWD": true}

// Env is the environment img's config sets for its processes ("K=V", as
// docker runs them: its PATH, PYTHONPATH, LANG, ...), less HOME, TMPDIR
// and PWD, which the sandbox sets. A config with more than maxEnv
// entries or maxEnvBytes of them, or an entry that is not KEY=VALUE, is
// refused.
func Env(img v1.Image) ([]string, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("the image's config: %w", err)
	}
	env := cf.Config.Env
	if len(env) > maxEnv {
		return nil, fmt.Errorf("the image's config sets %d variables, more than %d", len(env), maxEnv)
	}
	var out []string
	n := 0
	for _, kv := range env {
		n += len(kv)
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(kv, "\x00") {
			return nil, fmt.Errorf("the image's config sets %.40q: not KEY=VALUE", kv)
		}
		if !sandboxOwned[k] {
			out = append(out, kv)
		}
	}
	if n > maxEnvBytes {
		return nil, fmt.Errorf("the image's config sets %d bytes of variables, more than %d", n, maxEnvBytes)
	}
	return out, nil
}
