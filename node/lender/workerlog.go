package lender

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// A worker's output reaches its log through a pipe the node reads (the
// sandbox never hands a job a file of the node's), into at most two files
// of workerLogFileBytes in the worker's own dir under <work>/logs: the
// current one and the one before. Offsets are counted over everything the
// worker wrote, so a submitter reading from where it left off carries on
// across a rotation, and is told when what it had not read yet was
// dropped.
const (
	workerLogFileBytes = 8 << 20
	workerLogFiles     = 2
	// WorkerLogBytes is what a worker's logs may take on disk; it counts
	// against the worker's disk bound.
	WorkerLogBytes = workerLogFiles * workerLogFileBytes

	workerLogCurrent  = "output.log"
	workerLogPrevious = "output.log.1"
)

// workerLog is one worker's capped, rotated log.
type workerLog struct {
	dir *os.Root // the worker's log dir, which only the node writes

	mu        sync.Mutex
	cur       *os.File
	curStart  int64 // offset of cur's first byte
	curLen    int64
	prevStart int64 // offset of the previous file's first byte; == curStart when none
}

var _ io.Writer = (*workerLog)(nil)

// openWorkerLog creates the log dir name under logs, replacing a leftover,
// and opens its first file.
func openWorkerLog(logs *os.Root, name string) (*workerLog, error) {
	if err := logs.RemoveAll(name); err != nil {
		return nil, fmt.Errorf("log dir: %w", err)
	}
	if err := logs.Mkdir(name, 0o700); err != nil {
		return nil, fmt.Errorf("log dir: %w", err)
	}
	dir, err := logs.OpenRoot(name)
	if err != nil {
		return nil, fmt.Errorf("log dir: %w", err)
	}
	cur, err := dir.OpenFile(workerLogCurrent, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("log file: %w", err)
	}
	return &workerLog{dir: dir, cur: cur}, nil
}

// Write appends p, rotating when the current file is full. It never fails
// the writer: a log that cannot be written loses the output, not the job.
func (l *workerLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	for len(p) > 0 && l.cur != nil {
		if l.curLen == workerLogFileBytes {
			if err := l.rotate(); err != nil {
				l.cur.Close()
				l.cur = nil
				break
			}
		}
		chunk := p[:min(int64(len(p)), workerLogFileBytes-l.curLen)]
		w, err := l.cur.WriteAt(chunk, l.curLen)
		l.curLen += int64(w)
		p = p[w:]
		if err != nil {
			break
		}
	}
	return n, nil
}

// rotate makes the full current file the previous one, dropping the one
// before.
func (l *workerLog) rotate() error {
	if err := l.dir.Rename(workerLogCurrent, workerLogPrevious); err != nil {
		return err
	}
	cur, err := l.dir.OpenFile(workerLogCurrent, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	l.cur.Close()
	l.cur = cur
	l.prevStart, l.curStart, l.curLen = l.curStart, l.curStart+l.curLen, 0
	return nil
}

// Size is how many bytes the worker has written in all.
func (l *workerLog) Size() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.curStart + l.curLen
}

// Read returns up to p2p.MaxLogChunk bytes from offset off. Output older
// than the two files kept is gone: a read from before them starts with a
// line saying how much was dropped and carries on from the oldest byte
// kept.
func (l *workerLog) Read(off int64) p2p.Logs {
	l.mu.Lock()
	defer l.mu.Unlock()
	off = max(off, 0)
	var note []byte
	if off < l.prevStart {
		note = fmt.Appendf(nil, "[deepmarket: %s of older output dropped: a worker keeps its last %d MiB]\n",
			units.FormatSize(uint64(l.prevStart-off)), WorkerLogBytes>>20)
		off = l.prevStart
	}
	buf := make([]byte, p2p.MaxLogChunk-len(note))
	name, start, end := workerLogCurrent, l.curStart, l.curStart+l.curLen
	if off < l.curStart {
		name, start, end = workerLogPrevious, l.prevStart, l.curStart
	}
	var n int
	f, err := l.dir.Open(name)
	if err == nil {
		n, err = f.ReadAt(buf[:max(0, min(int64(len(buf)), end-off))], off-start)
		f.Close()
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return p2p.Logs{Data: note, Next: off}
	}
	return p2p.Logs{Data: append(note, buf[:n]...), Next: off + int64(n)}
}

// Close closes the log once the worker is forgotten; its files stay until
// the sweep removes them.
func (l *workerLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	if l.cur != nil {
		err = l.cur.Close()
		l.cur = nil
	}
	return errors.Join(err, l.dir.Close())
}
