package sandbox

import (
	"fmt"
	"path/filepath"
	"strings"
)

// hostOnly are trees a job must never see, not even read-only: the host's
// processes and devices, its sockets and runtime state, its scratch space
// shared by every user, the users' homes and the system's secrets.
var hostOnly = map[string]string{
	"/proc":       "the host's processes",
	"/sys":        "the kernel's state",
	"/dev":        "the host's devices",
	"/run":        "the host's sockets and runtime state",
	"/var/run":    "the host's sockets and runtime state",
	"/tmp":        "every user's scratch files",
	"/var/tmp":    "every user's scratch files",
	"/root":       "root's home",
	"/etc":        "the system's configuration and secrets",
	"/boot":       "the kernel and its boot files",
	"/var/lib":    "the services' data",
	"/var/log":    "the system's logs",
	"/var/mail":   "the users' mail",
	"/var/spool":  "the queued mail and jobs of every user",
	"/lost+found": "what fsck recovered",
}

// tooWide are directories a job may see parts of, but never whole: each
// holds what belongs to others.
var tooWide = map[string]string{
	"/":      "the whole host",
	"/home":  "every user's home",
	"/var":   "the host's data, logs and spool",
	"/mnt":   "every mounted volume",
	"/media": "every mounted volume",
	"/srv":   "every service's data",
	"/opt":   "every add-on package",
}

// CheckReadOnly says whether path may be bound read-only into job sandboxes
// (as Spec.ReadOnly), and if not, why: it must be absolute and must not be,
// contain or lie inside a tree that belongs to the host or to other users
// (/proc, /dev, /run, /tmp, /etc, /root, a home under /home, /var as a whole,
// / itself), nor contain any of the private paths (such as the node's
// home). Symbolic links are resolved and the target is checked too. The
// error reads after the path: "/ would expose the whole host".
func CheckReadOnly(path string, private ...string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%s is not an absolute path", path)
	}
	clean := filepath.Clean(path)
	if err := checkReadOnly(clean, private); err != nil {
		return err
	}
	if real, err := filepath.EvalSymlinks(clean); err == nil && real != clean {
		if err := checkReadOnly(real, private); err != nil {
			return fmt.Errorf("%s leads to %s, and %w", clean, real, err)
		}
	}
	return nil
}

func checkReadOnly(p string, private []string) error {
	if why, ok := tooWide[p]; ok {
		return fmt.Errorf("%s would expose %s", p, why)
	}
	for top, why := range hostOnly {
		if under(p, top) {
			return fmt.Errorf("%s would expose %s (%s)", p, why, top)
		}
	}
	if filepath.Dir(p) == "/home" {
		return fmt.Errorf("%s would expose a user's whole home", p)
	}
	for _, q := range private {
		if q == "" {
			continue
		}
		q = filepath.Clean(q)
		if under(q, p) {
			return fmt.Errorf("%s would expose %s, which jobs must not read", p, q)
		}
	}
	return nil
}

// under reports whether p is base or inside it.
func under(p, base string) bool {
	p, base = filepath.Clean(p), filepath.Clean(base)
	return p == base || base == "/" || strings.HasPrefix(p, base+"/")
}
