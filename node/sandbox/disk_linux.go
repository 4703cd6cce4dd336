package sandbox

import (
	"errors"
	"io/fs"
	"math"
	"path/filepath"
	"syscall"
)

// dirUsage is the disk space allocated to files under dir, hard links
// counted once. Anything it cannot measure (a path too deep for the kernel to
// stat, say) makes the dir count as unbounded: a job must not be able to hide
// data from the watchdog.
func dirUsage(dir string) uint64 {
	var total uint64
	seen := map[[2]uint64]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // deleted while we walked
			}
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if !d.IsDir() && st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if seen[key] {
				return nil
			}
			seen[key] = true
		}
		total += uint64(st.Blocks) * 512
		return nil
	})
	if err != nil {
		return math.MaxUint64
	}
	return total
}
