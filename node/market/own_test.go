package market

import (
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

func TestOwnMachinesKeepsTheAccountsLatestOffers(t *testing.T) {
	var m OwnMachines
	now := time.Now()
	m.Saw("me", &p2p.Received{Offer: &p2p.Offer{Machine: "m1", Owner: "me", Moniker: "old"}, Seq: 1}, now)
	m.Saw("me", &p2p.Received{Offer: &p2p.Offer{Machine: "m1", Owner: "me", Moniker: "new"}, Seq: 2}, now)
	m.Saw("me", &p2p.Received{Offer: &p2p.Offer{Machine: "m2", Owner: "someone"}, Seq: 1}, now)
	m.Saw("me", &p2p.Received{Withdrawal: &p2p.Withdrawal{Machine: "m3"}}, now)
	got := m.List()
	if len(got) != 1 || got[0].Offer.Moniker != "new" || got[0].Seq != 2 {
		t.Fatalf("List = %+v; want m1's latest offer only", got)
	}
}
