// Package testbed is what the benchmarks that train through the real
// market share (bench/testnet, bench/training): a testnet on this machine
// under a network profile, with lenders one per site lending a core each
// and a node that submits; and waiting for the lenders to go idle between
// jobs. Needs root (network namespaces, the sandbox).
package testbed

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/testnet"
)

// Config is the testnet to start.
type Config struct {
	Bin     string // the deepmarket binary the nodes run (absolute)
	Python  string // the interpreter lenders run jobs with
	Profile string // network profile: lan, wifi, multi-dc
	// Sites is the number of sites, one validator each. Lenders nodes
	// lend Cores and MemBytes each, node k on site k % Sites; one more
	// node (on site Lenders % Sites) submits.
	Sites, Lenders int
	Cores          int
	MemBytes       uint64
	BasePort       int
	// Machine, when set, confines every node but the validators to a
	// machine of that size (testnet.RunOptions.Machine).
	Machine *testnet.Machine
}

// Bed is a started testnet.
type Bed struct {
	Net     *testnet.Network
	Lenders []int       // node indices of the lenders
	Sub     *api.Client // the submitting node's API
	Shaper  string      // what shapes the links
	dir     string
}

// Start initializes and starts the testnet, has the lenders lend and
// waits until the submitter holds their offers. Close it when done.
func Start(ctx context.Context, c Config) (*Bed, error) {
	dir, err := os.MkdirTemp("", "dm-report-")
	if err != nil {
		return nil, err
	}
	b := &Bed{dir: dir}
	if err := b.start(ctx, c); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Bed) start(ctx context.Context, c Config) error {
	tn := filepath.Join(b.dir, "tn")
	// val0..: one per site; then the lenders, then the submitter.
	m, err := testnet.Init(testnet.Params{Validators: c.Sites, Nodes: c.Lenders + 1, Sites: c.Sites, Out: tn,
		Python: c.Python, BasePort: c.BasePort})
	if err != nil {
		return err
	}
	log.Printf("== %s: starting %d nodes", c.Profile, len(m.Nodes))
	net, err := testnet.Start(ctx, tn, testnet.RunOptions{Binary: c.Bin, Profile: c.Profile, StartTimeout: 2 * time.Minute,
		Machine: c.Machine})
	if err != nil {
		return err
	}
	b.Net = net
	if net.Lab != nil {
		b.Shaper = net.Lab.Shaper().String()
	}
	for k := range c.Lenders {
		b.Lenders = append(b.Lenders, c.Sites+k)
	}
	for _, i := range b.Lenders {
		cl, err := net.Client(i)
		if err != nil {
			return err
		}
		if _, err := cl.SetLend(ctx, api.LendRequest{Cores: c.Cores, MemBytes: c.MemBytes}); err != nil {
			return fmt.Errorf("lend on %s: %w", m.Nodes[i].Name, err)
		}
	}
	if b.Sub, err = net.Client(c.Sites + c.Lenders); err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		offers, _ := b.Sub.Offers(ctx)
		if len(offers) >= len(b.Lenders) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the submitter holds %d offers, want %d", len(offers), len(b.Lenders))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Close stops the testnet and removes its files.
func (b *Bed) Close() {
	if b.Net != nil {
		b.Net.Close()
	}
	os.RemoveAll(b.dir)
}

// WaitIdle waits (3 minutes at most) until no lender runs a worker of an
// earlier job.
func (b *Bed) WaitIdle(ctx context.Context) {
	start := time.Now()
	for _, i := range b.Lenders {
		c, err := b.Net.Client(i)
		if err != nil {
			continue
		}
		for time.Since(start) < 3*time.Minute && ctx.Err() == nil {
			text, err := c.Metrics(ctx)
			if err == nil && strings.Contains(text, "\ndeepmarket_exec_workers 0\n") {
				break
			}
			time.Sleep(time.Second)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		log.Printf("   (waited %s for the lenders to finish the last job)", d.Round(time.Second))
	}
}

// Sites names the sites of a run's workers' machines, in worker order.
func (b *Bed) Sites(run *jobs.Run) []string {
	var out []string
	for _, w := range run.Workers {
		for _, n := range b.Net.Manifest.Nodes {
			if n.PeerID == w.Machine {
				out = append(out, n.Site)
			}
		}
	}
	return out
}

// NoMachines reports whether a job failed because its bid found no
// machines (the schedulers raced, or a lender had not yet let go of the
// last job): not a measurement, so the caller bids again.
func NoMachines(reason string) bool { return strings.Contains(reason, "no machine can take") }

// JobLog is a job's whole log: the submitter's lines and every worker's
// output, each line tagged with its worker.
func JobLog(ctx context.Context, sub *api.Client, id string) string {
	var b strings.Builder
	var off int64
	for {
		lg, err := sub.JobLogs(ctx, id, off)
		if err != nil || lg.Data == "" {
			return b.String()
		}
		b.WriteString(lg.Data)
		off = lg.Next
	}
}
