package market

import (
	"context"
	"crypto/rand"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
)

func newPeerID(t *testing.T) peer.ID {
	t.Helper()
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// records is the ledger's record of each machine's past jobs.
type records map[string]ledger.MachineRecord

func (r records) MachineRecord(_ context.Context, machine string) (ledger.MachineRecord, error) {
	return r[machine], nil
}

// latencies are measured round-trip times to peers.
type latencies map[peer.ID]time.Duration

func (l latencies) Peers() []p2p.PeerInfo {
	var out []p2p.PeerInfo
	for id, d := range l {
		out = append(out, p2p.PeerInfo{ID: id, Latency: d})
	}
	return out
}

// fourMachines is a book of four machines: two at site "a" (one with
// TensorFlow), two at site "b".
func fourMachines(t *testing.T, now time.Time) (*OfferBook, []peer.ID) {
	book := NewOfferBook(10, 10)
	var ids []peer.ID
	for i, site := range []string{"a", "a", "b", "b"} {
		id := newPeerID(t)
		ids = append(ids, id)
		o := &p2p.Offer{Machine: id.String(), Owner: "owner", Site: site, Lent: p2p.Resources{Cores: 2, MemBytes: 1 << 30}}
		if i == 0 {
			o.Software.TensorFlow = "2.16"
		}
		if !book.Apply(&p2p.Received{Signer: id, Seq: 1, Expiry: now.Add(time.Hour), Payload: o}, now) {
			t.Fatal("the book refused an offer")
		}
	}
	return book, ids
}

func machinesOf(offers []p2p.Offer) []string {
	var out []string
	for _, o := range offers {
		out = append(out, o.Machine)
	}
	slices.Sort(out)
	return out
}

func sorted(ids ...peer.ID) []string {
	var out []string
	for _, id := range ids {
		out = append(out, id.String())
	}
	slices.Sort(out)
	return out
}

// TestViewSubsets: the view holds the configured subset of the book, the
// machines that run the framework, sorted by machine.
func TestViewSubsets(t *testing.T) {
	now := time.Now()
	book, ids := fourMachines(t, now)
	for _, tc := range []struct {
		name      string
		p         Params
		framework string
		want      []string
	}{
		{"all", Params{Subset: SubsetAll}, "", sorted(ids...)},
		{"tensorflow", Params{Subset: SubsetAll}, "tensorflow", sorted(ids[0])},
		{"site", Params{Subset: SubsetSite, Site: "b"}, "", sorted(ids[2], ids[3])},
		{"list", Params{Subset: SubsetList, Machines: []string{ids[1].String(), ids[3].String()}}, "", sorted(ids[1], ids[3])},
		{"nearest", Params{Subset: SubsetNearest, Nearest: 2, Self: ids[3].String(),
			Peers: latencies{ids[0]: 40 * time.Millisecond, ids[1]: 5 * time.Millisecond}}, "", sorted(ids[1], ids[3])},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.p.Book = book
			v, offers := New(tc.p).View(now, tc.framework)
			if got := machinesOf(offers); !slices.Equal(got, tc.want) {
				t.Fatalf("view has %v, want %v", got, tc.want)
			}
			for i, m := range v.Machines {
				if m.ID != offers[i].Machine || (i > 0 && v.Machines[i-1].ID >= m.ID) {
					t.Fatalf("view machines %+v do not follow the offers %v in order", v.Machines, machinesOf(offers))
				}
			}
		})
	}
}

// TestViewLeavesOutUnreachableMachines: a machine marked unreachable is
// out of the view until it answers again or its time runs out, and its
// time doubles each time it fails again.
func TestViewLeavesOutUnreachableMachines(t *testing.T) {
	now := time.Now()
	book, ids := fourMachines(t, now)
	m := New(Params{Book: book, Subset: SubsetAll})
	m1 := ids[1].String()
	inView := func(at time.Time) bool { _, o := m.View(at, ""); return slices.Contains(machinesOf(o), m1) }
	m.MarkUnreachable(m1, now)
	if inView(now) || !inView(now.Add(unreachableFor+time.Second)) {
		t.Fatal("an unreachable machine is not left out for unreachableFor")
	}
	m.MarkUnreachable(m1, now)
	if inView(now.Add(unreachableFor + time.Second)) {
		t.Fatal("a machine that failed twice is not left out for longer")
	}
	m.Reachable(m1)
	if !inView(now) {
		t.Fatal("a machine that answered again is still left out")
	}
}

// TestRecordsPriceRisk: after Run has read the ledger, the view carries
// each machine's record of past jobs.
func TestRecordsPriceRisk(t *testing.T) {
	now := time.Now()
	book, ids := fourMachines(t, now)
	m := New(Params{Book: book, Subset: SubsetAll, Records: records{ids[2].String(): {Completed: 7, Failed: 2}}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, offers := m.View(now, "")
		i := slices.Index(machinesOf(offers), ids[2].String())
		if v.Machines[i].Completed == 7 && v.Machines[i].Failed == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the view's record of %s is %+v", ids[2], v.Machines[i])
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
