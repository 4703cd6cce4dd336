package lender

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	ctypes "github.com/cometbft/cometbft/rpc/core/types"
	"github.com/ipfs/go-cid"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/storage"
)

// Appeals and referees, the machine's side.
//
// A held worker here keeps, for each round the payer's holder refuses, the
// arrays it was judged on (DM_EVIDENCE_DIR; the deepmarket package's
// evidence.py). When the worker ends, the node adds that directory to
// storage. After the payer settles, in the dispute window, the claim
// service appeals the refusal when the payer's last signed answer names
// what it refused (ledger.Refusal) and this node's own recomputation of
// the check, the referees' code on the referees' inputs, says the refusal
// was wrong: it packs the answer and the evidence (one content address),
// and claims what the settlement withheld for its refused rounds
// (ledger.AppealCap). A refusal it finds right it does not appeal: the
// bond would be lost.
//
// A validator drawn as a referee (ledger /cases) fetches the package,
// checks the answer's signature against the escrow's payer key, fetches
// the validation batch the answer's terms name, runs the same program in
// a sandbox (no network, its own uid, one core, bounded memory) and votes
// what it says. A case it cannot judge (no model description, a spot
// check's forfeit, a batch it cannot fetch) gets no vote from it: the case
// lapses, the bond comes back, and what the settlement withheld is burned.

// Appeals is the ledger as appeals and referees use it (the ledger client).
type Appeals interface {
	Escrow(ctx context.Context, job string) (*ledger.Escrow, error)
	Appeal(ctx context.Context, job string, claim uint64, evidence, reason string) (*ctypes.ResultTx, error)
	Verdict(ctx context.Context, job, appellant string, overturn bool) (*ctypes.ResultTx, error)
	Cases(ctx context.Context, referee identity.Address) ([]ledger.Docket, error)
}

const (
	// evidenceDir is where a held worker keeps its refused rounds, in its dir.
	evidenceDir = "evidence"
	// evidenceKey prefixes the store's evidence of each worker,
	// "evidence/<run>/<index>" -> CID: what an appeal packs.
	evidenceKey = "evidence/"
	// appealedKey marks a run whose refusal this machine judged for an
	// appeal, "appealed/<run>" -> the outcome: it is not judged again.
	appealedKey = "appealed/"
	// maxEvidenceBytes bounds what a worker's evidence, an appeal's
	// package or a validation batch may weigh on this machine.
	maxEvidenceBytes = 2 << 30
	// refereeTimeout bounds one recomputation.
	refereeTimeout = 5 * time.Minute
	// refereeEvery is how often a validator reads its docket.
	refereeEvery = 5 * time.Second
)

// verdict is what a recomputation found.
type verdict struct {
	Overturn bool    `json:"overturn"`
	Abstain  bool    `json:"abstain"`
	Why      string  `json:"why"`
	Seconds  float64 `json:"seconds"` // the program's evaluations of the batch
}

// keepEvidence adds the evidence a held worker kept (its refused rounds)
// to storage once its sandbox is gone, measured first as an output is;
// a worker that kept none adds nothing.
func (e *Executor) keepEvidence(ctx context.Context, w *worker) {
	log := e.log.With("module", "executor", "job", w.l.JobID[:12], "worker", w.l.Index)
	dir, err := e.root.OpenRoot(w.name)
	if err != nil {
		return
	}
	defer dir.Close()
	if _, err := dir.Lstat(evidenceDir); err != nil {
		return
	}
	lim := outputLimits{bytes: maxEvidenceBytes, holes: maxOutputHoles, entries: 64, depth: 3}
	if _, err := measureOutput(dir, evidenceDir, lim); err != nil {
		log.Warn("the worker's evidence of refused rounds is not kept", "err", err)
		return
	}
	pin, err := e.blocks.AddFrom(context.WithoutCancel(ctx), dir, evidenceDir, nil)
	if err == nil {
		err = e.store.Put(evidenceKey+w.l.JobID+"/"+strconv.Itoa(w.l.Index), pin.CID.String())
	}
	if err != nil {
		log.Warn("cannot keep the worker's evidence of refused rounds", "err", err)
		return
	}
	log.Info("kept the evidence of the worker's refused rounds, for an appeal", "cid", pin.CID.String())
}

// errAppealPending says an appeal's recomputation is under way: the
// claim service keeps the run watched until it ends.
var errAppealPending = errors.New("the appeal's recomputation is under way")

// appealRefusal is the claim service's step for a settled escrow of run:
// it appeals the refusals of this machine's rounds once, when the
// payer's answer names one and this node's recomputation overturns it.
// The recomputation runs beside the claim service (it fetches and starts
// a program: minutes at worst), which meanwhile serves the other runs.
func (e *Executor) appealRefusal(ctx context.Context, run string, esc *ledger.Escrow) error {
	if e.appeals == nil || esc.Settled == 0 || ledger.AppealCap(esc, string(e.account)) == 0 {
		return nil
	}
	for _, k := range esc.Cases {
		if k.Appellant == string(e.account) {
			return nil
		}
	}
	var done string
	if found, err := e.store.Get(appealedKey+run, &done); err != nil || found {
		return err
	}
	a, ok := e.claims.Answer(run)
	if !ok || a.Refused == 0 || a.Refusal == nil {
		return nil
	}
	e.mu.Lock()
	if e.appealing == nil {
		e.appealing = map[string]bool{}
	}
	busy := e.appealing[run]
	e.appealing[run] = true
	e.mu.Unlock()
	if busy {
		return errAppealPending
	}
	settled := *esc
	started := e.spawn(func(ctx context.Context) {
		err := e.appealNow(ctx, run, &settled, a)
		e.mu.Lock()
		delete(e.appealing, run)
		e.mu.Unlock()
		if err != nil {
			e.log.Warn("appeal: trying again at the claim's next step", "module", "claims", "job", run[:12], "err", err)
		}
	})
	if !started {
		e.mu.Lock()
		delete(e.appealing, run)
		e.mu.Unlock()
		return nil
	}
	return errAppealPending
}

// appealNow packs the evidence of run's refusal, recomputes it and
// appeals when it does not stand; the outcome is stored, so it is done once.
func (e *Executor) appealNow(ctx context.Context, run string, esc *ledger.Escrow, a ledger.Answer) error {
	log := e.log.With("module", "claims", "job", run[:12])
	pkg, err := e.packEvidence(ctx, run, a)
	if err != nil {
		return fmt.Errorf("pack the evidence for an appeal: %w", err)
	}
	claim := min(ledger.AppealCap(esc, string(e.account)), esc.Amount)
	d := ledger.Docket{Job: run, Payer: esc.Payer, PayerKey: esc.PayerKey, Appellant: string(e.account),
		Claim: claim, Evidence: pkg, Cap: ledger.AppealCap(esc, string(e.account))}
	v, err := e.recompute(ctx, d)
	if err != nil {
		return fmt.Errorf("recompute the refusal: %w", err)
	}
	if !v.Overturn {
		log.Info("the payer refused rounds of this machine; recomputed, the refusal stands: no appeal", "why", v.Why)
		return e.store.Put(appealedKey+run, "not appealed: "+v.Why)
	}
	reason := "round " + strconv.FormatUint(a.Refusal.Round, 10) + " recomputed: " + v.Why
	if _, err := e.appeals.Appeal(ctx, run, claim, pkg, clipReason(reason)); err != nil && ledger.CodeOf(err) != ledger.CodeAlreadyVoted {
		if !appealFinal(err) {
			return fmt.Errorf("appeal: %w", err)
		}
		log.Warn("the ledger refused the appeal for good", "err", err)
		return e.store.Put(appealedKey+run, "refused: "+err.Error())
	}
	log.Warn("the payer refused rounds this machine's recomputation accepts: appealed to referees",
		"claim", claim, "evidence", pkg, "why", v.Why)
	return e.store.Put(appealedKey+run, "appealed")
}

// appealFinal says whether the ledger refused an appeal for good.
func appealFinal(err error) bool {
	switch ledger.CodeOf(err) {
	case ledger.CodeExpired, ledger.CodeNotRegistered, ledger.CodeNoReferees, ledger.CodeNotSettled, ledger.CodeInvalidAmount:
		return true
	}
	return final(err)
}

func clipReason(s string) string {
	if len(s) <= ledger.MaxReasonLen {
		return s
	}
	return strings.ToValidUTF8(s[:ledger.MaxReasonLen], "")
}

// packEvidence adds an appeal's package to storage: the payer's answer
// (answer.json) beside each of run's workers' evidence (w<index>/).
func (e *Executor) packEvidence(ctx context.Context, run string, a ledger.Answer) (string, error) {
	scratch, err := os.MkdirTemp(e.dir, ".appeal-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(scratch)
	pkg := filepath.Join(scratch, "pkg")
	if err := os.Mkdir(pkg, 0o755); err != nil {
		return "", err
	}
	n := 0
	err = e.store.Each(evidenceKey+run+"/", func(key string, doc []byte) error {
		var s string
		if err := json.Unmarshal(doc, &s); err != nil {
			return err
		}
		c, err := cid.Decode(s)
		if err != nil {
			return err
		}
		n++
		_, err = e.blocks.FetchInto(ctx, c, filepath.Join(pkg, "w"+filepath.Base(key)), nil)
		return err
	})
	if err != nil {
		return "", err
	}
	if n == 0 {
		return "", errors.New("no worker of the run kept evidence here")
	}
	b, _ := json.MarshalIndent(a, "", " ")
	if err := os.WriteFile(filepath.Join(pkg, "answer.json"), b, 0o644); err != nil {
		return "", err
	}
	root, err := os.OpenRoot(scratch)
	if err != nil {
		return "", err
	}
	defer root.Close()
	pin, err := e.blocks.AddFrom(ctx, root, "pkg", nil)
	if err != nil {
		return "", err
	}
	return pin.CID.String(), nil
}

var roundDirRE = regexp.MustCompile(`^round-[0-9]+$`)

// recompute judges case d: its package fetched (bounded), the payer's
// answer in it checked, and the refusal the answer names recomputed by
// the deepmarket package's referee program in a sandbox.
func (e *Executor) recompute(ctx context.Context, d ledger.Docket) (verdict, error) {
	scratch, err := os.MkdirTemp(e.dir, ".referee-")
	if err != nil {
		return verdict{}, err
	}
	defer os.RemoveAll(scratch)
	pkgCID, err := cid.Decode(d.Evidence)
	if err != nil {
		return verdict{Why: "the evidence is not a content address"}, nil
	}
	if err := e.fetchBounded(ctx, pkgCID, filepath.Join(scratch, "pkg")); err != nil {
		return verdict{}, fmt.Errorf("fetch the evidence %s: %w", d.Evidence, err)
	}
	var a ledger.Answer
	b, err := os.ReadFile(filepath.Join(scratch, "pkg", "answer.json"))
	if err == nil {
		err = json.Unmarshal(b, &a)
	}
	switch {
	case err != nil || a.Job != d.Job || a.Payee != d.Appellant || !ledger.VerifyAnswer(d.PayerKey, e.chainID, a):
		return verdict{Why: "the evidence holds no answer the payer signed to the appellant for this job"}, nil
	case d.Claim > d.Cap:
		return verdict{Why: fmt.Sprintf("the claim %d is over what the refused rounds could have paid (%d)", d.Claim, d.Cap)}, nil
	case a.Refused == 0:
		return verdict{Why: "the payer's answer refused nothing"}, nil
	case a.Forfeited:
		return verdict{Abstain: true, Why: "a spot check's forfeit: a referee cannot replay the worker's data"}, nil
	case a.Refusal == nil:
		return verdict{Overturn: true, Why: "the payer refused rounds without naming what it refused"}, nil
	case a.Terms.Validation == "":
		return verdict{Abstain: true, Why: "the bid names no validation batch to recompute the loss on"}, nil
	}
	round, err := findRound(filepath.Join(scratch, "pkg"), a.Refusal)
	if err != nil {
		return verdict{}, err
	}
	if round == "" {
		return verdict{Why: "the evidence has no round with the update the payer's answer names"}, nil
	}
	valCID, err := cid.Decode(a.Terms.Validation)
	if err != nil {
		return verdict{Abstain: true, Why: "the bid's validation batch is not a content address"}, nil
	}
	if err := e.fetchBounded(ctx, valCID, filepath.Join(scratch, "validation")); err != nil {
		return verdict{}, fmt.Errorf("fetch the validation batch %s: %w", a.Terms.Validation, err)
	}
	r := a.Refusal
	c, _ := json.Marshal(map[string]any{"theta": r.Theta, "prev": r.Prev, "update": r.Update, "model": r.Model,
		"tolerance": a.Terms.Tolerance, "echo": a.Terms.Echo, "residual": a.Terms.Residual})
	if err := os.WriteFile(filepath.Join(scratch, "case.json"), c, 0o644); err != nil {
		return verdict{}, err
	}
	rel, _ := filepath.Rel(scratch, round)
	return e.runReferee(ctx, scratch, rel, filepath.Join("validation", valCID.String()))
}

// findRound is the round directory in pkg whose update is r's.
func findRound(pkg string, r *ledger.Refusal) (string, error) {
	ws, err := os.ReadDir(pkg)
	if err != nil {
		return "", err
	}
	for _, w := range ws {
		if !w.IsDir() {
			continue
		}
		rounds, _ := os.ReadDir(filepath.Join(pkg, w.Name()))
		for _, rd := range rounds {
			if !rd.IsDir() || rd.Name() != "round-"+strconv.FormatUint(r.Round, 10) || !roundDirRE.MatchString(rd.Name()) {
				continue
			}
			var meta struct {
				Update string `json:"update"`
			}
			b, err := os.ReadFile(filepath.Join(pkg, w.Name(), rd.Name(), "evidence.json"))
			if err == nil && json.Unmarshal(b, &meta) == nil && meta.Update == r.Update {
				return filepath.Join(pkg, w.Name(), rd.Name()), nil
			}
		}
	}
	return "", nil
}

// fetchBounded fetches c into dir, giving up past maxEvidenceBytes.
func (e *Executor) fetchBounded(ctx context.Context, c cid.Cid, dir string) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	over := func(p storage.Progress) {
		if p.Done > maxEvidenceBytes {
			cancel(fmt.Errorf("more than %d bytes", maxEvidenceBytes))
		}
	}
	ctx, stop := context.WithTimeout(ctx, refereeTimeout)
	defer stop()
	_, err := e.blocks.FetchInto(ctx, c, dir, over)
	if cause := context.Cause(ctx); err != nil && cause != nil {
		err = cause
	}
	return err
}

// runReferee runs the referee program in a sandbox with dir as its own,
// and reads its verdict (its last line of output).
func (e *Executor) runReferee(ctx context.Context, dir, evidence, validation string) (verdict, error) {
	if e.python == "" {
		return verdict{Abstain: true, Why: "this node has no Python to recompute with"}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, refereeTimeout)
	defer cancel()
	var out, errs limitedBuffer
	out.max, errs.max = 64<<10, 64<<10
	proc, err := sandbox.Start(ctx, sandbox.Spec{
		Name: "referee-" + filepath.Base(dir) + "-" + e.tag, Dir: dir,
		Argv: []string{e.python, "-m", "deepmarket.train.referee", "--case", "case.json", "--evidence", evidence,
			"--validation", validation},
		Env:      []string{"TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES="},
		Limits:   sandbox.Limits{Cores: 1, MemBytes: 4 << 30, Pids: 256, DiskBytes: 1 << 30},
		ReadOnly: readOnlyFor(e.python), Hide: []string{e.home}, Stdout: &out, Stderr: &errs,
	})
	if err != nil {
		return verdict{}, fmt.Errorf("start the referee program: %w", err)
	}
	exit, err := proc.Wait()
	if err != nil {
		return verdict{}, err
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var v verdict
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &v); jerr != nil || exit.Code != 0 && exit.Code != 2 {
		return verdict{}, fmt.Errorf("the referee program ended with code %d %s: %s", exit.Code, exit.Signal,
			strings.TrimSpace(lastLines(errs.String(), 3)))
	}
	v.Abstain = v.Abstain || exit.Code == 2
	return v, nil
}

// serveReferee reads this validator's docket every refereeEvery and
// votes on each case it has not judged: a case is judged once; one it
// could not fetch or run is tried again until its deadline.
func (e *Executor) serveReferee(ctx context.Context) {
	judged := map[string]int64{} // case -> its deadline, once voted on or left
	t := time.NewTicker(refereeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for k, deadline := range judged {
			if time.Now().Unix() > deadline {
				delete(judged, k)
			}
		}
		cases, err := e.appeals.Cases(ctx, e.account)
		if err != nil {
			continue
		}
		for _, d := range cases {
			key := d.Job + "/" + d.Appellant
			if _, done := judged[key]; done || time.Now().Unix() > d.Deadline {
				continue
			}
			log := e.log.With("module", "referee", "job", d.Job[:12], "appellant", d.Appellant)
			started := time.Now()
			v, err := e.recompute(ctx, d)
			if err != nil {
				log.Warn("cannot judge the appeal yet", "err", err)
				continue
			}
			judged[key] = d.Deadline
			if v.Abstain {
				log.Warn("drawn as a referee, this node cannot judge the appeal: no vote", "why", v.Why)
				continue
			}
			if _, err := e.appeals.Verdict(ctx, d.Job, d.Appellant, v.Overturn); err != nil {
				log.Warn("the verdict was not recorded", "err", err)
				if le := (*ledger.Error)(nil); !errors.As(err, &le) { // no answer from the ledger: judged again next time
					delete(judged, key)
				}
				continue
			}
			log.Info("drawn as a referee, recomputed the refusal and voted", "overturn", v.Overturn, "why", v.Why,
				"evaluation_s", v.Seconds, "recompute_s", time.Since(started).Seconds())
		}
	}
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
