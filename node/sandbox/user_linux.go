package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// identity is who a job runs as.
type identity struct {
	name     string
	uid, gid int
	// switchUser: the node is root, so the trampoline drops to uid/gid.
	switchUser bool
}

var (
	jobUserOnce sync.Once
	jobUserID   identity
)

// defaultIdentity returns the job user, creating deepmarket-job once when
// the node is root and it is missing, and falling back to nobody when that
// fails. When the node is not root, jobs run as the node's own user.
func defaultIdentity() identity {
	jobUserOnce.Do(func() {
		if os.Geteuid() != 0 {
			u, _ := user.Current()
			name := strconv.Itoa(os.Getuid())
			if u != nil {
				name = u.Username
			}
			jobUserID = identity{name: name, uid: os.Getuid(), gid: os.Getgid()}
			return
		}
		if id, ok := lookupIdentity(JobUserName); ok {
			jobUserID = id
			return
		}
		if err := createJobUser(); err == nil {
			if id, ok := lookupIdentity(JobUserName); ok {
				jobUserID = id
				return
			}
		}
		if id, ok := lookupIdentity("nobody"); ok {
			jobUserID = id
			return
		}
		jobUserID = identity{name: "nobody", uid: 65534, gid: 65534, switchUser: true}
	})
	return jobUserID
}

func lookupIdentity(name string) (identity, bool) {
	u, err := user.Lookup(name)
	if err != nil {
		return identity{}, false
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil || uid == 0 {
		return identity{}, false
	}
	return identity{name: name, uid: uid, gid: gid, switchUser: true}, true
}

// createJobUser adds a system user with no home and no login shell.
func createJobUser() error {
	path, err := exec.LookPath("useradd")
	if err != nil {
		path = "/usr/sbin/useradd"
	}
	cmd := exec.Command(path, "--system", "--user-group", "--no-create-home",
		"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", JobUserName)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("useradd %s: %w: %s", JobUserName, err, out)
	}
	return nil
}

// identityFor resolves the user a spec's job runs as.
func identityFor(s Spec) (identity, error) {
	def := defaultIdentity()
	if s.UID == 0 && s.GID == 0 {
		return def, nil
	}
	if !def.switchUser {
		return identity{}, fmt.Errorf("sandbox: Spec.UID needs the node to run as root")
	}
	if s.UID <= 0 || s.GID <= 0 {
		return identity{}, fmt.Errorf("sandbox: Spec.UID and Spec.GID must both be positive, got %d:%d", s.UID, s.GID)
	}
	name := strconv.Itoa(s.UID)
	if u, err := user.LookupId(name); err == nil {
		name = u.Username
	}
	return identity{name: name, uid: s.UID, gid: s.GID, switchUser: true}, nil
}

// prepareDir creates the job dir and its tmp, and hands both (and whatever
// the node already put there) to the job user, mode 0700: other users, other
// jobs' users included, must not read the job's data.
func prepareDir(dir string, id identity) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("sandbox: job dir %q is not absolute", dir)
	}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o700); err != nil {
		return fmt.Errorf("create job dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("chmod job dir: %w", err)
	}
	if !id.switchUser {
		return nil
	}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// A hard link may share its inode with a file outside the dir (a
		// reused dir, a careless copy); chowning it would hand that file over.
		if !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
					return nil
				}
			}
		}
		return os.Lchown(p, id.uid, id.gid)
	})
	if err != nil {
		return fmt.Errorf("chown job dir: %w", err)
	}
	return reachable(dir, id)
}

// reachable checks that uid can traverse every parent of dir, so that a
// misplaced job dir (say under /root) fails at Start with a clear message
// rather than as an obscure chdir or bind-mount error inside the job.
func reachable(dir string, id identity) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return errors.New("sandbox: no stat_t")
		}
		m := fi.Mode().Perm()
		ok = m&0o001 != 0 ||
			int(st.Uid) == id.uid && m&0o100 != 0 ||
			int(st.Gid) == id.gid && m&0o010 != 0
		if !ok {
			return fmt.Errorf("sandbox: job dir %s is not reachable by user %s: %s has mode %o; put job dirs under a path others can traverse", dir, id.name, p, m)
		}
		if p == "/" {
			return nil
		}
	}
}
