package lender

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/deepmarket/deepmarket/units"
)

// A chief's output dir is read by the node, as root and outside the job's
// cgroup, after the job has ended: adding it to storage hashes every byte
// of every file, once per name. A job that leaves sparse files (ftruncate
// makes a 9 GiB file in an instant, with nothing on disk), hard links to
// them or a million entries would make the node work unpaid for minutes
// or hours, and announce a result of any size. So before anything is read
// the dir is walked with lstat alone, and refused whole when it passes one
// of these bounds:
//
//   - the bytes the import would read (regular files' sizes, a file with
//     several links counted once per link) are at most the job's disk
//     bound (workerDiskBytes);
//   - the bytes of those files that are not on disk (holes of sparse
//     files, per link) are at most maxOutputHoles in all;
//   - at most maxOutputEntries names, nested at most maxOutputDepth deep;
//   - only regular files, directories and symbolic links (never followed).
//
// What passes costs the node at most the disk bound in reading, and the
// time that takes counts in the worker's paid time (collectOutput).
const (
	maxOutputEntries = 10_000
	maxOutputDepth   = 64
	maxOutputHoles   = 64 << 20
)

// outputRefusal is why a chief's output is not kept, as the worker's
// status says it.
type outputRefusal string

func (r outputRefusal) Error() string { return string(r) }

func refuseOutput(format string, args ...any) error {
	return outputRefusal(fmt.Sprintf(format, args...))
}

// outputLimits bound what the node reads of an output dir.
type outputLimits struct {
	bytes   uint64 // what the import reads, each link of a file counted
	holes   uint64 // of those, bytes not on disk
	entries int
	depth   int
}

// measureOutput walks the tree at path beneath root with lstat alone,
// reading no file and following no link, and returns the bytes an import
// of it would read; an outputRefusal once a bound of lim is passed. The
// tree must not change meanwhile: nothing of the job may be left running.
func measureOutput(root *os.Root, path string, lim outputLimits) (uint64, error) {
	m := outputWalk{root: root, lim: lim}
	fi, err := root.Lstat(path)
	if err != nil {
		return 0, err
	}
	err = m.entry(path, fi, 0)
	return m.bytes, err
}

// outputWalk is one measureOutput: what it has counted so far.
type outputWalk struct {
	root    *os.Root
	lim     outputLimits
	bytes   uint64
	holes   uint64
	entries int
}

func (m *outputWalk) entry(path string, fi fs.FileInfo, depth int) error {
	switch {
	case fi.IsDir():
		return m.dir(path, fi, depth)
	case fi.Mode().IsRegular():
		return m.file(path, fi)
	case fi.Mode()&fs.ModeSymlink != 0:
		return nil // kept as a link: its target is never read
	default:
		return refuseOutput("output refused: %s is a %s; only files, directories and symbolic links are kept", path, kindOf(fi.Mode()))
	}
}

// dir lists one directory, closing it before it looks at its entries, so
// that the walk holds one descriptor however deep it goes.
func (m *outputWalk) dir(path string, fi fs.FileInfo, depth int) error {
	if depth >= m.lim.depth {
		return refuseOutput("output too large: the output dir nests dirs more than %d deep", m.lim.depth)
	}
	names, err := m.list(path, fi)
	if err != nil {
		return err
	}
	for _, name := range names {
		p := filepath.Join(path, name)
		cfi, err := m.root.Lstat(p)
		if err != nil {
			return err
		}
		if err := m.entry(p, cfi, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// list reads the names in directory path, if it is still the one fi
// describes, counting them as it goes.
func (m *outputWalk) list(path string, fi fs.FileInfo) ([]string, error) {
	f, err := m.root.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if got, err := f.Stat(); err != nil || !got.IsDir() || !os.SameFile(got, fi) {
		return nil, fmt.Errorf("%s changed while it was measured", path)
	}
	var names []string
	for {
		chunk, err := f.Readdirnames(256)
		m.entries += len(chunk)
		if m.entries > m.lim.entries {
			return nil, refuseOutput("output too large: more than %d files and dirs in the output dir", m.lim.entries)
		}
		names = append(names, chunk...)
		if errors.Is(err, io.EOF) {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (m *outputWalk) file(path string, fi fs.FileInfo) error {
	size := uint64(fi.Size())
	if size > m.lim.bytes-m.bytes {
		return refuseOutput("output too large: more than %s in the output dir, the job's disk bound (a file counts once per hard link)",
			units.FormatSize(m.lim.bytes))
	}
	m.bytes += size
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no stat", path)
	}
	if disk := uint64(st.Blocks) * 512; size > disk {
		if m.holes += size - disk; m.holes > m.lim.holes {
			return refuseOutput("output too large: %s is sparse (%s long, %s on disk); at most %s of holes are kept",
				path, units.FormatSize(size), units.FormatSize(disk), units.FormatSize(m.lim.holes))
		}
	}
	return nil
}

// kindOf names a special file's type.
func kindOf(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}
