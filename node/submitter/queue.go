package submitter

// The queue: this node's jobs that found no machines, or only prices
// above their benefit, wait here instead of failing, and take turns to
// bid again. A turn comes when the offers this node holds show room for
// the job that its last bid was not refused on (a machine joined, a job
// ended, a hold was released, prices changed), or when its backoff runs
// out, for the machines schedulers see and this node does not. The
// order is queueOrder's and the choice pickBidders' (decide.go).

import (
	"context"
	"sync"
	"time"
)

// queueBids is how many of the queue's jobs bid at once.
const queueBids = 16

// queue is the waiting jobs; every method is safe for concurrent use.
type queue struct {
	offers Offers
	starve time.Duration

	mu      sync.Mutex
	waiting map[string]*queued
	last    uint64 // the fingerprint of the offers when last looked at
}

// queued is one job's place: its waiter and the channel closed at its
// turn.
type queued struct {
	waiter
	turn chan struct{}
}

func newQueue(offers Offers, starve time.Duration) *queue {
	return &queue{offers: offers, starve: starve, waiting: map[string]*queued{}}
}

// enter puts w in the queue (in its place again, if it bid from there),
// and returns the channel closed at its turn, which may be at once.
func (q *queue) enter(w waiter) <-chan struct{} {
	q.mu.Lock()
	e := &queued{waiter: w, turn: make(chan struct{})}
	q.waiting[w.id] = e
	q.mu.Unlock()
	q.dispatch(time.Now())
	return e.turn
}

// leave takes the job out of the queue: it was placed, or ended.
func (q *queue) leave(id string) {
	q.mu.Lock()
	_, ok := q.waiting[id]
	delete(q.waiting, id)
	q.mu.Unlock()
	if ok {
		q.dispatch(time.Now()) // its bid's slot is free
	}
}

// fingerprint is the offers' fingerprint as the queue last saw it.
func (q *queue) fingerprint() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.last
}

// dispatch gives the jobs pickBidders picks their turn.
func (q *queue) dispatch(now time.Time) {
	q.mu.Lock()
	idle := len(q.waiting) == 0
	q.mu.Unlock()
	if idle {
		return
	}
	rooms, fp := roomsOf(q.offers.Offers(now))
	q.mu.Lock()
	defer q.mu.Unlock()
	q.last = fp
	order, byWaiter := q.orderLocked(now)
	for _, w := range pickBidders(order, rooms, fp, now, q.starve, queueBids) {
		e := byWaiter[w]
		e.bidding = true
		close(e.turn)
	}
}

// orderLocked lists the waiters in queue order, and their entries.
func (q *queue) orderLocked(now time.Time) ([]*waiter, map[*waiter]*queued) {
	order := make([]*waiter, 0, len(q.waiting))
	byWaiter := make(map[*waiter]*queued, len(q.waiting))
	for _, e := range q.waiting {
		order = append(order, &e.waiter)
		byWaiter[&e.waiter] = e
	}
	queueOrder(order, now, q.starve)
	return order, byWaiter
}

// positions numbers the jobs in queue order, from 1.
func (q *queue) positions(now time.Time) map[string]int {
	q.mu.Lock()
	defer q.mu.Unlock()
	order, _ := q.orderLocked(now)
	out := make(map[string]int, len(order))
	for i, w := range order {
		out[w.id] = i + 1
	}
	return out
}

// run looks at the offers for room every look while jobs wait, until ctx
// ends.
func (q *queue) run(ctx context.Context, look time.Duration) {
	t := time.NewTicker(look)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			q.dispatch(now)
		}
	}
}
