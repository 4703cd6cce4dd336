// Command fair measures what each side of a held job can take from the
// other: an honest worker's pay under each greedy-submitter strategy the
// node knows of, a lazy machine's pay, what a lender risks on a payer that
// stops signing, and how soon a settled escrow closes.
//
// It runs the node's own pay code (jobs.ApplyAccounts, jobs.PayPlan,
// jobs.OwedSoFar, jobs.Benched), the spec's validation, and a real ledger
// (ledger.App in memory, driven block by block as CometBFT drives it, one
// block a second) where money moves. The training itself is simulated: 3
// workers of a 1-hour held job at 1 credit an hour, 12 rounds of 300 s,
// the floor at its default 0.5; what the holder says of each worker is
// what each strategy makes it say (make bench-held runs real TensorFlow).
// A strategy that pays the honest worker less than it earned is run again
// with the worker appealing and two of the three drawn referees (of four
// validators) overturning the refusal.
//
//	go run ./bench/fair [-out bench/results/fair.json]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	abci "github.com/cometbft/cometbft/abci/types"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/p2p"
)

const (
	credit   = 1_000_000
	perHour  = credit // each machine's price
	workers  = 3
	rounds   = 12
	roundSec = 300.0
	chainID  = "deepmarket-bench-fair"
)

// Row is one strategy's outcome for the honest worker (or the machine
// the row names).
type Row struct {
	Side     string  `json:"side"`
	Strategy string  `json:"strategy"`
	Paid     uint64  `json:"paid"`   // micro-credits, on the ledger
	Honest   uint64  `json:"honest"` // what an honest run pays the same worker
	Ratio    float64 `json:"ratio"`  // paid / honest
	Goal     string  `json:"goal"`   // what the issue asks
	Met      bool    `json:"met"`    // whether it holds
	Note     string  `json:"note,omitempty"`
	Marked   bool    `json:"marked"`   // the settlement marked the machine failed
	Disputed bool    `json:"disputed"` // and the machine disputed the mark
}

func main() {
	out := flag.String("out", "bench/results/fair.json", "where to write the results (JSON)")
	flag.Parse()
	var rows []Row
	honest := honestPay()
	floor := uint64(float64(honest) * p2p.DefaultFloor)
	honestCost := heldCost(func(int) jobs.HolderAccount { return accepted(rounds) })

	for _, s := range []struct {
		name     string
		accounts func(rank int) jobs.HolderAccount
	}{
		{"holder averages every update, books every round refused", func(int) jobs.HolderAccount { return jobs.HolderAccount{Refused: rounds} }},
		{"refuses all but one worker", func(rank int) jobs.HolderAccount {
			if rank == 0 {
				return accepted(rounds)
			}
			return jobs.HolderAccount{Refused: rounds}
		}},
		{"books 2 workers refused in 2 rounds of 3", func(rank int) jobs.HolderAccount {
			if rank == 0 {
				return accepted(rounds)
			}
			a := accepted(rounds / 3)
			a.Refused = rounds - rounds/3
			return a
		}},
		{"honest", func(int) jobs.HolderAccount { return accepted(rounds) }},
	} {
		run := heldRun()
		acc := map[string]jobs.HolderAccount{}
		for i := range workers {
			acc[strconv.Itoa(i)] = s.accounts(i)
		}
		jobs.ApplyAccounts(run, acc)
		pays, _ := jobs.PayPlan(run, nil, end())
		paid, marked, disputed, spent := settleSpent(pays, nil)
		rows = append(rows, Row{Side: "greedy submitter", Strategy: s.name, Paid: paid[1], Honest: honest, Ratio: ratio(paid[1], honest),
			Goal: ">= floor (0.5)", Met: paid[1] >= floor, Marked: marked[1], Disputed: disputed[1]})
		if s.name == "honest" {
			continue
		}
		rows = append(rows, Row{Side: "greedy submitter", Strategy: s.name + ": what the job cost it", Paid: spent, Honest: honestCost,
			Ratio: ratio(spent, honestCost), Goal: ">= 0.99 of an honest run's cost: refusing saves nothing", Met: ratio(spent, honestCost) >= 0.99,
			Note: "paid to the machines, and withheld for refused rounds (burned when the escrow closes)"})
		if paid[1] < honest {
			after, refs, blocks := appealOnLedger(pays, honest)
			cases := 0
			for i := range workers {
				if paid[i] < honest {
					cases++
				}
			}
			perCase := refs / uint64(max(cases, 1))
			roundPay := float64(perHour) * roundSec / 3600
			round := uint64(roundPay) // one worker-round, truncated
			rows = append(rows, Row{Side: "greedy submitter", Strategy: s.name + ", then appealed", Paid: after[1], Honest: honest,
				Ratio: ratio(after[1], honest), Goal: ">= 0.95 of honest after a dispute; the referees' fee covers replaying a round",
				Met:  ratio(after[1], honest) >= 0.95 && perCase >= round,
				Note: fmt.Sprintf("referees overturned the refusal %d blocks after the appeal; their fee, paid by the payer: %d micro-credits a case, for recomputing at most one worker-round (priced %d)", blocks, perCase, round)})
		}
	}

	// Settles at once for 0.01 after signing receipts for the whole run:
	// the lenders lodge them in the dispute window.
	run := heldRun()
	acc := map[string]jobs.HolderAccount{}
	for i := range workers {
		acc[strconv.Itoa(i)] = accepted(rounds)
	}
	jobs.ApplyAccounts(run, acc)
	receipts := jobs.OwedSoFar(run, end())
	var cheap []ledger.Payment
	for i := range workers {
		cheap = append(cheap, ledger.Payment{Machine: payee(i), Amount: 10_000, Failed: true})
	}
	paid, marked, disputed := settleOnLedger(cheap, receipts)
	rows = append(rows, Row{Side: "greedy submitter", Strategy: "settles at once for 0.01, marks every machine failed", Paid: paid[1],
		Honest: receipts[payee(1)], Ratio: ratio(paid[1], receipts[payee(1)]), Goal: "= its latest receipt", Met: paid[1] >= receipts[payee(1)],
		Marked: marked[1], Disputed: disputed[1], Note: "the lender lodged its receipt and disputed the mark in the window"})

	// Declares every worker forfeited in the last round (a spot check it
	// says failed, which referees cannot replay): the settlement pays the
	// receipts signed before it (the lenders would lodge them), and the
	// rest of what the forfeit would have saved is withheld and burned.
	run = heldRun()
	jobs.ApplyAccounts(run, acc)
	receipts = jobs.OwedSoFar(run, end())
	forfeit := map[string]jobs.HolderAccount{}
	for i := range workers {
		a := accepted(rounds)
		a.Forfeited, a.CheckFailure = true, "round 9 does not replay"
		forfeit[strconv.Itoa(i)] = a
	}
	jobs.ApplyAccounts(run, forfeit)
	for i := range run.Workers {
		run.Workers[i].Receipt = receipts[run.Workers[i].Payee] // what the submitter's node signed
	}
	pays, _ := jobs.PayPlan(run, nil, end())
	paid, marked, disputed, spent := settleSpent(pays, nil)
	rows = append(rows, Row{Side: "greedy submitter", Strategy: "declares every worker forfeited in the last round", Paid: paid[1],
		Honest: honest, Ratio: ratio(paid[1], honest), Goal: "= its latest receipt", Met: paid[1] >= receipts[payee(1)],
		Marked: marked[1], Disputed: disputed[1], Note: "the settlement pays the receipt signed before the forfeit (the lender would lodge it)"})
	rows = append(rows, Row{Side: "greedy submitter", Strategy: "declares every worker forfeited: what the job cost it", Paid: spent,
		Honest: honestCost, Ratio: ratio(spent, honestCost), Goal: ">= 0.99 of an honest run's cost: a forfeit saves nothing",
		Met: ratio(spent, honestCost) >= 0.99, Note: "paid to the machines, and withheld for the forfeits (burned when the escrow closes)"})

	// [verify] share = 1, rate = 1e-9: refused at submit.
	share := 1.0
	f := jobs.File{Name: "greedy", Framework: "tensorflow", Command: []string{"python3", "train.py"}, Bundle: "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi",
		Workers: workers, Cores: 1, Memory: "1GiB", MaxPrice: "5", MaxDuration: "2h",
		Training: &p2p.Training{Mode: "diloco", SyncEvery: 50, Steps: 600, Holder: p2p.HolderSubmitter},
		Verify:   &jobs.VerifyFile{Rate: 1e-9, Share: &share}}
	_, err := f.Validate(".")
	var se *jobs.SpecError
	refused := errors.As(err, &se) && se.Field() == "verify"
	rows = append(rows, Row{Side: "greedy submitter", Strategy: "[verify] share = 1, rate = 1e-9", Goal: "refused at submit, naming the field",
		Met: refused, Note: fmt.Sprint(err)})

	// Stops signing receipts: the lender stops the worker UnpaidLag
	// behind; what it risks is the floor of that lag.
	risk := uint64(float64(perHour) * lender.UnpaidLag.Hours() * p2p.DefaultFloor)
	rows = append(rows, Row{Side: "greedy submitter", Strategy: "stops signing receipts", Paid: honest - risk, Honest: honest,
		Ratio: ratio(honest-risk, honest), Goal: "exposure about one receipt interval or two", Met: lender.UnpaidLag <= 2*time.Minute,
		Note: fmt.Sprintf("stopped %s behind: at most %d micro-credits of floor unpaid", lender.UnpaidLag, risk)})

	// A lazy machine: reported running, never hands a round in. The
	// submitter stops it once the holder closed AbsentRounds rounds.
	run = heldRun()
	acc = map[string]jobs.HolderAccount{"0": accepted(rounds), "2": accepted(rounds)}
	jobs.ApplyAccounts(run, acc)
	run.HolderRounds = jobs.AbsentRounds
	run.Workers[1].Ended = time.Time{} // still running when the holder closed its third round
	benched := jobs.Benched(run)
	stopAt := run.Workers[1].Started.Add(time.Duration(jobs.AbsentRounds*roundSec) * time.Second)
	run.Workers[1].Ended = stopAt
	pays, _ = jobs.PayPlan(run, nil, end())
	paid, _, _ = settleOnLedger(pays, nil)
	lazyCap := uint64(float64(perHour) * (time.Duration(jobs.AbsentRounds*roundSec) * time.Second).Hours() * p2p.DefaultFloor)
	rows = append(rows, Row{Side: "greedy lender", Strategy: "lazy: runs nothing, reports running", Paid: paid[1], Honest: honest, Ratio: ratio(paid[1], honest),
		Goal: "at most the floor until it is caught", Met: benched[1] != "" && paid[1] <= lazyCap,
		Note: fmt.Sprintf("stopped after %d rounds: %s", jobs.AbsentRounds, benched[1])})

	// A worker that fails a spot check: paid nothing, marked failed.
	run = heldRun()
	acc = map[string]jobs.HolderAccount{"0": accepted(rounds), "2": accepted(rounds),
		"1": {Accepted: rounds, Seconds: rounds * roundSec, Forfeited: true, CheckFailure: "replay off by 0.9"}}
	jobs.ApplyAccounts(run, acc)
	pays, _ = jobs.PayPlan(run, nil, end())
	paid, marked, _ = settleOnLedger(pays, nil)
	rows = append(rows, Row{Side: "greedy lender", Strategy: "copycat or shirker caught by a spot check", Paid: paid[1], Honest: honest,
		Ratio: ratio(paid[1], honest), Goal: "0 once caught", Met: paid[1] == 0 && marked[1], Marked: marked[1]})

	closeDelay := closeTiming()
	window := ledger.DefaultParams().DisputeWindow
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "side\tstrategy\tpaid\thonest\tratio\tgoal\tmet\tmarked\tdisputed\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.3f\t%s\t%v\t%v\t%v\t\n", r.Side, r.Strategy, r.Paid, r.Honest, r.Ratio, r.Goal, r.Met, r.Marked, r.Disputed)
	}
	tw.Flush()
	for _, r := range rows {
		if r.Note != "" {
			fmt.Printf("  %s: %s\n", r.Strategy, r.Note)
		}
	}
	fmt.Printf("escrow closes %s after its settlement (dispute window %ds, blocks every 1 s): goal <= window + one block: %v\n",
		closeDelay, window, closeDelay <= time.Duration(window+1)*time.Second)
	fmt.Println("voted here as honest referees would: the referees' own recomputation (real TensorFlow) is measured next, and end to end by TestRefereesPayARefusedHonestWorker")
	doc := map[string]any{"rows": rows, "close_after_settle_s": closeDelay.Seconds(), "dispute_window_s": window,
		"setup":   "node pay code and a real ledger (in memory, 1 block/s); 3 workers, 1 h at 1 credit/h, 12 rounds of 300 s, floor 0.5; training simulated",
		"command": "go run ./bench/fair"}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		log.Fatal(err)
	}
	b, _ := json.MarshalIndent(doc, "", "  ")
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Println("wrote", *out)
}

var t0 = time.Unix(1_800_000_000, 0)

func end() time.Time { return t0.Add(time.Hour) }

func accepted(n int) jobs.HolderAccount {
	return jobs.HolderAccount{Accepted: n, Seconds: float64(n) * roundSec}
}

// heldRun is a held run of 3 workers that ran the hour.
func heldRun() *jobs.Run {
	r := &jobs.Run{ID: jobID(), Holder: &jobs.Worker{}, Escrow: workers * 2 * perHour, Floor: p2p.DefaultFloor}
	for i := range workers {
		r.Workers = append(r.Workers, jobs.Worker{Machine: payee(i), Payee: payee(i), PerHour: perHour, Started: t0, LastSeen: end(), Ended: end()})
	}
	return r
}

func honestPay() uint64 { return uint64(float64(perHour) * rounds * roundSec / 3600) }

func ratio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

var jobCount int

func jobID() string { jobCount++; return fmt.Sprintf("%064x", jobCount) }

func key(b byte) *identity.Key {
	var seed [32]byte
	for i := range seed {
		seed[i] = b
	}
	k, err := identity.KeyFromSeed(seed[:])
	if err != nil {
		log.Fatal(err)
	}
	return k
}

func payee(i int) string { return string(key(byte(10 + i)).Address()) }

// chain is a ledger in memory, driven block by block.
type chain struct {
	app    *ledger.App
	height int64
	now    time.Time
	nonces map[identity.Address]uint64
}

func newChain() *chain {
	app := ledger.NewMemoryApp(nil)
	g := ledger.GenesisState{
		Issuers:  []ledger.GenesisIssuer{{Address: string(key(1).Address()), Name: "u", Quota: 1000 * credit}},
		Balances: []ledger.GenesisBalance{{Address: string(key(2).Address()), Amount: 100 * credit}},
	}
	for i := range workers {
		g.Members = append(g.Members, payee(i))
	}
	raw, err := json.Marshal(g)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := app.InitChain(context.Background(), &abci.RequestInitChain{ChainId: chainID, InitialHeight: 1, AppStateBytes: raw,
		Validators: validators()}); err != nil {
		log.Fatal(err)
	}
	return &chain{app: app, now: t0, nonces: map[identity.Address]uint64{}}
}

// validators are the chain's four validators (keys 90-93): the referees
// appeals draw from.
func validators() []abci.ValidatorUpdate {
	var out []abci.ValidatorUpdate
	for i := range 4 {
		out = append(out, abci.Ed25519ValidatorUpdate(key(byte(90+i)).Public(), 10))
	}
	return out
}

// appealOnLedger is settleOnLedger, then each machine paid less than
// owed appeals for the rest, and the first two referees each case drew
// vote to overturn it (as referees recomputing an honest worker's
// refused rounds would). It returns what each machine was paid in the
// end, what the referees were paid in all, and how many blocks each
// appeal took from its transaction to its verdict.
func appealOnLedger(pays []ledger.Payment, owed uint64) (paid []uint64, refereesPaid uint64, blocks int) {
	c, _, job := settledChain(pays)
	var appeals [][]byte
	var appellants []string
	for i := range workers {
		if got := c.app.Snapshot().Accounts[payee(i)]; got != nil && got.Balance < owed {
			appeals = append(appeals, c.tx(key(byte(10+i)), ledger.TypeAppeal, &ledger.Appeal{Job: job, Claim: owed - got.Balance,
				Evidence: "bafy-round-deltas", Reason: "rounds refused"}))
			appellants = append(appellants, payee(i))
		}
	}
	start := c.height
	c.block(appeals...)
	var votes [][]byte
	for _, a := range appellants {
		e := c.app.Snapshot().Escrows[job]
		for _, k := range e.Cases {
			if k.Appellant != a {
				continue
			}
			for _, r := range k.Referees[:2] {
				votes = append(votes, c.tx(refereeKey(r), ledger.TypeVerdict, &ledger.Verdict{Job: job, Appellant: a, Overturn: true}))
			}
		}
	}
	c.block(votes...)
	blocks = int(c.height - start)
	c.now = c.now.Add(time.Duration(c.app.Snapshot().Params.DisputeWindow) * time.Second)
	c.block()
	st := c.app.Snapshot()
	for i := range workers {
		var bal uint64
		if a, ok := st.Accounts[payee(i)]; ok {
			bal = a.Balance
		}
		paid = append(paid, bal)
	}
	for i := range 4 {
		if a, ok := st.Accounts[string(key(byte(90+i)).Address())]; ok {
			refereesPaid += a.Balance
		}
	}
	return paid, refereesPaid, blocks
}

func refereeKey(addr string) *identity.Key {
	for i := range 4 {
		if k := key(byte(90 + i)); string(k.Address()) == addr {
			return k
		}
	}
	log.Fatalf("no validator %s", addr)
	return nil
}

func (c *chain) tx(k *identity.Key, typ string, msg any) []byte {
	b, err := ledger.NewTx(k, chainID, typ, c.nonces[k.Address()], msg)
	if err != nil {
		log.Fatal(err)
	}
	c.nonces[k.Address()]++
	return b
}

// block runs one block a second after the last; every transaction must pass.
func (c *chain) block(txs ...[]byte) {
	c.height++
	c.now = c.now.Add(time.Second)
	resp, err := c.app.FinalizeBlock(context.Background(), &abci.RequestFinalizeBlock{Txs: txs, Height: c.height, Time: c.now})
	if err != nil {
		log.Fatal(err)
	}
	for i, r := range resp.TxResults {
		if r.Code != 0 {
			log.Fatalf("block %d tx %d: code %d: %s", c.height, i, r.Code, r.Log)
		}
	}
	if _, err := c.app.Commit(context.Background(), &abci.RequestCommit{}); err != nil {
		log.Fatal(err)
	}
}

// heldCost is what a held run whose holder books accounts costs its
// payer on the ledger: paid to the machines, and burned.
func heldCost(accounts func(rank int) jobs.HolderAccount) uint64 {
	run := heldRun()
	acc := map[string]jobs.HolderAccount{}
	for i := range workers {
		acc[strconv.Itoa(i)] = accounts(i)
	}
	jobs.ApplyAccounts(run, acc)
	pays, _ := jobs.PayPlan(run, nil, end())
	_, _, _, spent := settleSpent(pays, nil)
	return spent
}

// settledChain is a new chain on which the payer (key 2) opened an escrow
// for the 3 workers and settled it with pays.
func settledChain(pays []ledger.Payment) (*chain, *identity.Key, string) {
	c := newChain()
	payer := key(2)
	job := jobID()
	var payees []string
	for i := range workers {
		payees = append(payees, payee(i))
	}
	c.block(c.tx(payer, ledger.TypeOpenEscrow, &ledger.OpenEscrow{Job: job, Amount: workers * 2 * perHour, Expiry: c.now.Unix() + 7200, Payees: payees}))
	c.block(c.tx(payer, ledger.TypeSettle, &ledger.Settle{Job: job, Payments: pays}))
	return c, payer, job
}

// settleOnLedger opens an escrow for the 3 workers, settles it with pays,
// lets each machine whose receipt covers more lodge it, and each one
// marked failed that was owed a receipt dispute the mark (as a lender's
// node does when its worker did not fail), then runs the window out. It
// returns what each machine was paid and whether it was marked and
// disputed.
func settleOnLedger(pays []ledger.Payment, receipts map[string]uint64) (paid []uint64, marked, disputed []bool) {
	paid, marked, disputed, _ = settleSpent(pays, receipts)
	return paid, marked, disputed
}

// settleSpent is settleOnLedger, and what the payer spent: paid to the
// machines, and burned (withheld for refused rounds).
func settleSpent(pays []ledger.Payment, receipts map[string]uint64) (paid []uint64, marked, disputed []bool, spent uint64) {
	c, payer, job := settledChain(pays)
	var lodge [][]byte
	for i := range workers {
		r, ok := receipts[payee(i)]
		if !ok {
			continue
		}
		signed := ledger.SignReceipt(payer, chainID, ledger.Receipt{Job: job, Payee: payee(i), Amount: r, Seq: 9})
		lodge = append(lodge, c.tx(key(byte(10+i)), ledger.TypeClaim, &ledger.Claim{Receipt: signed}),
			c.tx(key(byte(10+i)), ledger.TypeDispute, &ledger.Dispute{Job: job}))
	}
	c.block(lodge...)
	st := c.app.Snapshot()
	for i := range workers {
		m := false
		d := false
		for _, mk := range st.Escrows[job].Marks {
			if mk.Machine == payee(i) {
				m, d = true, mk.Disputed
			}
		}
		marked, disputed = append(marked, m), append(disputed, d)
	}
	c.now = c.now.Add(time.Duration(st.Params.DisputeWindow) * time.Second)
	c.block()
	st = c.app.Snapshot()
	for i := range workers {
		var bal uint64
		if a, ok := st.Accounts[payee(i)]; ok {
			bal = a.Balance
		}
		paid = append(paid, bal)
		spent += bal
	}
	return paid, marked, disputed, spent + st.Burned
}

// closeTiming settles an escrow and runs blocks a second apart until it
// closes: how long after the settlement.
func closeTiming() time.Duration {
	c := newChain()
	payer := key(2)
	job := jobID()
	c.block(c.tx(payer, ledger.TypeOpenEscrow, &ledger.OpenEscrow{Job: job, Amount: credit, Expiry: c.now.Unix() + 7200, Payees: []string{payee(0)}}))
	c.block(c.tx(payer, ledger.TypeSettle, &ledger.Settle{Job: job, Payments: []ledger.Payment{{Machine: payee(0), Amount: 10_000}}}))
	settled := c.now
	for {
		if _, open := c.app.Snapshot().Escrows[job]; !open {
			return c.now.Sub(settled)
		}
		c.block()
	}
}
