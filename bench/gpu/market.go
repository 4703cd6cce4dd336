package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/deepmarket/deepmarket/bench/internal/testbed"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/testnet"
)

// basePort is the testnet's first port (3 nodes: 12 ports from it).
const basePort = 26700

// market runs the same command as a 1-GPU job through the market: a
// testnet on loopback of one validator, a lender (node0) lending the GPU,
// -cores cores and the job's memory, and a node that submits (node1); the
// job's output is fetched from storage and its result.json read. The
// nodes' logs are kept in the bench's logs.
func (b *bench) market(ctx context.Context) Run {
	cmd := trainCommand(b.cfg, b.cfg.Steps)
	r := Run{Name: "market", Steps: b.cfg.Steps, Command: cmd,
		How: fmt.Sprintf("through the market: a 1-GPU job (gpus = 1, cores = %d, memory = %d GiB, framework %s) "+
			"on a loopback testnet, launched in the lender's sandbox", b.cfg.Cores, b.cfg.JobMemGiB, b.jobFramework())}
	log.Printf("== market: a testnet on loopback, a lender lending the GPU, a 1-GPU job of %d steps", b.cfg.Steps)
	b.withMarket(ctx, &r, "", func(sub *api.Client, lender string) { b.runJob(ctx, sub, lender, &r) })
	return r
}

// withMarket starts a testnet on loopback of one validator, a lender
// (node0) lending the GPU, -cores cores and the job's memory, and a node
// that submits (node1), and calls run with the submitter's client and the
// lender's peer ID; a failure to get there is r's error. The nodes' logs
// are kept in the bench's logs, their names tagged with tag.
func (b *bench) withMarket(ctx context.Context, r *Run, tag string, run func(sub *api.Client, lender string)) {
	dir, err := os.MkdirTemp("", "dm-bench-gpu-market-")
	if err != nil {
		r.Error = err.Error()
		return
	}
	defer os.RemoveAll(dir)
	tn := filepath.Join(dir, "tn")
	port := basePort
	if tag != "" {
		port += 20 // the first testnet's ports may linger
	}
	m, err := testnet.Init(testnet.Params{Validators: 1, Nodes: 2, Out: tn, Python: b.python, BasePort: port})
	if err != nil {
		r.Error = "testnet init: " + err.Error()
		return
	}
	net, err := testnet.Start(ctx, tn, testnet.RunOptions{Binary: b.bin, StartTimeout: 90 * time.Second})
	if err != nil {
		r.Error = "testnet start: " + err.Error()
		return
	}
	defer func() {
		net.Close()
		b.keepNodeLogs(net, tag)
	}()
	const lender, submitter = 1, 2
	if err := b.lend(ctx, net, lender, submitter); err != nil {
		r.Error = err.Error()
		return
	}
	sub, err := net.Client(submitter)
	if err != nil {
		r.Error = err.Error()
		return
	}
	run(sub, m.Nodes[lender].PeerID)
}

// jobFramework is the market job's framework: a PyTorch job is generic,
// run by the lender's own Python (framework torch wants an image).
func (b *bench) jobFramework() string {
	if b.cfg.Framework == "torch" {
		return "generic"
	}
	return "tensorflow"
}

// lend has node i lend the GPU, the cores and the job's memory (and 4 GiB
// more), then waits until it offers them with the job's framework and the
// submitter holds its offer.
func (b *bench) lend(ctx context.Context, net *testnet.Network, i, submitter int) error {
	lc, err := net.Client(i)
	if err != nil {
		return err
	}
	req := api.LendRequest{Cores: b.cfg.Cores, MemBytes: uint64(b.cfg.JobMemGiB+4) << 30, GPUs: 1}
	if _, err := lc.SetLend(ctx, req); err != nil {
		return fmt.Errorf("lend the GPU, %d cores and %d GiB: %w", req.Cores, req.MemBytes>>30, err)
	}
	sc, err := net.Client(submitter)
	if err != nil {
		return err
	}
	peer := net.Manifest.Nodes[i].PeerID
	deadline := time.Now().Add(2 * time.Minute)
	var st api.LendState
	for {
		st, err = lc.Lend(ctx)
		switch {
		case err != nil:
		case st.Unable != "":
			return fmt.Errorf("the lender cannot run jobs: %s", st.Unable)
		case st.Offering && slices.Contains(st.Frameworks, b.jobFramework()):
			offers, _ := sc.Offers(ctx)
			for _, o := range offers {
				if o.Machine == peer && o.GPUs >= 1 {
					log.Printf("   the submitter holds the lender's offer: %d cores, %d GPU (%v), frameworks %v",
						o.Cores, o.GPUs, o.GPUModels, st.Frameworks)
					return nil
				}
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			why := fmt.Sprintf("offering %v, frameworks %v, warnings %v", st.Offering, st.Frameworks, st.Warnings)
			if err != nil {
				why = err.Error()
			}
			return fmt.Errorf("the submitter holds no GPU offer of the lender after %s (lender: %s)",
				time.Since(deadline.Add(-2*time.Minute)).Round(time.Second), why)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// runJob submits the 1-GPU job, waits for it to end (cancelling it when
// ctx ends first), keeps its log and reads its result.
func (b *bench) runJob(ctx context.Context, sub *api.Client, lender string, r *Run) {
	spec := jobs.File{Name: "bench-gpu", Framework: b.jobFramework(), Command: r.Command, Bundle: b.bundle, Dataset: b.cfg.Data,
		Workers: 1, Cores: b.cfg.Cores, GPUs: 1, Memory: fmt.Sprintf("%dGiB", b.cfg.JobMemGiB),
		MaxPrice: "20", MaxDuration: "15m", MaxWait: "2m"}
	watch := watchGPU(ctx)
	j, err := sub.Submit(ctx, api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		watch()
		r.Error = "submit: " + err.Error()
		return
	}
	log.Printf("   submitted job %s", firstN(j.ID, 12))
	last := j.State
	for !j.State.Terminal() && ctx.Err() == nil {
		time.Sleep(time.Second)
		if cur, err := sub.Job(ctx, j.ID); err == nil {
			j = cur
		}
		if j.State != last {
			log.Printf("   job %s", j.State)
			last = j.State
		}
	}
	r.GPUMemMiB, r.GPUUtil = watch()
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	if !j.State.Terminal() {
		if cur, err := sub.CancelJob(bg, j.ID); err == nil && cur != nil {
			j = cur
		}
	}
	r.State = string(j.State)
	r.WallS = j.Updated.Sub(j.Created).Seconds()
	if run := j.Current(); run != nil {
		if !run.Started.IsZero() && !run.Ended.IsZero() {
			r.RunS = run.Ended.Sub(run.Started).Seconds()
		}
		if len(run.Workers) > 0 && run.Workers[0].Machine != lender {
			log.Printf("   (the worker ran on %s, not the lender)", run.Workers[0].Machine)
		}
	}
	text := testbed.JobLog(bg, sub, j.ID)
	r.Log = filepath.Join(b.logs, "market-job.log")
	if err := os.WriteFile(r.Log, []byte(text), 0o644); err != nil {
		r.Log = ""
	}
	switch {
	case j.State != jobs.Succeeded:
		why := j.Reason
		if ctx.Err() != nil {
			why = fmt.Sprintf("not done by the time limit (%v), cancelled in state %s", ctx.Err(), last)
		}
		r.Error = fmt.Sprintf("the job %s: %s; the end of its log (%s):\n%s", j.State, why, r.Log, lastLines(text, 10))
	case j.ResultCID == "":
		r.Error = "the job succeeded with no output"
	default:
		if err := b.fetchResult(bg, sub, j.ResultCID, r); err != nil {
			r.Error = "result: " + err.Error()
		}
	}
}

// fetchResult fetches the job's output (worker 0's output dir) and reads
// its result.json into r.
func (b *bench) fetchResult(ctx context.Context, sub *api.Client, cid string, r *Run) error {
	dir, err := os.MkdirTemp("", "dm-bench-gpu-result-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "result")
	if _, err := sub.DataGet(ctx, cid, out, nil); err != nil {
		return err
	}
	return b.readResultFile(out, r)
}

// keepNodeLogs copies the nodes' logs into the bench's logs
// (market[-tag]-NODE.log).
func (b *bench) keepNodeLogs(net *testnet.Network, tag string) {
	prefix := "market-"
	if tag != "" {
		prefix += tag + "-"
	}
	for i, n := range net.Manifest.Nodes {
		raw, err := os.ReadFile(filepath.Join(net.Home(i).Dir, testnet.LogFile))
		if err == nil {
			_ = os.WriteFile(filepath.Join(b.logs, prefix+n.Name+".log"), raw, 0o644)
		}
	}
}
