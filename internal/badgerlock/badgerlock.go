// Package badgerlock opens a badger database whose directory lock may be
// held for a moment by a process that is about to let it go.
//
// Badger locks its directory with flock on a descriptor of the directory.
// A process that forks (the node starts every job's sandbox so) gives the
// child a copy of each descriptor, that one among them, and the child
// holds the lock until it execs, which closes it: under load, a moment
// after the database was closed. An open in that moment fails at once
// ("Cannot acquire directory lock"), as if another node used the
// directory. Open tries again for Wait before saying so.
package badgerlock

import (
	"strings"
	"time"
)

// Wait is how long Open tries again while the directory lock is held.
const Wait = 2 * time.Second

// retryEvery is the pause between tries.
const retryEvery = 50 * time.Millisecond

// Locked reports whether err is badger's refusal of a directory another
// descriptor has locked.
func Locked(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Cannot acquire directory lock")
}

// Open calls open until it succeeds, fails otherwise than on the
// directory lock, or Wait has passed; it returns the last result.
func Open[T any](open func() (T, error)) (T, error) {
	deadline := time.Now().Add(Wait)
	for {
		v, err := open()
		if !Locked(err) || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(retryEvery)
	}
}
