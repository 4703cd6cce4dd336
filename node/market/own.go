package market

import (
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

// OwnMachines remembers the machines of one account whose offers this
// node has held, so that one that vanishes without withdrawing can be
// shown as lost (PLUTO's panic state). The zero value is ready.
type OwnMachines struct {
	mu   sync.Mutex
	seen map[string]HeldOffer // by machine peer ID
}

// Saw records an offer from the gossip if owner's.
func (m *OwnMachines) Saw(owner string, r *p2p.Received, now time.Time) {
	o := r.Offer
	if o == nil || o.Owner != owner {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil {
		m.seen = map[string]HeldOffer{}
	}
	m.seen[o.Machine] = HeldOffer{Offer: *o, Seq: r.Seq, Expires: r.Expiry, Received: now}
}

// List is the last offer seen of each machine, in no order.
func (m *OwnMachines) List() []HeldOffer {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]HeldOffer, 0, len(m.seen))
	for _, h := range m.seen {
		out = append(out, h)
	}
	return out
}
