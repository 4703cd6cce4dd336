package jobs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
)

// State is where a job is in its life on its submitting node.
type State string

// Job states, in order; the last three are terminal, and each terminal
// state is settled on the ledger (what was used is paid, the rest
// refunded) before the job reaches it.
const (
	Submitted State = "submitted" // inputs being added to storage
	Quoting   State = "quoting"   // bid out, quotes coming; then waiting for confirmation
	Waiting   State = "waiting"   // in the submitter's queue: nothing fits now, or only above its benefit
	Reserving State = "reserving" // committing the chosen machines' holds
	Escrowed  State = "escrowed"  // the max price locked on the ledger
	Launching State = "launching" // machines fetching inputs and starting workers
	Running   State = "running"
	Succeeded State = "succeeded"
	Failed    State = "failed"
	Cancelled State = "cancelled"
)

// Terminal reports whether nothing more happens to a job in s.
func (s State) Terminal() bool { return s == Succeeded || s == Failed || s == Cancelled }

var next = map[State][]State{
	Submitted: {Quoting},
	Quoting:   {Reserving, Quoting, Waiting},
	Waiting:   {Quoting},
	Reserving: {Escrowed, Quoting},
	Escrowed:  {Launching},
	Launching: {Running, Quoting}, // a failed launch may re-place
	Running:   {Quoting},          // a lost worker re-places the job once
}

// CanMove reports whether a job in from may go to to. Any live job may
// fail or be cancelled.
func CanMove(from, to State) bool {
	if from.Terminal() {
		return false
	}
	if to == Failed || to == Cancelled || (from == Running && to == Succeeded) {
		return true
	}
	for _, s := range next[from] {
		if s == to {
			return true
		}
	}
	return false
}

// WorkerPlaced is a worker's state from its quote until its machine first
// reports one of p2p's worker states.
const WorkerPlaced p2p.WorkerState = "placed"

// WorkerReleased is a placed worker whose job ended before its machine
// started it: its hold is released.
const WorkerReleased p2p.WorkerState = "released"

// Worker is one of a job's workers, as its submitter knows it.
type Worker struct {
	Machine string `json:"machine"` // peer ID
	Moniker string `json:"moniker,omitempty"`
	Site    string `json:"site,omitempty"`
	Payee   string `json:"payee"` // the machine's ledger address
	Hold    string `json:"hold"`
	PerHour uint64 `json:"per_hour"`
	// Warm says its machine held the job's image when quoted: it starts
	// without fetching it.
	Warm     bool            `json:"warm,omitempty"`
	State    p2p.WorkerState `json:"state"` // WorkerPlaced until its machine reports
	ExitCode int             `json:"exit_code,omitempty"`
	Reason   string          `json:"reason,omitempty"`
	// Started and LastSeen bound the time it ran, as the submitter saw
	// it: what its machine is paid for.
	Started  time.Time `json:"started,omitzero"`
	LastSeen time.Time `json:"last_seen,omitzero"`
	Ended    time.Time `json:"ended,omitzero"`
	// Suspended is how long its machine's owner has had it suspended, not
	// paid for; SuspendedNow says it is suspended at the last poll.
	Suspended    time.Duration `json:"suspended_ns,omitempty"`
	SuspendedNow bool          `json:"suspended,omitempty"`
	// Receipt is the cumulative amount the latest usage receipt covers.
	Receipt    uint64 `json:"receipt"`
	ReceiptSeq uint64 `json:"receipt_seq"`
	LogOffset  int64  `json:"log_offset"`
	// Units and Loss are the progress it last reported (the deepmarket
	// package's count of work done); ProgressAt is when, as the
	// submitter saw it, the count last grew (zero: it never reported).
	Units      uint64    `json:"units,omitempty"`
	Loss       float64   `json:"loss,omitempty"`
	ProgressAt time.Time `json:"progress_at,omitzero"`
	// Steps of Total, Accuracy and the last evaluation (EvalLoss and
	// EvalAccuracy at step EvalAt) are what a training program last
	// reported (p2p.Progress); Curve is its reports over the run.
	Steps        uint64  `json:"steps,omitempty"`
	Total        uint64  `json:"total_steps,omitempty"`
	Accuracy     float64 `json:"accuracy,omitempty"`
	EvalLoss     float64 `json:"eval_loss,omitempty"`
	EvalAccuracy float64 `json:"eval_accuracy,omitempty"`
	EvalAt       uint64  `json:"eval_at,omitempty"`
	Curve        []Point `json:"curve,omitempty"`
	// Accepted and Refused count its rounds the model's holder accepted
	// and refused (a held job); AcceptedSeconds is the time those
	// accepted took: what its machine is paid for.
	Accepted        int     `json:"accepted,omitempty"`
	Refused         int     `json:"refused,omitempty"`
	AcceptedSeconds float64 `json:"accepted_seconds,omitempty"`
	// LastRefusal is the reason the holder gave for its last refusal.
	LastRefusal string `json:"last_refusal,omitempty"`
	// Dropped says the holder dropped it for its refused updates (or a
	// failed spot check).
	Dropped bool `json:"dropped,omitempty"`
	// With spot checks: the checks it passed; HeldSeconds, the accepted
	// time whose pay is held back until it passes one; Forfeited, that it
	// failed one (CheckFailure says how) and is paid nothing more;
	// ForfeitedSeconds, the accepted and held seconds it had when it
	// forfeited them (what the settlement withholds rather than refunds).
	ChecksPassed     int     `json:"checks_passed,omitempty"`
	HeldSeconds      float64 `json:"held_seconds,omitempty"`
	Forfeited        bool    `json:"forfeited,omitempty"`
	CheckFailure     string  `json:"check_failure,omitempty"`
	ForfeitedSeconds float64 `json:"forfeited_seconds,omitempty"`
	// Refusal names its last update the holder refused, by digest: what
	// the payer's answers sign, and referees recompute.
	Refusal *ledger.Refusal `json:"refusal,omitempty"`
	// Benched says why the submitter stopped it while the held run went
	// on (Benched): its floor stops with it.
	Benched string `json:"benched,omitempty"`
}

// Run is one placement of a job: its own bid, holds and escrow. A job is
// re-placed at most once.
type Run struct {
	ID      string    `json:"id"` // escrow and wire ID
	Workers []Worker  `json:"workers"`
	PerHour uint64    `json:"per_hour"`
	Quoted  uint64    `json:"quoted_total"`
	Escrow  uint64    `json:"escrow"`
	Started time.Time `json:"started,omitzero"`
	Ended   time.Time `json:"ended,omitzero"`
	Paid    uint64    `json:"paid"`
	// Withheld is what the settlement withheld for refused rounds and
	// forfeits (ledger.Payment.Withheld): spent, burned when the escrow
	// closes, unless referees uphold a refusal.
	Withheld  uint64    `json:"withheld,omitempty"`
	Settled   bool      `json:"settled"`
	SettleTx  string    `json:"settle_tx,omitempty"`
	Scheduler string    `json:"scheduler,omitempty"`
	HeldUntil time.Time `json:"held_until,omitzero"`
	// Predicted is the quote's prediction of the job's time on these
	// machines, when the spec's [training] gives steps and params.
	Predicted *p2p.Predicted `json:"predicted,omitempty"`
	// Progress says the run's workers report progress: from then on each
	// is paid up to its last progress, and one that stalls stops the run.
	Progress bool `json:"progress,omitempty"`
	// Lockstep says its workers train in lockstep (a synchronous
	// TensorFlow run of 2 or more): none can progress without the others,
	// so a worker's progress is paid only as far as the (lower) median
	// worker's (jobs.Used).
	Lockstep bool `json:"lockstep,omitempty"`
	// Floor is the share of each machine's price the run pays for the
	// time its worker runs, whatever its rounds or progress (the bid's).
	Floor float64 `json:"floor,omitempty"`
	// HolderRounds is the rounds the model's holder has closed (its
	// accounts' round).
	HolderRounds int `json:"holder_rounds,omitempty"`
	// Holder is the model's holder of a held job ([training] holder =
	// "submitter"): this node's own process, worker len(Workers) of the
	// run on this machine. Each worker is then paid for its accepted
	// rounds only, and the run's result is the holder's output.
	Holder *Worker `json:"holder,omitempty"`
}

// Held says whether the run's model is held by its submitter.
func (r *Run) Held() bool { return r.Holder != nil }

// Job is a job on its submitting node, as persisted.
type Job struct {
	ID         string `json:"id"`
	Spec       Spec   `json:"spec"`
	BundleCID  string `json:"bundle_cid"`
	DatasetCID string `json:"dataset_cid,omitempty"`
	ImageCID   string `json:"image_cid,omitempty"`
	// ImageBytes is the image's size, as the bids tell schedulers (0
	// when this node does not hold it).
	ImageBytes int64     `json:"image_bytes,omitempty"`
	State      State     `json:"state"`
	Reason     string    `json:"reason,omitempty"`
	Submitter  string    `json:"submitter"`
	Created    time.Time `json:"created"`
	Updated    time.Time `json:"updated"`
	Confirmed  bool      `json:"confirmed"`
	Runs       []Run     `json:"runs"`
	// Workers is the current run's workers (kept in step by the node).
	Workers    []Worker `json:"workers"`
	ResultCID  string   `json:"result_cid,omitempty"`
	Checkpoint string   `json:"checkpoint_cid,omitempty"`
	// Cost is what the job paid, all runs together (micro-credits).
	Cost uint64 `json:"cost"`
	// Queue is the job's place in its submitter's queue while it waits
	// (and since when it has, while it bids from there).
	Queue *Queued `json:"queue,omitempty"`
	// Summary is worked out when the job is read, not stored (Summarize).
	Summary *Summary `json:"summary,omitempty"`
}

// Queued is what a job waiting in its submitter's queue shows: since
// when, why, its place, what it would cost now, and when it bids next.
type Queued struct {
	Since time.Time `json:"since"`
	// Why is the market's answer to its last bid (or that jobs ahead of
	// it bid first).
	Why string `json:"why"`
	// Position is its place among this node's waiting jobs, from 1; it is
	// worked out when the job is read, not stored.
	Position int `json:"position,omitempty"`
	// PriceNow is what the job would cost at the prices its last bid was
	// refused at, when it was refused for costing more than its max price.
	PriceNow uint64 `json:"price_now,omitempty"`
	// Bids is how often it has bid from the queue.
	Bids int `json:"bids"`
	// NextBid is the latest it bids again; it bids sooner when the
	// offers it holds show room for it.
	NextBid time.Time `json:"next_bid,omitzero"`
}

// Current is the job's latest run (nil before quoting).
func (j *Job) Current() *Run {
	if len(j.Runs) == 0 {
		return nil
	}
	return &j.Runs[len(j.Runs)-1]
}

// NewID names a job: a hex SHA-256 of its submitter, spec and creation
// time, so resubmitting the same spec makes a new job.
func NewID(submitter string, s *Spec, created time.Time) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s|%d|%s|%q|%s|%s|%d|%d|%d|%d", submitter, created.UnixNano(), s.Name, s.Command, s.Bundle, s.Dataset,
		s.Workers, s.Cores, s.MemBytes, s.GPUs)
	return hex.EncodeToString(h.Sum(nil))
}

// RunID names run k (0-based) of job: the first run uses the job's ID,
// later ones a hash of it, so each has its own escrow.
func RunID(job string, k int) string {
	if k == 0 {
		return job
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s/run/%d", job, k)))
	return hex.EncodeToString(sum[:])
}
