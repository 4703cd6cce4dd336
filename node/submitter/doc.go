// Package submitter is this node's side of its own jobs: it places them
// on the market, launches and supervises their workers on other
// machines, settles what they used, and keeps the quotes schedulers send
// for its bids. Every step of a job is saved in the node store, so a
// restarted node picks its jobs up where they were.
//
// It reaches the rest of the node only through the small interfaces in
// deps.go (Machines, Holders, Offers, Bids, Ledger, Store, Blocks), which
// package node fills in, and speaks its own language: its requests and
// answers (SubmitRequest, JobLogs, ReceivedQuote, SeenBid) are its types,
// which node/api names, and a refused request is a *fault.Error. It must
// not import node or node/api; it may import node/jobs, node/fault, p2p,
// ledger, storage, identity and units.
//
// # One owner per job
//
// A live job belongs to its goroutine, drive (job.go's job): only it
// reads or writes the job. Each save publishes a snapshot of it, which
// is all the API reads (Jobs, Job, Logs; await waits for the next);
// Confirm and Cancel leave their asks in the job's inbox, which drive
// takes from (look) where it waits, and at each step that may end the
// job. What the manager keeps of a live job (its handle) goes when its
// goroutine ends.
//
// # The walk of one job
//
//  1. Submit validates the spec, records the job (submitted) and starts
//     drive, its goroutine; Submit returns once the job is quoted (await).
//  2. drive: resumeAt adds the inputs to storage (addInputs: quoting).
//  3. hold: awaitTurn takes the job's turn in the queue (queue.go: at
//     once when no job waits ahead of it); quote publishes a bid
//     (Bids.Publish) and gathers the quotes arriving in the QuoteBook
//     (QuoteBook.Handle, QuoteBook.Add) until enoughQuotes; choose takes
//     the cheapest, the others' holds are released (releaseHolds). With
//     no placement the job waits in the queue (waiting; wait.go) until
//     the offers show room for it or its backoff runs out, and bids
//     again. quoted records the run; awaitConfirm waits for Confirm
//     (unless submitted with Yes, and at most confirmWait); commit turns
//     the holds into commitments (reserving). A Cancel taken before the
//     launch (gatherQuotes, waitForTurn, awaitConfirm, hold) ends the job
//     with nothing paid.
//  4. escrow opens the run's escrow on the ledger (escrowed).
//  5. launch asks each machine to start its worker (launching).
//  6. supervise polls the workers (poll, pollWorker), sending signed
//     receipts now and then (receipts), until jobs.Survey and jobs.Judge
//     say the run ended (running, then its end; a Cancel ends it too).
//  7. windDown stops the workers (stopAll, awaitCheckpoint), settles
//     (settle, by jobs.PayPlan) and tells the machines to forget the run
//     (finalStop).
//  8. conclude ends the job (succeeded, failed, cancelled), or, a worker
//     lost, re-places it once: drive goes round again from hold, the
//     chief resuming from its checkpoint.
//
// The decisions along the way are pure functions tested by tables: the
// job's (jobs.Survey, jobs.Judge, jobs.AfterRun, jobs.PayPlan) in
// node/jobs, the submitter's own (enoughQuotes, choose; the queue's
// queueOrder, pickBidders, waitLimit) in decide.go. The walk itself is
// tested through the Harness (harness_test.go): a Manager over fakes of
// deps.go's interfaces that answer as scripted and record what it asked.
package submitter
