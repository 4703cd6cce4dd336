// Package lender is the lending machine's room of a DeepMarket node: what
// this machine lends and everything that happens on it because it lends.
//
//   - Lender: the owner's lend settings (kept in the node store) and the
//     signed offer announced for them, inside the availability window
//     (OfferSource builds that offer).
//   - Holds: the machine's own book of the capacity schedulers reserved on
//     it; it never grants more than the machine lends.
//   - Admission and Desk: who may offer and bid, checked on this machine's
//     ledger replica (Admission implements p2p.Admission), and the reserve
//     protocol that grants holds only for bids that check out.
//   - Executor: the workers launched on committed holds, each in its own
//     sandbox (package node/sandbox) with its work dir, capped log, uid and
//     network namespace, supervised until its submitter is done; the
//     chief's output, kept only once nothing of the job is left and only
//     within the job's disk bound in apparent size and entries (output.go),
//     in the worker's paid time. Every goroutine it starts (spawn) runs
//     under the context given to Run, which waits for them all: after Run
//     returns, nothing of the executor writes to storage.
//   - claims (claims.go): the executor's one claim service. It keeps the
//     usage receipts the submitters send and claims this machine's due
//     from each escrow its submitter never settled, in the order the
//     escrows expire, under one timer; receipts live in the node store
//     until the ledger answers their claim for good, so a restart resumes
//     them, and a step that fails is logged and tried again.
//   - LinkMeter: this machine's measured links to the machines of the
//     offer book, probed while it lends and announced in its offer.
//   - OwnerLoad: the CPU the machine spends on other work than its jobs,
//     from two CPUSamples (/proc/stat and the jobs' cgroups), the measure
//     of an owner who came back.
//
// What it needs from the node is declared here, where it is used (needs.go,
// LedgerReads, Owners, links.go): a key-value Store, the block store
// (Blocks), the ledger client (Escrows), a Dialer for a run's other
// machines, the offer book's machines (OfferBook), the libp2p host and
// plain settings. The node wires them in node/wire_lender.go.
//
// It speaks its own language: the owner's requests and views (LendRequest,
// LendState, Hold in state.go, which node/api names as aliases), lend
// settings it refuses as a *fault.Error (package node/fault) naming the
// field at fault, and sentinel errors (ErrNoHold, ErrHoldRunning); the
// node maps them to HTTP statuses.
//
// lender may import node/sandbox, node/inventory, node/jobs, node/fault,
// p2p, ledger and storage; it must never import package node, node/api or
// net/http.
package lender
