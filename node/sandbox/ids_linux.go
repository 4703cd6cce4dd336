package sandbox

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// leaseDir holds one lock file per uid in use. It is machine-wide (every
// node on the machine, and every node of a test process, shares it) and in
// /run, so that a reboot, which ends every job, frees every uid.
const leaseDir = "/run/deepmarket/ids"

// Lease is one uid (and gid) of an IDRange held for one job. The lock that
// holds it is released with the process, so a node that dies frees its
// uids; Acquire also skips any uid a live process still runs as.
type Lease struct {
	// ID is the uid and gid the job runs as.
	ID int
	f  *os.File
}

// cursor spreads leases over the range, so that a uid freed a moment ago
// is the last to be handed out again.
var cursor atomic.Uint64

func init() { cursor.Store(rand.Uint64()) }

// Acquire leases a uid of r that no other lease holds, no account uses and
// no process runs as. Release it once the job is gone.
func (r IDRange) Acquire() (*Lease, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: leasing job uids needs root", ErrUnsupported)
	}
	if err := os.MkdirAll(leaseDir, 0o700); err != nil {
		return nil, fmt.Errorf("lease a job uid: %w", err)
	}
	busy, err := liveUIDs()
	if err != nil {
		return nil, fmt.Errorf("lease a job uid: %w", err)
	}
	n := uint64(r.Len())
	start := cursor.Add(1)
	for i := range n {
		id := r.First + int((start+i)%n)
		if busy[id] || hasAccount(id) {
			continue
		}
		f, err := os.OpenFile(filepath.Join(leaseDir, strconv.Itoa(id)), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("lease a job uid: %w", err)
		}
		// flock locks belong to the open file, so a second lease of the
		// same uid fails even within this process.
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				continue
			}
			return nil, fmt.Errorf("lease a job uid: %w", err)
		}
		cursor.Store(start + i)
		return &Lease{ID: id, f: f}, nil
	}
	return nil, fmt.Errorf("%w %s: every one is leased, used by an account or still runs a process; widen [executor] uid_range", ErrNoFreeID, r)
}

// Release frees the uid for another job. Call it only once nothing of the
// job is left: no process (Wait has returned) and no file it owns.
func (l *Lease) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing drops the flock
	l.f = nil
	return err
}

// hasAccount reports whether a user or group with this id exists, through
// the name service (LDAP included where the build uses the C resolver).
func hasAccount(id int) bool {
	s := strconv.Itoa(id)
	if _, err := user.LookupId(s); err == nil {
		return true
	}
	_, err := user.LookupGroupId(s)
	return err == nil
}

// liveUIDs is the set of uids that some process runs as (real, effective,
// saved or filesystem uid).
func liveUIDs() (map[int]bool, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	ids := map[int]bool{}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue // gone meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				for _, f := range strings.Fields(v) {
					if id, err := strconv.Atoi(f); err == nil {
						ids[id] = true
					}
				}
				break
			}
		}
	}
	return ids, nil
}
