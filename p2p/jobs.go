package p2p

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// JobProtocol carries a job's submitter's requests to the machines that
// run its workers: Launch, Status (the heartbeat, with a usage receipt),
// Logs and Stop. Only the submitter that committed the machine's hold may
// use it for that job.
func JobProtocol(chainID string) protocol.ID {
	return protocol.ID("/deepmarket/" + chainID + "/job/1")
}

// Job request and reply payload types.
const (
	TypeLaunch      = "launch/1"
	TypeLaunchReply = "launch-reply/1"
	TypeStatusReq   = "job-status-req/1"
	TypeJobStatus   = "job-status/1"
	TypeLogsReq     = "logs-req/1"
	TypeLogs        = "logs/1"
	TypeStop        = "stop/1"
)

// MaxLogChunk bounds the log bytes one Logs reply carries.
const MaxLogChunk = 48 << 10

// StopGrace is how long a stopped worker has to write its checkpoint
// before its machine kills it; its submitter waits that long for it.
const StopGrace = 10 * time.Second

// Launch asks a machine to start worker Index of a job on the capacity
// its hold reserved.
type Launch struct {
	JobID string   `cbor:"job" json:"job_id"` // the run: escrow, holds and bid use it
	Index int      `cbor:"index" json:"index"`
	World []string `cbor:"world" json:"world"` // peer ID of each worker's machine, worker 0 the chief
	// Addrs holds, per worker, where its machine listens (multiaddrs, as
	// its offer said), so machines that never met can connect.
	Addrs     [][]string `cbor:"addrs,omitempty" json:"addrs,omitempty"`
	Hold      string     `cbor:"hold" json:"hold"`
	Framework string     `cbor:"framework" json:"framework"`
	Command   []string   `cbor:"cmd" json:"command"`
	Bundle    string     `cbor:"bundle" json:"bundle_cid"`
	Dataset   string     `cbor:"dataset,omitempty" json:"dataset_cid,omitempty"`
	Resume    string     `cbor:"resume,omitempty" json:"resume_cid,omitempty"` // the chief's checkpoint output dir, on re-placement
	// Image is the CID of the job's environment, an OCI image layout
	// directory (node/image): the worker runs in its root filesystem
	// instead of this machine's system dirs and Python.
	Image   string    `cbor:"image,omitempty" json:"image_cid,omitempty"`
	Res     Resources `cbor:"res" json:"resources"`
	MaxSecs int64     `cbor:"max_s" json:"max_duration_s"`
	PerHour uint64    `cbor:"per_hour" json:"per_hour"` // what this worker's machine is paid an hour
	// Floor is the share of PerHour the machine is paid for every hour its
	// worker runs, whatever its rounds or progress (the bid's floor): its
	// receipts cover at least that, or it stops the worker.
	Floor float64 `cbor:"floor,omitempty" json:"floor,omitempty"`
	// Training is how the job's workers synchronize, when its spec says
	// (the worker sees it as DM_TRAINING_MODE, DM_SYNC_EVERY, DM_COMPRESS).
	Training *Training `cbor:"training,omitempty" json:"training,omitempty"`
}

// Training is a job's synchronization mode: sync (every step, the
// framework's own) or diloco (SyncEvery local steps between averaging
// rounds, the exchange compressed as Compress says: int8, fp16 or none).
type Training struct {
	Mode      string `cbor:"mode" json:"mode" toml:"mode"`
	SyncEvery int    `cbor:"sync_every,omitempty" json:"sync_every,omitempty" toml:"sync_every"`
	Compress  string `cbor:"compress,omitempty" json:"compress,omitempty" toml:"compress"`
	// Steps, Params and StepMillis describe the work, for quotes that
	// predict the job's time: the optimizer steps one worker alone takes
	// to the target, the model's parameter count, and one step's time on
	// a reference machine (default: max_duration spread over the steps).
	Steps      int64   `cbor:"steps,omitempty" json:"steps,omitempty" toml:"steps"`
	Params     int64   `cbor:"params,omitempty" json:"params,omitempty" toml:"params"`
	StepMillis float64 `cbor:"step_ms,omitempty" json:"step_ms,omitempty" toml:"step_ms"`
	// StepsRatio is the job's own statistical efficiency, when measured
	// (python -m deepmarket.stateff): element k-1 is the steps each of k
	// workers takes to the target over one worker's, the first being 1.
	// Without it quotes use the scheduler's shipped table.
	StepsRatio []float64 `cbor:"steps_ratio,omitempty" json:"steps_ratio,omitempty" toml:"steps_ratio"`
	// Holder is who keeps the model in diloco mode: "workers" (the
	// default: they coordinate the rounds among themselves) or
	// "submitter": the submitter's node runs the job's program once more
	// as the holder (DM_ROLE=holder), which checks every worker's update
	// on its own data and averages only those that help; each machine is
	// paid for its worker's accepted rounds, and the job's result is the
	// holder's output.
	Holder string `cbor:"holder,omitempty" json:"holder,omitempty" toml:"holder"`
	// Verify, in a held job, turns on spot checks (a job spec's [verify]).
	Verify *Verify `cbor:"verify,omitempty" json:"verify,omitempty" toml:"-"`
	// Checks, in a held job, are the thresholds its holder judges every
	// update by ([training.checks]; the defaults when the spec names
	// none): part of the signed bid, so what refuses a round is written
	// where a referee reads it.
	Checks *Checks `cbor:"checks,omitempty" json:"checks,omitempty" toml:"checks"`
	// Validation, in a held job, is the content address of the batch the
	// holder checks every update on (in a spec, the file's path): the
	// holder loads it by that address (DM_VALIDATION), and a referee
	// recomputes a contested check on the same batch.
	Validation string `cbor:"validation,omitempty" json:"validation,omitempty" toml:"validation"`
}

// Checks are a held job's thresholds, as the deepmarket package's Holder
// reads them (DM_CHECK_*). An update is refused when theta less it raises
// the validation loss by more than Tolerance (relative), when its norm is
// over NormFactor times the round's median, when it repeats the last
// global update (cosine similarity over Echo), when it leans on it (over
// Residual) and the rest of it does not lower the loss, or when it
// duplicates another worker's (over Duplicate).
type Checks struct {
	Tolerance  float64 `cbor:"tolerance" json:"tolerance" toml:"tolerance"`
	NormFactor float64 `cbor:"norm_factor" json:"norm_factor" toml:"norm_factor"`
	Echo       float64 `cbor:"echo" json:"echo" toml:"echo"`
	Residual   float64 `cbor:"residual" json:"residual" toml:"residual"`
	Duplicate  float64 `cbor:"duplicate" json:"duplicate" toml:"duplicate"`
}

// DefaultChecks are the Holder's own defaults.
func DefaultChecks() *Checks {
	return &Checks{Tolerance: 0.1, NormFactor: 10, Echo: 0.98, Residual: 0.9, Duplicate: 0.98}
}

// Bounds of a held job's thresholds: none may make refusing an honest
// update the rule (a similarity bound of 0 refuses every update that
// points the way the model went, a tolerance of 0 every noisy one).
const (
	MinCheckTolerance  = 0.01
	MinCheckNormFactor = 2
	MaxCheckNormFactor = 1000
	MinCheckSimilarity = 0.9 // echo and duplicate
	MinCheckResidual   = 0.5
)

// Validate checks the thresholds against their bounds.
func (c *Checks) Validate() error {
	in := func(v, lo, hi float64) bool { return v >= lo && v <= hi } // NaN: false
	switch {
	case !in(c.Tolerance, MinCheckTolerance, 1):
		return rangeErr("checks tolerance %g (want %g to 1: the relative rise in validation loss allowed)", c.Tolerance, MinCheckTolerance)
	case !in(c.NormFactor, MinCheckNormFactor, MaxCheckNormFactor):
		return rangeErr("checks norm_factor %g (want %g to %g)", c.NormFactor, float64(MinCheckNormFactor), float64(MaxCheckNormFactor))
	case !in(c.Echo, MinCheckSimilarity, 1):
		return rangeErr("checks echo %g (want %g to 1)", c.Echo, MinCheckSimilarity)
	case !in(c.Residual, MinCheckResidual, 1):
		return rangeErr("checks residual %g (want %g to 1)", c.Residual, MinCheckResidual)
	case !in(c.Duplicate, MinCheckSimilarity, 1):
		return rangeErr("checks duplicate %g (want %g to 1)", c.Duplicate, MinCheckSimilarity)
	}
	return nil
}

// MaxValidationLen bounds a training block's validation address (or, in
// a spec, path).
const MaxValidationLen = 4096

// ValidateInputs checks what a training block names by content address,
// as a bid or a launch carries it: the validation batch is a CID.
func (t *Training) ValidateInputs() error {
	if t != nil && t.Validation != "" && !cidRE.MatchString(t.Validation) {
		return rangeErr("validation batch CID %q", t.Validation)
	}
	return nil
}

// Verify is a held job's spot checks: every worker commits to its state at
// each round's start; the holder replays a Rate share of the rounds it
// accepted from that state, on that worker's batches, and a round whose
// update is further than Tolerance (relative) from its replay, a state
// that is not the one committed, or a check left unanswered forfeits all
// the worker's pay. Share of each worker's pay is held back until it
// passes a check.
type Verify struct {
	Rate      float64 `cbor:"rate" json:"rate" toml:"rate"`
	Share     float64 `cbor:"share" json:"share" toml:"share"`
	Tolerance float64 `cbor:"tolerance" json:"tolerance" toml:"tolerance"`
}

// Spot check defaults and bounds. A job's terms cannot make checks a way
// not to pay: at most MaxVerifyShare of a worker's pay is held back
// until it passes a check (and what is held back of a worker never
// checked is paid at settlement), and the rate checks each worker once in
// expectation at least (Training.MinVerifyRate).
const (
	DefaultVerifyShare     = 0.2
	DefaultVerifyTolerance = 0.1
	MaxVerifyShare         = 0.2
	// UnknownRoundsVerifyRate is the least rate, and the default, when
	// the job does not say its steps: a check every 10 rounds.
	UnknownRoundsVerifyRate = 0.1
)

// Validate checks the spot checks' values.
func (v *Verify) Validate() error {
	switch {
	case !(v.Rate > 0 && v.Rate <= 1):
		return rangeErr("verify rate %g (want the share of rounds replayed, over 0 and at most 1)", v.Rate)
	case !(v.Share >= 0 && v.Share <= MaxVerifyShare):
		return rangeErr("verify share %g (want the share of pay held back until a check passes, 0 to %g)", v.Share, MaxVerifyShare)
	case !(v.Tolerance > 0 && v.Tolerance <= 1):
		return rangeErr("verify tolerance %g (want the relative error allowed, over 0 and at most 1)", v.Tolerance)
	}
	return nil
}

// Rounds is how many averaging rounds each worker of a diloco job takes,
// when the job says its steps; 0 when it does not.
func (t *Training) Rounds() int64 {
	if t == nil || t.Steps <= 0 {
		return 0
	}
	every := int64(t.SyncEvery)
	if every <= 0 {
		every = DefaultSyncEvery
	}
	return (t.Steps + every - 1) / every
}

// MinVerifyRate is the least spot check rate that checks each worker of
// the job once in expectation: 1 over its rounds, or
// UnknownRoundsVerifyRate when the job does not say its steps.
func (t *Training) MinVerifyRate() float64 {
	if n := t.Rounds(); n > 0 {
		return 1 / float64(n)
	}
	return UnknownRoundsVerifyRate
}

// DefaultVerify is the spot checks a held job gets when its spec names
// none: each worker checked once in expectation (and at least every 10
// rounds), the default share held back and tolerance.
func (t *Training) DefaultVerify() *Verify {
	return &Verify{Rate: min(1, max(UnknownRoundsVerifyRate, t.MinVerifyRate())), Share: DefaultVerifyShare, Tolerance: DefaultVerifyTolerance}
}

// FillHeld gives a held job the spot checks and thresholds it does not
// name: DefaultVerify and DefaultChecks. Not held: nothing.
func (t *Training) FillHeld() {
	if !t.Held() {
		return
	}
	if t.Verify == nil {
		t.Verify = t.DefaultVerify()
	}
	d := DefaultChecks()
	if t.Checks == nil {
		t.Checks = d
		return
	}
	c := *t.Checks // those it names; none is 0 when valid, so 0 is unnamed
	for _, f := range []struct{ v, d *float64 }{{&c.Tolerance, &d.Tolerance}, {&c.NormFactor, &d.NormFactor},
		{&c.Echo, &d.Echo}, {&c.Residual, &d.Residual}, {&c.Duplicate, &d.Duplicate}} {
		if *f.v == 0 {
			*f.v = *f.d
		}
	}
	t.Checks = &c
}

// Held says whether the job's submitter holds the model (Holder).
func (t *Training) Held() bool { return t != nil && t.Holder == HolderSubmitter }

// Who may hold a diloco job's model.
const (
	HolderWorkers   = "workers"
	HolderSubmitter = "submitter"
)

// Bounds of a training block's work description.
const (
	MaxTrainingSteps = 1_000_000_000
	MaxParams        = 100_000_000_000 // 400 GB of float32 weights
	MaxStepMillis    = 3_600_000       // an hour
)

// Training modes and compressions a job may name.
var (
	TrainingModes = map[string]bool{"sync": true, "diloco": true}
	Compressions  = map[string]bool{"int8": true, "fp16": true, "none": true}
)

// MaxSyncEvery bounds the local steps between averaging rounds.
const MaxSyncEvery = 1_000_000

// DefaultSyncEvery is the local steps between rounds of a diloco job that
// names none: what the deepmarket Python package takes then.
const DefaultSyncEvery = 500

// MaxStepsRatio bounds a training block's steps_ratio: worker counts up
// to a job's most workers.
const MaxStepsRatio = 64

// Validate checks a training block's values.
func (t *Training) Validate() error {
	switch {
	case !TrainingModes[t.Mode]:
		return rangeErr("training mode %q (want sync or diloco)", t.Mode)
	case t.SyncEvery < 0 || t.SyncEvery > MaxSyncEvery:
		return rangeErr("sync_every %d (want 1 to %d)", t.SyncEvery, MaxSyncEvery)
	case t.Compress != "" && !Compressions[t.Compress]:
		return rangeErr("compress %q (want int8, fp16 or none)", t.Compress)
	case t.Mode == "sync" && (t.SyncEvery != 0 || t.Compress != ""):
		return rangeErr("sync_every and compress apply to mode diloco only")
	case t.Steps < 0 || t.Steps > MaxTrainingSteps:
		return rangeErr("steps %d (want 1 to %d)", t.Steps, MaxTrainingSteps)
	case t.Params < 0 || t.Params > MaxParams:
		return rangeErr("params %d (want 1 to %d)", t.Params, int64(MaxParams))
	case !(t.StepMillis >= 0 && t.StepMillis <= MaxStepMillis): // NaN too
		return rangeErr("step_ms %g (want 0 to %d)", t.StepMillis, MaxStepMillis)
	case t.Holder != "" && t.Holder != HolderWorkers && t.Holder != HolderSubmitter:
		return rangeErr("holder %q (want workers or submitter)", t.Holder)
	case t.Holder == HolderSubmitter && t.Mode != "diloco":
		return rangeErr("holder = \"submitter\" applies to mode diloco only")
	case t.Verify != nil && !t.Held():
		return rangeErr("spot checks ([verify]) need a held job: [training] mode = \"diloco\", holder = \"submitter\"")
	case t.Checks != nil && !t.Held():
		return rangeErr("checks ([training.checks]) need a held job: holder = \"submitter\"")
	case t.Validation != "" && !t.Held():
		return rangeErr("a validation batch needs a held job: holder = \"submitter\"")
	case len(t.Validation) > MaxValidationLen:
		return rangeErr("validation: %d bytes (want at most %d)", len(t.Validation), MaxValidationLen)
	case len(t.StepsRatio) > MaxStepsRatio:
		return rangeErr("steps_ratio has %d values (want at most %d)", len(t.StepsRatio), MaxStepsRatio)
	}
	for i, r := range t.StepsRatio {
		k := float64(i + 1)
		if !(r >= 1/k && r <= 1) || (i == 0 && r != 1) {
			return rangeErr("steps_ratio[%d] = %g (want 1 for 1 worker, 1/%d to 1 for %d)", i, r, i+1, i+1)
		}
	}
	if t.Checks != nil {
		if err := t.Checks.Validate(); err != nil {
			return err
		}
	}
	if t.Verify != nil {
		if err := t.Verify.Validate(); err != nil {
			return err
		}
		if least := t.MinVerifyRate(); t.Verify.Rate < least {
			how := "every 10 rounds, as the job does not say its steps"
			if n := t.Rounds(); n > 0 {
				how = fmt.Sprintf("once per worker over its %d rounds, in expectation", n)
			}
			return rangeErr("verify rate %g (want at least %.3g: each worker checked %s)", t.Verify.Rate, least, how)
		}
	}
	return nil
}

// Env is the training block as the worker's environment.
func (t *Training) Env() []string {
	if t == nil {
		return nil
	}
	env := []string{"DM_TRAINING_MODE=" + t.Mode}
	if t.SyncEvery > 0 {
		env = append(env, fmt.Sprintf("DM_SYNC_EVERY=%d", t.SyncEvery))
	}
	if t.Compress != "" {
		env = append(env, "DM_COMPRESS="+t.Compress)
	}
	if v := t.Verify; v != nil {
		env = append(env, "DM_VERIFY_RATE="+strconv.FormatFloat(v.Rate, 'g', -1, 64),
			"DM_VERIFY_SHARE="+strconv.FormatFloat(v.Share, 'g', -1, 64),
			"DM_VERIFY_TOLERANCE="+strconv.FormatFloat(v.Tolerance, 'g', -1, 64))
	}
	if c := t.Checks; c != nil {
		f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
		env = append(env, "DM_CHECK_TOLERANCE="+f(c.Tolerance), "DM_CHECK_NORM_FACTOR="+f(c.NormFactor),
			"DM_CHECK_ECHO="+f(c.Echo), "DM_CHECK_RESIDUAL="+f(c.Residual), "DM_CHECK_DUPLICATE="+f(c.Duplicate))
	}
	if t.Validation != "" {
		env = append(env, "DM_VALIDATION_CID="+t.Validation)
	}
	return env
}

// Validate checks a launch request's shape.
func (l *Launch) Validate() error {
	switch {
	case !jobIDRE.MatchString(l.JobID):
		return rangeErr("job ID %q is not a hex SHA-256", l.JobID)
	case len(l.World) < 1 || len(l.World) > MaxWorkers:
		return rangeErr("world of %d workers: want 1 to %d", len(l.World), MaxWorkers)
	case l.Index < 0 || l.Index >= len(l.World):
		return rangeErr("worker index %d of %d", l.Index, len(l.World))
	case !reservationIDRE.MatchString(l.Hold):
		return rangeErr("hold %q", l.Hold)
	case !Frameworks[l.Framework]:
		return rangeErr("framework %q", l.Framework)
	case len(l.Command) == 0 || len(l.Command) > 256:
		return rangeErr("command of %d arguments: want 1 to 256", len(l.Command))
	case !cidRE.MatchString(l.Bundle):
		return rangeErr("bundle CID %q", l.Bundle)
	case l.Dataset != "" && !cidRE.MatchString(l.Dataset):
		return rangeErr("dataset CID %q", l.Dataset)
	case l.Resume != "" && !cidRE.MatchString(l.Resume):
		return rangeErr("resume CID %q", l.Resume)
	case l.Image != "" && !cidRE.MatchString(l.Image):
		return rangeErr("image CID %q", l.Image)
	case l.MaxSecs <= 0 || l.MaxSecs > int64(MaxJobDuration/time.Second):
		return rangeErr("max duration %ds", l.MaxSecs)
	case l.Floor != 0 && !(l.Floor >= MinFloor && l.Floor <= 1):
		return rangeErr("floor %g (want %g to 1)", l.Floor, MinFloor)
	}
	if l.Training != nil {
		if err := l.Training.Validate(); err != nil {
			return err
		}
		if err := l.Training.ValidateInputs(); err != nil {
			return err
		}
	}
	for _, a := range l.Command {
		if len(a) > 4096 {
			return rangeErr("a command argument longer than 4096 bytes")
		}
	}
	for _, w := range l.World {
		if _, err := peer.Decode(w); err != nil {
			return rangeErr("world machine %q: %v", w, err)
		}
	}
	if len(l.Addrs) > len(l.World) {
		return rangeErr("addresses for %d machines, world of %d", len(l.Addrs), len(l.World))
	}
	for _, as := range l.Addrs {
		if len(as) > 32 {
			return rangeErr("more than 32 addresses for a machine")
		}
		for _, a := range as {
			if len(a) > 256 {
				return rangeErr("an address longer than 256 bytes")
			}
		}
	}
	return l.Res.check("resources", false)
}

// LaunchReply is the machine's answer: OK means it accepted the worker and
// is fetching its inputs; Status follows its progress.
type LaunchReply struct {
	OK     bool   `cbor:"ok" json:"ok"`
	Reason string `cbor:"reason,omitempty" json:"reason,omitempty"`
	// Retry says the refusal may pass: the machine's replica of the
	// ledger has not shown it the run's escrow yet (it may be catching
	// up). Its hold stays until it lapses; the same launch may be sent
	// again.
	Retry bool `cbor:"retry,omitempty" json:"retry,omitempty"`
}

// Receipt is the payer's signed statement of what a machine has earned on
// a run so far (see ledger.Receipt; the signature covers chain, job,
// payee, amount and sequence).
type Receipt struct {
	Payee  string `cbor:"payee" json:"payee"`
	Amount uint64 `cbor:"amount" json:"amount"`
	Seq    uint64 `cbor:"seq" json:"seq"`
	Sig    []byte `cbor:"sig" json:"sig"`
	// Answer, in a held job, is the payer's signed word on the payee's
	// rounds so far (ledger.Answer, whose job and payee are the
	// receipt's).
	Answer *Answer `cbor:"answer,omitempty" json:"answer,omitempty"`
}

// Answer is a ledger.Answer on the wire, beside its receipt.
type Answer struct {
	Round          uint64 `cbor:"round" json:"round"`
	Accepted       uint32 `cbor:"accepted" json:"accepted"`
	Refused        uint32 `cbor:"refused" json:"refused"`
	AcceptedMillis uint64 `cbor:"accepted_ms" json:"accepted_ms"`
	Reason         string `cbor:"reason,omitempty" json:"reason,omitempty"`
	Forfeited      bool   `cbor:"forfeited,omitempty" json:"forfeited,omitempty"`
	// Refusal names the last refused update by digest (ledger.Refusal).
	Refusal *Refusal `cbor:"refusal,omitempty" json:"refusal,omitempty"`
	Sig     []byte   `cbor:"sig" json:"sig"`
}

// Refusal is a ledger.Refusal on the wire.
type Refusal struct {
	Round  uint64 `cbor:"round" json:"round"`
	Theta  string `cbor:"theta" json:"theta"`
	Prev   string `cbor:"prev,omitempty" json:"prev,omitempty"`
	Update string `cbor:"update" json:"update"`
	Model  string `cbor:"model,omitempty" json:"model,omitempty"`
}

// StatusReq asks how a worker is doing; it is also the submitter's
// heartbeat, and carries its latest usage receipt for the machine.
type StatusReq struct {
	JobID   string   `cbor:"job" json:"job_id"`
	Index   int      `cbor:"index" json:"index"`
	Receipt *Receipt `cbor:"receipt,omitempty" json:"receipt,omitempty"`
}

// WorkerState is where a job's worker is on its machine.
type WorkerState string

// Worker states a machine reports.
const (
	WorkerFetching WorkerState = "fetching" // bundle and dataset coming
	WorkerRunning  WorkerState = "running"
	WorkerExited   WorkerState = "exited" // ended by itself; see ExitCode
	WorkerStopped  WorkerState = "stopped"
	WorkerFailed   WorkerState = "failed" // could not start, or a limit was hit
)

// Known reports whether s is one of the states a machine may report.
func (s WorkerState) Known() bool {
	switch s {
	case WorkerFetching, WorkerRunning, WorkerExited, WorkerStopped, WorkerFailed:
		return true
	}
	return false
}

// Ended reports whether a worker in s does nothing more.
func (s WorkerState) Ended() bool {
	return s == WorkerExited || s == WorkerStopped || s == WorkerFailed
}

// MaxReasonLen bounds a JobStatus's Reason: a machine clips a longer one
// (Clip) before it sends, since a report past it counts as no answer.
const MaxReasonLen = maxTextLen

// JobStatus is a worker's state on its machine.
type JobStatus struct {
	JobID    string      `cbor:"job" json:"job_id"`
	Index    int         `cbor:"index" json:"index"`
	State    WorkerState `cbor:"state" json:"state"`
	ExitCode int         `cbor:"exit,omitempty" json:"exit_code"`
	Reason   string      `cbor:"reason,omitempty" json:"reason,omitempty"`
	Started  int64       `cbor:"started,omitempty" json:"started_ms,omitempty"` // unix ms
	Ended    int64       `cbor:"ended,omitempty" json:"ended_ms,omitempty"`
	// Result is the CID of the chief's output dir once it exited;
	// Checkpoint the same when it was stopped (for a re-placed run).
	Result     string `cbor:"result,omitempty" json:"result_cid,omitempty"`
	Checkpoint string `cbor:"ckpt,omitempty" json:"checkpoint_cid,omitempty"`
	LogBytes   int64  `cbor:"log,omitempty" json:"log_bytes"`
	// Suspended says the worker is suspended now (its machine's owner
	// needs the machine); SuspendedMs is how long it has been suspended
	// in all, which its machine is not paid for.
	Suspended   bool  `cbor:"susp,omitempty" json:"suspended,omitempty"`
	SuspendedMs int64 `cbor:"susp_ms,omitempty" json:"suspended_ms,omitempty"`
	// Vacated says its machine stopped it for the machine's owner (with
	// a checkpoint): it is paid for the time it ran, and re-placed.
	Vacated bool `cbor:"vacated,omitempty" json:"vacated,omitempty"`
	// OutOfTime says its machine stopped it at the job's max duration:
	// the job is out of time, not short of a worker (a submitter does
	// not take a machine's word for it before the time is up).
	OutOfTime bool `cbor:"oot,omitempty" json:"out_of_time,omitempty"`
	// Unpaid says its machine stopped it because the job stopped paying
	// it: the holder refused its last updates, or the receipts fell
	// behind the floor (the lender's stop-loss). A submitter takes it as
	// a stop with a cause, not a lost machine, only where its own records
	// bear it out (its holder refused the worker's rounds).
	Unpaid bool `cbor:"unpaid,omitempty" json:"unpaid,omitempty"`
	// Progress is what the worker last reported of its work (the
	// deepmarket package's progress file); nil until it reports. Its
	// machine could claim work not done: the submitter only notes when
	// the count grows.
	Progress *Progress `cbor:"prog,omitempty" json:"progress,omitempty"`
}

// Progress is a worker's own count of the work it has done (units:
// steps, batches, any number that only grows while it works) and its last
// loss; a training program also says its training steps out of how many
// it plans (Steps of Total: the job's share done and its ETA), its last
// training accuracy, and what its last evaluation gave (EvalLoss,
// EvalAccuracy, at step EvalAt). A figure it does not report is 0.
type Progress struct {
	Units        uint64  `cbor:"units" json:"units"`
	Loss         float64 `cbor:"loss,omitempty" json:"loss,omitempty"`
	Steps        uint64  `cbor:"steps,omitempty" json:"steps,omitempty"`
	Total        uint64  `cbor:"total,omitempty" json:"total,omitempty"`
	Accuracy     float64 `cbor:"acc,omitempty" json:"accuracy,omitempty"`
	EvalLoss     float64 `cbor:"eloss,omitempty" json:"eval_loss,omitempty"`
	EvalAccuracy float64 `cbor:"eacc,omitempty" json:"eval_accuracy,omitempty"`
	EvalAt       uint64  `cbor:"eat,omitempty" json:"eval_at,omitempty"`
	// The round answers the worker got (a held job's holder's): its
	// updates accepted and refused, and the last refused in a row.
	Accepted   uint64 `cbor:"ans_a,omitempty" json:"accepted,omitempty"`
	Refused    uint64 `cbor:"ans_r,omitempty" json:"refused,omitempty"`
	RefusedRun uint64 `cbor:"ans_run,omitempty" json:"refused_run,omitempty"`
}

// MaxProgressCount bounds a progress report's counts.
const MaxProgressCount = 1 << 50

// Validate checks a progress report's figures: finite, accuracies a
// share, counts within bounds.
func (p *Progress) Validate() error {
	for _, l := range []float64{p.Loss, p.EvalLoss} {
		if !(math.Abs(l) < math.MaxFloat32) { // NaN too
			return rangeErr("progress loss %v", l)
		}
	}
	for _, a := range []float64{p.Accuracy, p.EvalAccuracy} {
		if !(a >= 0 && a <= 1) {
			return rangeErr("progress accuracy %v (want 0 to 1)", a)
		}
	}
	if max(p.Units, p.Steps, p.Total, p.EvalAt, p.Accepted, p.Refused, p.RefusedRun) > MaxProgressCount {
		return rangeErr("progress count over %d", uint64(MaxProgressCount))
	}
	return nil
}

// Validate checks a machine's report on worker index of job: a state
// the protocol knows, for the worker asked about, within bounds. A report
// that fails it counts as no answer.
func (s *JobStatus) Validate(job string, index int) error {
	switch {
	case s.JobID != job || s.Index != index:
		return rangeErr("status of worker %d of %.16s, asked about worker %d of %.16s", s.Index, s.JobID, index, job)
	case !s.State.Known():
		return rangeErr("worker state %q", s.State)
	case len(s.Reason) > MaxReasonLen:
		return rangeErr("reason of %d bytes", len(s.Reason))
	case s.LogBytes < 0 || s.Started < 0 || s.Ended < 0 || s.SuspendedMs < 0:
		return rangeErr("negative log size or time")
	}
	if s.Progress != nil {
		if err := s.Progress.Validate(); err != nil {
			return err
		}
	}
	for _, c := range []string{s.Result, s.Checkpoint} {
		if c != "" && !cidRE.MatchString(c) {
			return rangeErr("CID %q", c)
		}
	}
	return nil
}

// LogsReq asks for a worker's output from Offset.
type LogsReq struct {
	JobID  string `cbor:"job" json:"job_id"`
	Index  int    `cbor:"index" json:"index"`
	Offset int64  `cbor:"off" json:"offset"`
}

// Logs is a chunk of a worker's output.
type Logs struct {
	Data []byte `cbor:"data" json:"data"`
	Next int64  `cbor:"next" json:"next"`
}

// Stop ends a worker. Final also releases its hold and removes its work
// dir (the submitter has what it needs); Checkpoint asks the chief's
// machine to keep its output dir as a checkpoint for a re-placed run.
type Stop struct {
	JobID      string `cbor:"job" json:"job_id"`
	Index      int    `cbor:"index" json:"index"`
	Reason     string `cbor:"reason,omitempty" json:"reason,omitempty"`
	Final      bool   `cbor:"final,omitempty" json:"final,omitempty"`
	Checkpoint bool   `cbor:"ckpt,omitempty" json:"checkpoint,omitempty"`
}
