package sandbox

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A job's dir is the job's to change at any moment, symbolic links
// included, while the node (root) walks it. Every walk here therefore goes
// from descriptor to descriptor: each entry is opened relative to its
// parent's descriptor with O_NOFOLLOW, checked and acted on through its own
// descriptor, so no path is ever resolved again, no link is ever followed,
// and what is checked is what is acted on.

// maxTreeDepth bounds a walk: each level holds a descriptor open.
const maxTreeDepth = 1024

// errTooDeep reports a tree nested deeper than maxTreeDepth.
var errTooDeep = fmt.Errorf("sandbox: the job dir is nested deeper than %d levels", maxTreeDepth)

// walkTree calls fn for dir and everything beneath it, parents before
// their children. fn gets an O_PATH descriptor of the entry (valid only
// during the call) and its stat. Entries removed meanwhile are skipped.
func walkTree(dir string, fn func(fd int, st *unix.Stat_t) error) error {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	return walkFD(fd, fn, 0)
}

func walkFD(fd int, fn func(fd int, st *unix.Stat_t) error, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if err := fn(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	if depth >= maxTreeDepth {
		return errTooDeep
	}
	// Reopen the very directory checked above to list it.
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil // removed since it was opened (a temporary dir): nothing left in it
	}
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dfd), "dir")
	defer d.Close()
	for {
		names, rerr := d.Readdirnames(256)
		for _, name := range names {
			cfd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			if err != nil {
				return err
			}
			err = walkFD(cfd, fn, depth+1)
			unix.Close(cfd)
			if err != nil {
				return err
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, unix.ENOENT) {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// chownTree hands dir and everything in it to uid:gid without following
// a link. Handing files to a job skips those with other hard links, which
// may be files outside the dir; root takes everything back.
func chownTree(dir string, uid, gid int) error {
	err := walkTree(dir, func(fd int, st *unix.Stat_t) error {
		kind := st.Mode & unix.S_IFMT
		if uid != 0 && kind != unix.S_IFDIR && kind != unix.S_IFLNK && st.Nlink > 1 {
			return nil
		}
		if int(st.Uid) == uid && int(st.Gid) == gid {
			return nil
		}
		return unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
	})
	if err != nil {
		return fmt.Errorf("chown job dir %s to %d: %w", dir, uid, err)
	}
	return nil
}

// dirUsage is the disk space allocated to files under dir, hard links
// counted once. A tree it cannot measure (too deep, say) counts as
// unbounded: a job must not be able to hide data from the watchdog.
func dirUsage(dir string) uint64 {
	// A walk that fails counts as over the bound (a job must not hide its
	// files from it), but only if it fails twice: the job's own files come
	// and go while it runs.
	total, err := dirUsageOnce(dir)
	if err != nil {
		total, err = dirUsageOnce(dir)
	}
	if err != nil {
		return math.MaxUint64
	}
	return total
}

func dirUsageOnce(dir string) (uint64, error) {
	var total uint64
	seen := map[[2]uint64]bool{}
	err := walkTree(dir, func(_ int, st *unix.Stat_t) error {
		if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if seen[key] {
				return nil
			}
			seen[key] = true
		}
		total += uint64(st.Blocks) * 512
		return nil
	})
	return total, err
}

// prepareDir creates the job dir and its tmp (the job's /tmp), mode 0700,
// and hands both, with whatever the node already put there, to uid: other
// users, other jobs' uids included, must not read the job's data.
func prepareDir(dir string, uid int) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create job dir: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open job dir %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Mkdirat(fd, "tmp", 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create job dir tmp: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "tmp", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("job dir %s: tmp is not a directory", dir)
	}
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return fmt.Errorf("chmod job dir: %w", err)
	}
	if err := chownTree(dir, uid, uid); err != nil {
		return err
	}
	return reachable(dir, uid)
}

// reachable checks that uid can traverse every parent of dir, so that a
// misplaced job dir (say under /root) fails at Start with a clear message
// rather than as an obscure bind-mount error inside bwrap.
func reachable(dir string, uid int) error {
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
			int(st.Uid) == uid && m&0o100 != 0 ||
			int(st.Gid) == uid && m&0o010 != 0
		if !ok {
			return fmt.Errorf("sandbox: job dir %s is not reachable by a job's uid: %s has mode %o; put job dirs under a path others can traverse", dir, p, m)
		}
		if p == "/" {
			return nil
		}
	}
}

// CheckRootOnly reports whether only root can change dir or any directory
// on the way to it: each is root's, and one that others may write to is
// sticky (as /var/tmp), so that no one else can rename what root made in
// it. The node lays out work dirs by path under such a dir; under a dir
// another user controls, a swapped link would send root's writes
// elsewhere.
func CheckRootOnly(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	p := "/"
	parts := strings.Split(strings.TrimPrefix(real, "/"), "/")
	for i := -1; i < len(parts); i++ {
		if i >= 0 {
			p = filepath.Join(p, parts[i])
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", p)
		}
		last := i == len(parts)-1
		switch {
		case st.Uid != 0:
			return fmt.Errorf("%s belongs to uid %d, not root: another user could swap what root makes under it", p, st.Uid)
		case fi.Mode().Perm()&0o022 != 0 && (last || fi.Mode()&os.ModeSticky == 0):
			return fmt.Errorf("%s has mode %v: others may write to it", p, fi.Mode())
		}
	}
	return nil
}
