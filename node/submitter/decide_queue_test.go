package submitter

import (
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func core(n uint32) p2p.Resources { return p2p.Resources{Cores: n, MemBytes: uint64(n) << 30} }

func ids(ws []*waiter) string {
	var out []string
	for _, w := range ws {
		out = append(out, w.id)
	}
	return strings.Join(out, " ")
}

func TestDecideQueueOrder(t *testing.T) {
	starve := 30 * time.Minute
	w := func(id string, waited time.Duration, score float64) *waiter {
		return &waiter{id: id, since: t0.Add(-waited), score: score}
	}
	tests := []struct {
		name string
		ws   []*waiter
		want string
	}{
		{"benefit per cost first", []*waiter{w("a", time.Minute, 1), w("b", time.Minute, 3), w("c", time.Minute, 2)}, "b c a"},
		{"equal scores: the longest waiting", []*waiter{w("a", time.Minute, 1), w("b", 5*time.Minute, 1), w("c", 2*time.Minute, 1)}, "b c a"},
		{"equal scores and waits: by ID", []*waiter{w("b", time.Minute, 1), w("a", time.Minute, 1)}, "a b"},
		{"a starved job goes first, whatever its score", []*waiter{w("rich", time.Minute, 100), w("poor", 31*time.Minute, 0.1)}, "poor rich"},
		{"starved jobs by how long they waited", []*waiter{w("s1", 40*time.Minute, 0.1), w("s2", 50*time.Minute, 9), w("x", 0, 50)}, "s2 s1 x"},
		{"exactly starve counts as starved", []*waiter{w("a", time.Minute, 2), w("b", starve, 1)}, "b a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			queueOrder(tt.ws, t0, starve)
			if got := ids(tt.ws); got != tt.want {
				t.Errorf("order %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDecidePickBidders(t *testing.T) {
	starve := 30 * time.Minute
	one := shape{workers: 1, per: core(1)}
	two := shape{workers: 2, per: core(1)}
	w := func(id string, need shape, waited time.Duration) *waiter {
		return &waiter{id: id, since: t0.Add(-waited), need: need, next: t0.Add(time.Minute)}
	}
	rooms := func(cores ...uint32) []room {
		var out []room
		for _, c := range cores {
			out = append(out, room{free: core(c)})
		}
		return out
	}
	tests := []struct {
		name  string
		order []*waiter
		rooms []room
		fp    uint64
		slots int
		want  string
	}{
		{"as many as fit", []*waiter{w("a", one, 0), w("b", one, 0), w("c", one, 0)}, rooms(1, 1), 7, 16, "a b"},
		{"nothing free: nobody", []*waiter{w("a", one, 0)}, rooms(0, 0), 7, 16, ""},
		{"a smaller job fills in behind a big one", []*waiter{w("big", two, 0), w("small", one, 0)}, rooms(1), 7, 16, "small"},
		{"a starved job holds back those behind it", []*waiter{w("big", two, time.Hour), w("small", one, 0)}, rooms(1), 7, 16, ""},
		{"a due job bids though nothing shows room", []*waiter{{id: "due", since: t0, need: one, next: t0}}, rooms(0), 7, 16, "due"},
		{"one blind bid at a time", []*waiter{{id: "d1", since: t0, need: one, next: t0}, {id: "d2", since: t0, need: one, next: t0}},
			rooms(0), 7, 16, "d1"},
		{"none while one is out", []*waiter{{id: "x", since: t0, need: one, bidding: true, blind: true}, {id: "d", since: t0, need: one, next: t0}},
			rooms(0), 7, 16, ""},
		{"room is not blind", []*waiter{{id: "x", since: t0, need: one, bidding: true, blind: true}, {id: "r", since: t0, need: one, next: t0}},
			rooms(2), 7, 16, "r"},
		{"room it was refused on is no reason", []*waiter{{id: "a", since: t0, need: one, next: t0.Add(time.Minute), seen: 7}, w("b", one, 0)},
			rooms(1), 7, 16, "b"},
		{"new room is", []*waiter{{id: "a", since: t0, need: one, next: t0.Add(time.Minute), seen: 6}}, rooms(1), 7, 16, "a"},
		{"those bidding take their room and a slot first",
			[]*waiter{{id: "x", since: t0, need: one, bidding: true}, w("a", one, 0), w("b", one, 0)}, rooms(1, 1), 7, 16, "a"},
		{"at most slots", []*waiter{w("a", one, 0), w("b", one, 0), w("c", one, 0)}, rooms(4), 7, 2, "a b"},
		{"workers of one job spread over machines", []*waiter{w("a", two, 0)}, rooms(1, 1), 7, 16, "a"},
		{"TensorFlow jobs only where TensorFlow is",
			[]*waiter{w("tf", shape{workers: 1, per: core(1), tensorflow: true}, 0), w("g", one, 0)}, rooms(1), 7, 16, "g"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ids(pickBidders(tt.order, tt.rooms, tt.fp, t0, starve, tt.slots)); got != tt.want {
				t.Errorf("picked %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDecideFit(t *testing.T) {
	rooms := []room{{free: p2p.Resources{Cores: 3, MemBytes: 2 << 30}}, {free: core(2), tensorflow: true}}
	// Memory bounds the first machine to two workers of 1 core, 1 GiB.
	if !fit(rooms, shape{workers: 3, per: core(1)}) {
		t.Fatal("3 workers of 1 core, 1 GiB do not fit 2+2 workers' room")
	}
	if rooms[0].free.Cores != 1 || rooms[0].free.MemBytes != 0 || rooms[1].free.Cores != 1 {
		t.Fatalf("rooms left %+v", rooms)
	}
	before := append([]room(nil), rooms...)
	if fit(rooms, shape{workers: 2, per: core(1)}) {
		t.Fatal("2 more workers fit one worker's room")
	}
	if rooms[0] != before[0] || rooms[1] != before[1] {
		t.Fatalf("a job that did not fit took room: %+v", rooms)
	}
	if !fit(rooms, shape{workers: 1, per: core(1), tensorflow: true}) || rooms[1].free.Cores != 0 {
		t.Fatalf("the TensorFlow worker did not take the TensorFlow machine: %+v", rooms)
	}
	gpu := []room{{free: p2p.Resources{Cores: 8, MemBytes: 8 << 30, GPUs: 1}}}
	if fit(gpu, shape{workers: 2, per: p2p.Resources{Cores: 1, MemBytes: 1 << 30, GPUs: 1}}) {
		t.Fatal("two 1-GPU workers fit one GPU")
	}
}

func TestDecideRoomsFingerprint(t *testing.T) {
	a := p2p.Offer{Machine: "a", Lent: core(4), Allocated: core(1)}
	b := p2p.Offer{Machine: "b", Lent: core(2), Allocated: core(2)}
	rooms, fp := roomsOf([]p2p.Offer{a, b})
	if rooms[0].free != core(3) || rooms[1].free != core(0) {
		t.Fatalf("rooms %+v", rooms)
	}
	if _, fp2 := roomsOf([]p2p.Offer{b, a}); fp2 != fp {
		t.Error("the fingerprint depends on the offers' order")
	}
	b.Allocated = core(1)
	if _, fp3 := roomsOf([]p2p.Offer{a, b}); fp3 == fp {
		t.Error("a freed core leaves the fingerprint as it was")
	}
	over := p2p.Offer{Machine: "c", Lent: core(1), Allocated: core(2)}
	if r, _ := roomsOf([]p2p.Offer{over}); r[0].free != core(0) {
		t.Errorf("an offer allocating more than it lends shows room %+v", r[0].free)
	}
}

func TestDecideBackoff(t *testing.T) {
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 64 * time.Second,
		2 * time.Minute, 2 * time.Minute}
	for bids, d := range want {
		if got := backoff(bids); got != d {
			t.Errorf("backoff(%d) = %s, want %s", bids, got, d)
		}
	}
	if backoff(1000) != 2*time.Minute {
		t.Error("a long wait overflows the backoff")
	}
}

func TestDecideWaitLimit(t *testing.T) {
	since := t0.Add(-time.Hour)
	tests := []struct {
		name      string
		maxWait   time.Duration
		deadline  time.Time
		confirmed bool
		want      time.Time
		why       string
	}{
		{"its max wait", 24 * time.Hour, time.Time{}, true, since.Add(24 * time.Hour), "max_wait"},
		{"a deadline it can no longer meet comes first", 24 * time.Hour, t0.Add(2 * time.Hour), true, t0.Add(time.Hour), "deadline"},
		{"a late deadline does not", time.Hour, t0.Add(48 * time.Hour), true, since.Add(time.Hour), "max_wait"},
		{"unconfirmed: its time to be confirmed", 24 * time.Hour, time.Time{}, false, since.Add(defaultTiming.confirmWait), "not confirmed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why := waitLimit(since, since, tt.maxWait, tt.deadline, time.Hour, tt.confirmed, defaultTiming.confirmWait)
			if !got.Equal(tt.want) || !strings.Contains(why, tt.why) {
				t.Errorf("waitLimit = %s (%s), want %s (%s)", got, why, tt.want, tt.why)
			}
		})
	}
}

func TestDecideScoreAndPriceNow(t *testing.T) {
	ref := p2p.Prices{CoreHour: 100, MemGiBHour: 10}
	one := shape{workers: 1, per: core(1)}
	if a, b := score(1000, one, time.Hour, ref), score(1000, shape{workers: 2, per: core(1)}, time.Hour, ref); a != 2*b {
		t.Errorf("the same max price for twice the work: scores %v and %v", a, b)
	}
	if a, b := score(1000, one, time.Hour, ref), score(2000, one, time.Hour, ref); b != 2*a {
		t.Errorf("twice the max price for the same work: scores %v and %v", a, b)
	}
	if s := score(500, one, time.Hour, p2p.Prices{}); s != 500 {
		t.Errorf("no reference prices: score %v, want the max price", s)
	}
	q := func(resource string, total uint64, workers int) ReceivedQuote {
		rq := ReceivedQuote{}
		rq.Resource, rq.Total, rq.Reason = resource, total, "x"
		for range workers {
			rq.Workers = append(rq.Workers, p2p.QuotedWorker{})
		}
		return rq
	}
	qs := []ReceivedQuote{q("price", 900, 0), q("cores", 0, 0), q("price", 700, 0), q("", 100, 1), q("price", 400, 0)}
	if got := priceNow(qs, 500); got != 700 {
		t.Errorf("priceNow = %d, want the least refused price above the max price 500: 700", got)
	}
	if got := priceNow(qs[1:2], 500); got != 0 {
		t.Errorf("priceNow without price refusals = %d", got)
	}
}

// A TensorFlow job refused while the only machine's offer did not yet say
// it runs TensorFlow (its node still probing) bids again as soon as the
// offer says so, not at the end of its back-off.
func TestDecideRebidsWhenTensorFlowAppears(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	probing := p2p.Offer{Machine: "a", Lent: core(2)}
	rooms, fp := roomsOf([]p2p.Offer{probing})
	w := &waiter{id: "tf", since: now, need: shape{workers: 2, per: core(1), tensorflow: true}, next: now.Add(2 * time.Minute), seen: fp}
	if got := pickBidders([]*waiter{w}, rooms, fp, now, time.Hour, 4); len(got) != 0 {
		t.Fatalf("no TensorFlow shown: picked %v", got)
	}
	probed := probing
	probed.Software.TensorFlow = "2.20.0"
	rooms, fp = roomsOf([]p2p.Offer{probed})
	if got := pickBidders([]*waiter{w}, rooms, fp, now.Add(time.Second), time.Hour, 4); len(got) != 1 || got[0].blind {
		t.Errorf("TensorFlow shown: picked %v", got)
	}
}
