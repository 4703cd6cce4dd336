package market

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
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
		if !book.Apply(&p2p.Received{Signer: id, Seq: 1, Expiry: now.Add(time.Hour), Offer: o}, now) {
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

// TestQuoteRefusesMalformedRequests: a request out of range is refused
// as invalid, naming its field, before the scheduler sees it; a request
// in range is priced.
func TestQuoteRefusesMalformedRequests(t *testing.T) {
	now := time.Now()
	book, _ := fourMachines(t, now)
	m := New(Params{Book: book, Subset: SubsetAll})
	good := QuoteRequest{Workers: 2, PerWorker: scheduler.Resources{Cores: 1, MemBytes: 512 << 20}, DurationS: 3600}
	for _, tc := range []struct {
		field, message string
		edit           func(*QuoteRequest)
	}{
		{"workers", "workers 0: want 1 to 1024", func(r *QuoteRequest) { r.Workers = 0 }},
		{"workers", "workers 1025: want 1 to 1024", func(r *QuoteRequest) { r.Workers = p2p.MaxWorkers + 1 }},
		{"per_worker", "a worker must ask for some cores, memory or GPUs", func(r *QuoteRequest) { r.PerWorker = scheduler.Resources{} }},
		{"duration_s", "duration 0s: want 1 s to 720h0m0s", func(r *QuoteRequest) { r.DurationS = 0 }},
	} {
		req := good
		tc.edit(&req)
		_, err := m.Quote(now, req)
		var fe *fault.Error
		if !errors.As(err, &fe) || fe.Kind != fault.Invalid || fe.Field != tc.field || fe.Message != tc.message {
			t.Errorf("%+v: %#v, want invalid %s: %q", req, err, tc.field, tc.message)
		}
	}
	res, err := m.Quote(now, good)
	if err != nil || !res.OK || res.Machines != 4 || len(res.Workers) != 2 {
		t.Fatalf("a good request: %+v, %v", res, err)
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

// variedBook is a book of n machines with varied prices, loads, sizes and
// sites (a tenth with TensorFlow, some with an end to their offer), made
// from seed.
func variedBook(t *testing.T, n int, now time.Time, seed uint64) (*OfferBook, []peer.ID) {
	r := mrand.New(mrand.NewPCG(seed, 1))
	book := NewOfferBook(n, n)
	ids := make([]peer.ID, n)
	for i := range ids {
		ids[i] = newPeerID(t)
		cores := uint32(2 << r.IntN(5))
		o := &p2p.Offer{Machine: ids[i].String(), Owner: fmt.Sprintf("owner%d", i%7), Moniker: fmt.Sprintf("m%d", i),
			Site:  fmt.Sprintf("site%d", r.IntN(12)),
			Lent:  p2p.Resources{Cores: cores, MemBytes: uint64(cores) << 31},
			Price: p2p.Prices{CoreHour: uint64(50_000 + r.IntN(400_000)), MemGiBHour: uint64(5_000 + r.IntN(40_000))}}
		o.Allocated = p2p.Resources{Cores: uint32(r.IntN(int(cores))), MemBytes: uint64(r.IntN(int(cores))) << 30}
		if r.IntN(5) == 0 {
			o.Lent.GPUs, o.Price.GPUHour = uint32(1+r.IntN(4)), uint64(1_000_000+r.IntN(3_000_000))
		}
		if r.IntN(8) == 0 {
			o.Site = "" // a site of its own
		}
		if r.IntN(10) == 0 {
			o.Software.TensorFlow = "2.16"
		}
		if r.IntN(6) == 0 {
			o.AvailableUntil = now.Add(time.Duration(1+r.IntN(5)) * time.Hour).Unix()
		}
		if !book.Apply(&p2p.Received{Signer: ids[i], Seq: 1, Expiry: now.Add(10 * time.Hour), Offer: o}, now) {
			t.Fatal("the book refused an offer")
		}
	}
	return book, ids
}

// indexedJobs are job shapes that the varied book fits, fills, or cannot
// take.
var indexedJobs = []scheduler.Job{
	{ID: "one", Workers: 1, Per: scheduler.Resources{Cores: 1, MemBytes: 1 << 30}, Duration: time.Hour,
		Benefit: scheduler.Benefit{Kind: scheduler.FixedPrice, Max: 50_000_000}},
	{ID: "eight", Workers: 8, Per: scheduler.Resources{Cores: 4, MemBytes: 8 << 30}, Duration: 3 * time.Hour,
		Benefit: scheduler.Benefit{Kind: scheduler.FixedPrice, Max: 500_000_000}},
	{ID: "gpus", Workers: 3, Per: scheduler.Resources{Cores: 2, MemBytes: 4 << 30, GPUs: 1}, Duration: 2 * time.Hour,
		Benefit: scheduler.Benefit{Kind: scheduler.FixedPrice, Max: 500_000_000}},
	{ID: "long", Workers: 2, Per: scheduler.Resources{Cores: 1, MemBytes: 1 << 30}, Duration: 4 * time.Hour,
		Benefit: scheduler.Benefit{Kind: scheduler.FixedPrice, Max: 500_000_000}},
	{ID: "too big", Workers: 1, Per: scheduler.Resources{Cores: 1000}, Duration: time.Hour,
		Benefit: scheduler.Benefit{Kind: scheduler.FixedPrice, Max: 500_000_000}},
	{ID: "too cheap", Workers: 4, Per: scheduler.Resources{Cores: 1, MemBytes: 1 << 30}, Duration: time.Hour,
		Benefit: scheduler.Benefit{Kind: scheduler.FixedPrice, Max: 1}},
}

// sameAsView checks that x places every job as scheduler.Quote does over
// the view View gives at now, and that the view and offers Indexed served
// are that view's.
func sameAsView(t *testing.T, m *Market, x *scheduler.Index, v scheduler.View, offers []p2p.Offer, now time.Time, framework string) {
	t.Helper()
	wv, woffers := m.View(now, framework)
	if !reflect.DeepEqual(v, wv) || !reflect.DeepEqual(offers, woffers) || x.Len() != len(wv.Machines) {
		t.Fatalf("Indexed serves a view of %d machines (index %d), View has %d", len(v.Machines), x.Len(), len(wv.Machines))
	}
	for _, j := range indexedJobs {
		got, err := x.Quote(j, now)
		want, werr := scheduler.Quote(wv, j, now, scheduler.Params{})
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(err, werr) {
			t.Fatalf("job %q, framework %q: index %+v (%v), exhaustive %+v (%v)", j.ID, framework, got, err, want, werr)
		}
	}
}

// TestIndexedPlacesAsView: the index Indexed serves places each job
// where scheduler.Quote does over View, for every subset and framework
// and with machines left out as unreachable.
func TestIndexedPlacesAsView(t *testing.T) {
	now := time.Unix(1_750_000_000, 0)
	book, ids := variedBook(t, 300, now, 1)
	for _, p := range []Params{{Subset: SubsetAll}, {Subset: SubsetSite, Site: "site3"}} {
		for _, framework := range []string{"", "generic", "tensorflow"} {
			t.Run(p.Subset+"/"+framework, func(t *testing.T) {
				p.Book = book
				m := New(p)
				for _, id := range ids[:20] {
					m.MarkUnreachable(id.String(), now.Add(-time.Second))
				}
				x, v, offers := m.Indexed(now, framework)
				if len(v.Machines) == 0 {
					t.Fatal("an empty view")
				}
				sameAsView(t, m, x, v, offers, now, framework)
			})
		}
	}
}

// TestIndexedFollowsTheBook: a changed offer shows in the index once it
// is indexMaxAge old, and a machine marked unreachable (or reachable
// again) at once.
func TestIndexedFollowsTheBook(t *testing.T) {
	t0 := time.Unix(1_750_000_000, 0)
	book, ids := variedBook(t, 300, t0, 2)
	m := New(Params{Book: book, Subset: SubsetAll})
	job := indexedJobs[0]
	x0, v0, _ := m.Indexed(t0, "")
	pl, err := x0.Quote(job, t0)
	if err != nil {
		t.Fatal(err)
	}
	cheapest := v0.Machines[pl.Machines[0]].ID
	i := slices.IndexFunc(ids, func(id peer.ID) bool { return id.String() == cheapest })
	// The cheapest machine is taken in full.
	full := p2p.Offer{Machine: cheapest, Owner: "owner", Lent: p2p.Resources{Cores: 4, MemBytes: 4 << 30}}
	full.Allocated = full.Lent
	book.Apply(&p2p.Received{Signer: ids[i], Seq: 2, Expiry: t0.Add(10 * time.Hour), Offer: &full}, t0)

	t1 := t0.Add(indexMaxAge / 2)
	if x, _, _ := m.Indexed(t1, ""); x != x0 {
		t.Fatal("an index younger than indexMaxAge was rebuilt")
	}
	t2 := t0.Add(indexMaxAge)
	x2, v2, offers2 := m.Indexed(t2, "")
	if x2 == x0 {
		t.Fatal("an index indexMaxAge old is still served")
	}
	sameAsView(t, m, x2, v2, offers2, t2, "")
	pl2, err := x2.Quote(job, t2)
	if err != nil {
		t.Fatal(err)
	}
	second := v2.Machines[pl2.Machines[0]].ID
	if second == cheapest {
		t.Fatal("the job still goes to the machine that is now full")
	}

	m.MarkUnreachable(second, t2)
	x3, v3, offers3 := m.Indexed(t2, "")
	if x3 == x2 || slices.ContainsFunc(offers3, func(o p2p.Offer) bool { return o.Machine == second }) {
		t.Fatal("a machine marked unreachable is still in the index served")
	}
	sameAsView(t, m, x3, v3, offers3, t2, "")
	m.Reachable(second)
	if x4, _, offers4 := m.Indexed(t2, ""); x4 == x3 || len(offers4) != len(offers2) {
		t.Fatal("a machine reachable again is not back in the index served")
	}
}
