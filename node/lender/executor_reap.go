package lender

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/node/sandbox"
)

// sandboxesKey prefixes the node store's record of each worker's sandbox,
// "sandboxes/<sandbox name>" -> sandboxRecord. A record lives from before
// the worker's sandbox starts until its work dir is removed, so that the
// next start of a node that died meanwhile (SIGKILL, power cut) finds what
// it left: workers still running, holding cores and memory no one pays
// for, and work dirs no one will remove.
const sandboxesKey = "sandboxes/"

// sandboxRecord is the stored record of one worker's sandbox.
type sandboxRecord struct {
	Job   string `json:"job"`
	Index int    `json:"index"`
	Dir   string `json:"dir"` // its work dir
}

// reapLeftovers kills the workers a previous run of this node left
// running and removes their work dirs. Only the records in this node's
// own store are followed, so the workers of other nodes on this machine
// are never touched. Receipts stay: they are what this machine is owed.
func (e *Executor) reapLeftovers() {
	log := e.log.With("module", "executor")
	recs := map[string]sandboxRecord{}
	err := e.store.Each(sandboxesKey, func(key string, doc []byte) error {
		var r sandboxRecord
		if err := json.Unmarshal(doc, &r); err != nil {
			log.Warn("unreadable worker record: reaping its sandbox, keeping its work dir", "key", key, "err", err)
		}
		recs[strings.TrimPrefix(key, sandboxesKey)] = r
		return nil
	})
	if err != nil {
		log.Warn("cannot read the records of workers of a previous run: any still running are not reaped", "err", err)
		return
	}
	for name, r := range recs {
		killed, err := sandbox.Reap(name)
		if err != nil {
			// The record stays: the next start tries again.
			log.Warn("cannot reap a worker left by a previous run of this node", "sandbox", name, "err", err)
			continue
		}
		if killed > 0 {
			log.Warn(fmt.Sprintf("reaped %d processes of a worker left running by a previous run of this node", killed),
				"sandbox", name, "job", r.Job, "worker", r.Index)
		}
		if e.isWorkerDir(r) {
			if err := e.root.RemoveAll(workerName(r.Job, r.Index)); err != nil {
				log.Warn("cannot remove the work dir of a worker of a previous run", "dir", r.Dir, "err", err)
				continue
			}
			log.Info("removed the work dir of a worker of a previous run of this node", "dir", r.Dir)
		} else if r.Dir != "" {
			log.Info("kept a dir outside this node's work dir", "dir", r.Dir)
		}
		if err := e.store.Delete(sandboxesKey + name); err != nil {
			log.Warn("cannot forget a reaped worker", "err", err)
		}
	}
}

// isWorkerDir says whether a record's dir is the work dir this executor
// gives its worker, the only dir a record may have removed.
func (e *Executor) isWorkerDir(r sandboxRecord) bool {
	if len(r.Job) < 16 || r.Index < 0 || r.Dir == "" {
		return false
	}
	if _, err := hex.DecodeString(r.Job); err != nil {
		return false
	}
	return filepath.Clean(r.Dir) == filepath.Join(e.dir, workerName(r.Job, r.Index))
}

// sweepEvery is how often ended workers' logs and dirs are looked at.
func sweepEvery(keep time.Duration) time.Duration { return min(time.Hour, max(keep/4, 5*time.Second)) }

// sweep forgets workers that ended longer than keep ago (their submitters
// never said they were done: their dirs go) and removes log dirs not
// written for as long, so that nothing of a job stays on the lender
// forever.
func (e *Executor) sweep(now time.Time) {
	live := map[string]bool{}
	for _, w := range e.snapshot() {
		live[w.name] = true
		select {
		case <-w.done:
		default:
			continue
		}
		w.mu.Lock()
		stale := !w.ended.IsZero() && now.Sub(w.ended) > e.keep && !w.swept
		w.swept = w.swept || stale
		w.mu.Unlock()
		if stale {
			e.spawn(func(context.Context) { e.finish(w) })
		}
	}
	f, err := e.logs.Open(".")
	if err != nil {
		return
	}
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return
	}
	for _, d := range entries {
		fi, err := d.Info()
		if err != nil || live[d.Name()] || now.Sub(fi.ModTime()) <= e.keep {
			continue
		}
		// A log dir's mtime is that of its last rotation; its current file
		// tells when the worker last wrote.
		if cur, err := e.logs.Stat(filepath.Join(d.Name(), workerLogCurrent)); err == nil && now.Sub(cur.ModTime()) <= e.keep {
			continue
		}
		if err := e.logs.RemoveAll(d.Name()); err != nil {
			e.log.Warn("cannot remove an old worker log", "module", "executor", "dir", d.Name(), "err", err)
		}
	}
}
