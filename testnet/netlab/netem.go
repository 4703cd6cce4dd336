package netlab

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

const (
	// queueLimit is the most packets one shaped egress holds. It must
	// exceed the packets in flight on the slowest, longest link (100
	// Mbit/s for 70 ms is about 600 full frames) plus a queue, or pacing
	// would drop most of a burst.
	queueLimit = 10000

	// orderRate paces a link that has jitter but no rate. netem keeps
	// packets in order only when it paces them: with a rate set, a packet
	// never leaves before the one queued ahead of it (sch_netem.c,
	// netem_enqueue); without one, jitter reorders every packet that
	// arrives within the jitter of the one before, and TCP takes the
	// reordering for loss.
	orderRate = 10_000_000_000
)

// netemArgs is the netem qdisc, after `tc qdisc replace dev DEV root`, that
// shapes one egress like h.
func netemArgs(h Link) []string {
	args := []string{"netem", "limit", strconv.Itoa(queueLimit)}
	if h.Delay > 0 || h.Jitter > 0 {
		args = append(args, "delay", micros(h.Delay))
		if h.Jitter > 0 {
			args = append(args, micros(h.Jitter), "distribution", "normal")
		}
	}
	if h.Loss > 0 {
		args = append(args, "loss", "random", strconv.FormatFloat(h.Loss, 'f', -1, 64)+"%")
	}
	rate := h.RateBits
	if rate == 0 && h.Jitter > 0 {
		rate = orderRate
	}
	if rate > 0 {
		args = append(args, "rate", strconv.FormatUint(rate, 10)+"bit")
	}
	return args
}

func micros(d time.Duration) string {
	return strconv.FormatInt(d.Microseconds(), 10) + "us"
}

// Seams for the test that checks the veth topology on a kernel without
// netem, in place of netemArgs and netemWorks.
var (
	qdiscArgs  = netemArgs
	probeQdisc = netemWorks
)

// netemShape replaces the root qdisc of dev in namespace ns.
func netemShape(ctx context.Context, t tools, ns, dev string, h Link) error {
	args := append([]string{"-n", ns, "qdisc", "replace", "dev", dev, "root"}, qdiscArgs(h)...)
	return run(ctx, t.tc, args...)
}

// netemWorks reports whether tc can put a netem qdisc in namespace ns: the
// kernel may lack sch_netem (CONFIG_NET_SCH_NETEM), as some cloud and CI
// kernels do.
func netemWorks(ctx context.Context, t tools, ns string) error {
	if t.tc == "" {
		return fmt.Errorf("iproute2's tc is not installed")
	}
	if err := run(ctx, t.tc, "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"); err != nil {
		return err
	}
	return run(ctx, t.tc, "-n", ns, "qdisc", "del", "dev", "lo", "root")
}
