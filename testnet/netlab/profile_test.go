package netlab

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestProfileByName(t *testing.T) {
	for _, name := range []string{"lan", "wifi", "multi-dc"} {
		p, err := ProfileByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if p.Name != name || p.Doc == "" {
			t.Errorf("ProfileByName(%q) = %q with doc %q", name, p.Name, p.Doc)
		}
		if err := p.validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	_, err := ProfileByName("dialup")
	if err == nil || !strings.Contains(err.Error(), "lan, wifi, multi-dc") {
		t.Errorf("unknown profile: error %v, want it to list the profiles", err)
	}
}

func TestProfilesAreCopies(t *testing.T) {
	p, _ := ProfileByName("multi-dc")
	p.WAN[0].Delay = time.Hour
	q, _ := ProfileByName("multi-dc")
	if q.WAN[0].Delay == time.Hour {
		t.Error("changing a returned profile changed the built-in one")
	}
}

// TestMultiDCFitsAWS checks the star model's round trips against the AWS
// inter-region averages they were fitted to (docs/network-profiles.md).
func TestMultiDCFitsAWS(t *testing.T) {
	p, _ := ProfileByName("multi-dc")
	// us-east-1, eu-west-1, sa-east-1, ap-northeast-1.
	aws := map[[2]int]float64{
		{0, 1}: 80.5, {0, 2}: 119.5, {0, 3}: 145.3,
		{1, 2}: 191.3, {1, 3}: 212.4, {2, 3}: 256.8,
	}
	for pair, ms := range aws {
		got := float64(p.RTT(pair[0], pair[1])) / float64(time.Millisecond)
		if math.Abs(got-ms)/ms > 0.02 {
			t.Errorf("sites %v: RTT %.1f ms, AWS %.1f ms", pair, got, ms)
		}
		if p.RTT(pair[0], pair[1]) != p.RTT(pair[1], pair[0]) {
			t.Errorf("sites %v: RTT not symmetric", pair)
		}
	}
	if p.RTT(4, 1) != p.RTT(0, 1) {
		t.Error("site 4 doesn't reuse site 0's uplink")
	}
}

func TestIntraHopsAddUp(t *testing.T) {
	for _, name := range []string{"lan", "wifi", "multi-dc"} {
		p, _ := ProfileByName(name)
		h := intraHop(p.Intra)
		if 2*h.Delay != p.Intra.Delay {
			t.Errorf("%s: two hops of %v, want %v", name, h.Delay, p.Intra.Delay)
		}
		if j := math.Sqrt(2) * float64(h.Jitter); math.Abs(j-float64(p.Intra.Jitter)) > 1000 {
			t.Errorf("%s: two hops' jitter %v, want %v", name, time.Duration(j), p.Intra.Jitter)
		}
		if loss := 100 * (1 - (1-h.Loss/100)*(1-h.Loss/100)); math.Abs(loss-p.Intra.Loss) > 1e-9 {
			t.Errorf("%s: two hops lose %g%%, want %g%%", name, loss, p.Intra.Loss)
		}
		if h.RateBits != p.Intra.RateBits {
			t.Errorf("%s: hop rate %d, want %d", name, h.RateBits, p.Intra.RateBits)
		}
	}
}

func TestNetemArgs(t *testing.T) {
	for _, c := range []struct {
		h    Link
		want string
	}{
		{Link{}, "netem limit 10000"},
		{Link{Delay: 50 * time.Microsecond, RateBits: 1e9}, "netem limit 10000 delay 50us rate 1000000000bit"},
		{Link{Delay: 1500 * time.Microsecond, Jitter: time.Millisecond, RateBits: 60e6, Loss: 0.1},
			"netem limit 10000 delay 1500us 1000us distribution normal loss random 0.1% rate 60000000bit"},
		// Jitter without a rate gets one, or netem would reorder.
		{Link{Delay: time.Millisecond, Jitter: time.Millisecond},
			"netem limit 10000 delay 1000us 1000us distribution normal rate 10000000000bit"},
		{Link{Loss: 0.005}, "netem limit 10000 loss random 0.005%"},
	} {
		if got := strings.Join(netemArgs(c.h), " "); got != c.want {
			t.Errorf("netemArgs(%+v) = %q, want %q", c.h, got, c.want)
		}
	}
}

// TestDepartureKeepsOrder: whatever the jitter, frames leave in the order
// they came, and a rate spaces them by their sending time at least.
func TestDepartureKeepsOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, h := range []Link{
		{Delay: 3 * time.Millisecond, Jitter: 3 * time.Millisecond},
		{Delay: time.Millisecond, Jitter: 2 * time.Millisecond, RateBits: 10e6},
		{RateBits: 1e6},
	} {
		now := time.Unix(0, 0)
		var last time.Time
		for i := range 10000 {
			now = now.Add(time.Duration(rng.IntN(200)) * time.Microsecond)
			size := 64 + rng.IntN(1450)
			at := departure(h, now, last, size, rng.NormFloat64())
			if at.Before(last) {
				t.Fatalf("%+v: frame %d leaves at %v, before the frame ahead at %v", h, i, at, last)
			}
			if h.RateBits > 0 {
				tx := time.Duration(uint64(size) * 8 * uint64(time.Second) / h.RateBits)
				if at.Sub(last) < tx && i > 0 {
					t.Fatalf("%+v: frame %d leaves %v after the one ahead, under its sending time %v", h, i, at.Sub(last), tx)
				}
			}
			if h.Jitter == 0 && at.Before(now.Add(h.Delay)) {
				t.Fatalf("%+v: frame %d leaves before its delay", h, i)
			}
			last = at
		}
	}
}

func TestLinkValidate(t *testing.T) {
	for _, l := range []Link{
		{Delay: -1}, {Jitter: -1}, {Loss: 100}, {Loss: -0.1}, {Loss: math.NaN()},
		{RateBits: 10}, {Delay: 2 * time.Minute},
	} {
		if l.validate() == nil {
			t.Errorf("%+v validated", l)
		}
	}
	for _, l := range []Link{{}, {Loss: 99.9, RateBits: 8000, Delay: time.Minute}} {
		if err := l.validate(); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
	}
}
