package submitter

import (
	"slices"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

func statusOf(s p2p.WorkerState) *p2p.JobStatus { return &p2p.JobStatus{State: s} }

func TestDecideAnyRunning(t *testing.T) {
	tests := []struct {
		sts  []*p2p.JobStatus
		want bool
	}{
		{nil, false},
		{[]*p2p.JobStatus{nil, statusOf(p2p.WorkerFetching)}, false},
		{[]*p2p.JobStatus{statusOf(p2p.WorkerFetching), statusOf(p2p.WorkerRunning)}, true},
		{[]*p2p.JobStatus{statusOf(p2p.WorkerExited)}, false},
	}
	for i, tt := range tests {
		if got := anyRunning(tt.sts); got != tt.want {
			t.Errorf("%d: anyRunning = %v, want %v", i, got, tt.want)
		}
	}
}

func TestDecideQuotes(t *testing.T) {
	q := func(total uint64, workers int, reason string) ReceivedQuote {
		rq := ReceivedQuote{}
		rq.Total, rq.Reason = total, reason
		for range workers {
			rq.Workers = append(rq.Workers, p2p.QuotedWorker{})
		}
		return rq
	}
	tests := []struct {
		name    string
		qs      []ReceivedQuote
		best    int // index into qs; -1: none
		reasons []string
		why     string
	}{
		{name: "no quotes", best: -1, why: noScheduler},
		{name: "the cheapest placement", qs: []ReceivedQuote{q(300, 2, ""), q(0, 0, "busy"), q(200, 2, ""), q(250, 2, "")}, best: 2,
			reasons: []string{"busy"}},
		{name: "the first of equals", qs: []ReceivedQuote{q(200, 1, ""), q(200, 1, "")}, best: 0},
		{name: "only refusals", qs: []ReceivedQuote{q(0, 0, "no GPU"), q(0, 0, "busy"), q(0, 0, "no GPU")}, best: -1,
			reasons: []string{"no GPU", "busy", "no GPU"}, why: "no machine can take the job now: busy; no GPU"},
		{name: "at most five reasons", qs: []ReceivedQuote{q(0, 0, "a"), q(0, 0, "b"), q(0, 0, "c"), q(0, 0, "d"), q(0, 0, "e"), q(0, 0, "f")},
			best: -1, reasons: []string{"a", "b", "c", "d", "e"}, why: "no machine can take the job now: a; b; c; d; e"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			best, reasons := choose(tt.qs, nil)
			switch {
			case tt.best < 0 && best != nil:
				t.Errorf("chose %+v, want none", best)
			case tt.best >= 0 && best != &tt.qs[tt.best]:
				t.Errorf("chose %+v, want quote %d", best, tt.best)
			}
			if !slices.Equal(reasons, tt.reasons) {
				t.Errorf("reasons = %q, want %q", reasons, tt.reasons)
			}
			if hasPlacement(tt.qs) != (tt.best >= 0) {
				t.Errorf("hasPlacement = %v", hasPlacement(tt.qs))
			}
			if best == nil {
				if got := noPlacement(reasons); got != tt.why {
					t.Errorf("noPlacement = %q, want %q", got, tt.why)
				}
			}
		})
	}
}

func TestDecideEnoughQuotes(t *testing.T) {
	w := defaultTiming.quotes
	tests := []struct {
		waited, quiet time.Duration
		count         int
		placed, all   bool
		want          bool
	}{
		{time.Second, time.Second, 1, true, false, false},                // a placement, but wait the usual time
		{w.usual, 0, 1, true, false, true},                               // a placement after the usual wait
		{w.usual, 500 * time.Millisecond, 2, false, false, false},        // refusals still coming
		{w.usual, time.Second, 2, false, false, true},                    // refusals, then a quiet second
		{w.usual + time.Second, 5 * time.Second, 0, false, false, false}, // nothing yet
		{w.max, w.max, 0, false, false, true},                            // the limit
		{100 * time.Millisecond, 0, 2, true, true, true},                 // every known scheduler answered, one placed
		{100 * time.Millisecond, 0, 2, false, true, true},                // every known scheduler refused
		{100 * time.Millisecond, 0, 0, false, true, false},               // none known, none answered
	}
	for i, tt := range tests {
		if got := enoughQuotes(w, tt.waited, tt.quiet, tt.count, tt.placed, tt.all); got != tt.want {
			t.Errorf("%d: enoughQuotes(%s, %s, %d, %v, %v) = %v, want %v", i, tt.waited, tt.quiet, tt.count, tt.placed, tt.all, got, tt.want)
		}
	}
}

// TestDecideUntilEnough checks that waking after untilEnough misses no
// change of enoughQuotes' answer: none comes sooner, with no new quote.
func TestDecideUntilEnough(t *testing.T) {
	w := defaultTiming.quotes
	step := 50 * time.Millisecond
	for waited := time.Duration(0); waited < w.max; waited += step {
		for quiet := time.Duration(0); quiet <= waited; quiet += step {
			for _, count := range []int{0, 1} {
				for _, placed := range []bool{false, true} {
					if placed && count == 0 || enoughQuotes(w, waited, quiet, count, placed, false) {
						continue
					}
					d := untilEnough(w, waited, quiet)
					if d <= 0 {
						t.Fatalf("untilEnough(%s, %s) = %s, want > 0", waited, quiet, d)
					}
					for later := time.Duration(0); later < d; later += step / 5 {
						if enoughQuotes(w, waited+later, quiet+later, count, placed, false) {
							t.Fatalf("enoughQuotes turns true %s after (%s, %s, %d, %v), before untilEnough's %s",
								later, waited, quiet, count, placed, d)
						}
					}
				}
			}
		}
	}
}

// TestChooseCountsColdStarts: for a job in an image, a quote on a machine
// that must fetch it first costs its price for that setup too, as the
// schedulers counted it: a quote on the warm machine a little dearer
// wins, one much dearer does not; without an image the cheapest wins.
func TestChooseCountsColdStarts(t *testing.T) {
	quote := func(machine string, perHour uint64) ReceivedQuote {
		rq := ReceivedQuote{}
		rq.Total, rq.Workers = perHour/30, []p2p.QuotedWorker{{Machine: machine, PerHour: perHour}} // a two-minute job
		return rq
	}
	offers := []p2p.Offer{{Machine: "warm", Images: []string{"bafyimg"}}, {Machine: "cold"}}
	bid := p2p.Bid{Image: "bafyimg", ImageBytes: 20 << 20} // a setup of 2 s
	cold := coldStarts(offers, bid)
	if cold("warm") != 0 || cold("cold") != 2*time.Second || coldStarts(offers, p2p.Bid{}) != nil {
		t.Fatalf("setups: warm %s, cold %s", cold("warm"), cold("cold"))
	}
	for _, tc := range []struct {
		dearer   float64 // the warm machine's price over the cold one's
		warmWins bool
	}{{1.005, true}, {1.05, false}} {
		qs := []ReceivedQuote{quote("cold", 10_000_000), quote("warm", uint64(10_000_000*tc.dearer))}
		best, _ := choose(qs, cold)
		if (best == &qs[1]) != tc.warmWins {
			t.Errorf("warm %.1f%% dearer: chose %s", 100*(tc.dearer-1), best.Workers[0].Machine)
		}
		if best, _ := choose(qs, nil); best != &qs[0] {
			t.Errorf("without an image: chose %s, want the cheaper", best.Workers[0].Machine)
		}
	}
}

// TestDecidePlacedAfter: once a placement is in, the usual wait is
// thrice its delay, at least least, at most usual.
func TestDecidePlacedAfter(t *testing.T) {
	w := defaultTiming.quotes
	for _, c := range []struct{ first, want time.Duration }{
		{20 * time.Millisecond, w.least},                 // a LAN: the least wait
		{200 * time.Millisecond, 600 * time.Millisecond}, // thrice the first's delay
		{time.Second, w.usual},                           // a slow network: the usual wait at most
	} {
		if got := w.placedAfter(c.first).usual; got != c.want {
			t.Errorf("first placement after %s: wait %s, want %s", c.first, got, c.want)
		}
	}
	if p := w.placedAfter(time.Millisecond); p.max != w.max || p.quiet != w.quiet {
		t.Errorf("placedAfter changed more than the usual wait: %+v", p)
	}
}
