// Package ledger owns DeepMarket's credits: a CometBFT ABCI application
// (the state machine every node replicates), its transactions and their
// signatures, the genesis of a network, a client that signs and broadcasts
// transactions, and the audit that replays a chain from genesis.
//
// State holds integers only (1 credit = 1,000,000 micro-credits): accounts
// {balance, nonce}, issuers {quota left}, members, machine links {owner,
// height of the last change, former owner}, escrows, machine records,
// payer records, the validator set and the votes on it.
//
// # No free writes: members and limits
//
// Every write costs its signer a standing an issuer gave it. Members are
// the accounts an issuer admitted: genesis' balance holders, issuers,
// listed members and validators' accounts; each Grant's recipient; each
// account an Admit {Account} names (an issuer admitting without moving
// credits; Admit {Account, Revoke} ends a membership the same issuer gave;
// genesis members stay). Only members sign transactions, with two
// exceptions that carry their own standing: a Claim or a Dispute by a
// payee of an open escrow (the member who opened the escrow vouched for
// it) and a validator's vote. Anyone else is refused with CodeNotMember: by CheckTx
// before the mempool, before its signature is even checked, and by
// FinalizeBlock if a proposer includes it anyway. A fresh key with no
// credits writes nothing.
//
// Members' writes are bounded by the genesis Params (defaults in
// DefaultParams): at most MaxMachinesPerOwner (256) machines linked to an
// account (a machine it unlinked counting for ConsentBlocks, 3,600 blocks,
// while its entry is kept), MaxOpenEscrows (1,024) escrows open per payer,
// an escrow locks at least MinPayment (0.01 credit) per payee it names and
// pays registered machines only, a Transfer that opens an account moves at
// least MinNewAccount (1 credit), and one signer has at most
// MaxTxsPerBlock (1,000) transactions in a block (those beyond are
// refused, in block order) and pending in a node's mempool at once. So
// every entry a member writes is bounded by its limits or by the credits
// it locks, and goes when no longer needed: a member with 1 credit holds
// at most 256 link entries and about 25 KB of escrows (stake_test.go
// measures both).
//
// # Machines
//
// A machine is registered when it is a member itself (by default a node's
// key is its account) or it is linked to a member. A LinkMachine carries
// the machine's LinkConsent, which signs the chain ID, the machine's key,
// the new owner, the machine's current owner (itself when unlinked), a
// committed height at or after the link's last change, and an expiry
// (block time, at most an hour ahead). A link change records its block's
// height, past every consent given before it, and a consent serves only
// within ConsentBlocks of the height it names: so a consent serves for one
// change, and an old owner cannot replay it. The new owner signs the
// LinkMachine; unlinking is a link back to the machine itself, signed by
// the owner or the machine, with the machine's consent too. An unlink
// leaves the machine's entry, counted against the owner it left, for
// ConsentBlocks: as long as a consent given before it could be used. The
// first block past that removes it (before its transactions; such a block
// writes even if it has none), with the machine's record unless it is a
// member. App reads (MachineOwner, IsMember, BalanceOf, Height) are O(1)
// for the node's gossip validation; the /registration/ADDR query gives
// what a consent must name.
//
// A machine's record (jobs completed and failed, credits earned) counts
// only work it was paid for by someone else: a settlement's payment
// counts when it pays at least MinPayment, from a payer that is neither
// the machine nor its owner, to a registered machine. Naming a machine in
// an escrow needs no consent from it, so a payment of nothing counts
// nothing: marking a machine failed costs MinPayment, paid to it, and a
// member cannot rate its own machines. A mark counts only when the
// escrow closes, and only if the machine did not dispute it (below).
//
// # Settlement: receipts bind, marks need a cause
//
// The payer signs each payee receipts as the job runs (Receipt: the
// cumulative amount it has earned, a sequence number). A Settle, signed by
// the payer alone, pays what it names at once, but does not close the
// escrow: it opens a dispute window of Params.DisputeWindow (600 s by
// default). In the window a payee lodges its latest receipt (a Claim) and
// is paid what it covers beyond what the payee was paid, from what the
// escrow still holds; a payee the settlement marked failed may Dispute
// the mark, and a disputed mark does not count in its record. The first
// block at or after the window's end (Escrow.Closes) closes the escrow
// before its transactions: the rest goes back to the payer, the payees'
// records count (completed, or failed for an undisputed mark) and so does
// the payer's. So a payer that settles for less than it signed pays what
// it signed all the same, no later than the window plus one block after
// its settlement; a payee gets no more than the payer signed. A settled
// escrow counts against its payer's MaxOpenEscrows until it closes.
//
// A payee may also Appeal a settlement in the window, with a bond its
// owner locks: validators the block's hash draws, none a party to the
// case, vote a Verdict, and the majority decides whether the payer's
// refusals stand (appeal.go).
//
// Payers have records too (PayerRecord, query /payer/ADDR): escrows
// closed, what their settlements paid against what their payees were paid
// in all (receipts lodged and claims after expiry included), the marks
// they gave and how many were disputed. Lenders read it in quotes.
//
// # Store and app hash
//
// The state lives in an IAVL tree (github.com/cosmos/iavl, store.go): each
// entry is a leaf, the root hash is the app hash. A block writes only the
// leaves it changed, so its cost grows with its changes (and the log of
// the state's size), not with the state; an empty block writes nothing and
// leaves the hash as it was, unless an unlinked machine's entry goes in it. Commit saves the tree as version = height in
// one atomic write (goleveldb, in the node's ledger directory); the last
// 100 versions are kept. The state is also kept in memory, for reads,
// loaded from the tree's leaves when the app opens. A node killed at any
// moment restarts at its last saved version and CometBFT's handshake
// replays the rest. A ledger directory written by the earlier release
// (badger, app version 1) is refused with ErrOldStateFormat and a message
// saying what to do: the app hash changed, so an old chain cannot be
// continued, and a network upgrades together onto a new genesis.
//
// Each map of entries in the State (accounts, issuers, members, links,
// escrows, machine records, validators, pending votes) has one entry in
// the table collections (collections.go): its key prefix in the tree, and
// how its entries are made, encoded, decoded, counted in the books,
// checked and copied. NewState, the store (writing, loading, verifying)
// and the full check iterate that table, in its fixed order; the hash
// does not depend on the order, since the tree sorts its leaves.
//
// Invariants are kept incrementally: after each block, each changed leaf's
// old value is read from the tree and the books (balances and escrowed
// summed as big integers, counts of accounts, escrows, members and links)
// move by what it changed; supply = balances + escrowed, every changed
// escrow and new address, and the validator set if it changed are checked
// in O(changes). A broken invariant halts the node. CheckInvariants and
// App.Verify check everything in O(n); the audit and the tests' block
// harness run them after every block.
//
// # Transactions and their outcomes
//
// Each kind of transaction has one entry in the table txKinds (kinds.go):
// the type its envelope names, the message its body decodes into, its
// check->effect handler (exec.go), which CheckTx and FinalizeBlock share
// (the checks refuse with a typed code; the effect cannot fail), what it
// spends from the signer's balance (CheckTx counts that beside the spends
// pending in the mempool) and who besides members may sign it. Decoding,
// standing, execution and events go through that table; NewTx refuses a
// message that is not its type's. BuildSend builds a transaction from
// plain values (a send as a person or the node's API asks for it),
// refusing a value it cannot use with a *FieldError that names it;
// EncodeConsent and DecodeConsent are a link consent as the token a
// machine hands its owner.
//
// A transaction is accepted only in its canonical encoding (envelope and
// body, wire.Unmarshal), so it has one form and one hash, TxHash of its
// bytes. The Client signs a transaction once and every retry sends those
// bytes. It reports *Error (rejected) only when the ledger refused the
// transaction, in CheckTx or in its block; when it cannot tell, it returns
// an error satisfying errors.Is(err, ErrUnknownOutcome) that names the
// hash, and TxStatus tells later: committed, failed, refused, pending,
// dropped (never committed, and its nonce is used: it never can be) or
// unknown. With an Outbox the client keeps its unresolved transactions
// across restarts and sends them again (Run).
//
// # Audit
//
// The audit is a light client: from a genesis it is given it tracks the
// validator set, verifies that more than 2/3 of it signed every block's
// commit, replays every block and checks every app hash and invariant.
// From the genesis the node serves it proves only that the chain agrees
// with a genesis the node chose: such an audit names what it trusted and
// is not OK unless told to trust it (AuditOptions.TrustServedGenesis).
//
// # Validators
//
// The validator set starts as genesis lists it (a validator's key is its
// node key, which is also its account key) and changes only by the votes
// of the validators themselves; no key is above the others. A
// ValidatorVote {PubKey, Power, Name}, signed by a current validator with
// its account's next nonce, votes that the ed25519 key PubKey have Power:
// more than 0 adds it or changes its power (at most MaxValidatorPower), 0
// removes it. Name names a new validator; once a key has a name, votes
// naming it otherwise are refused.
//
// A change carries when the validators voting for it hold more than 2/3 of
// the set's total power (3*votes > 2*total, integers). It is made in the
// block that carries it: the set in the state changes, every pending vote
// on that key ends, and FinalizeBlock returns the change in
// ValidatorUpdates, which CometBFT applies from height H+2.
//
// Each validator has at most one pending vote per key: voting again with
// another power moves the vote, voting again with the same power is
// refused (CodeAlreadyVoted, so the nonce is not spent), and voting for
// the power a key already has withdraws the vote. At most MaxPendingVotes
// are pending per validator. Votes are counted at the voters' current
// power every time: when a change carries, the votes of a validator it
// removed are dropped, and every other pending change is counted again
// against the new set, in key order, until none carries.
//
// A change that would leave the set empty, or grow it past MaxValidators,
// is refused when voted and never carries. The rule does not guard
// liveness: a new validator whose node is not running and synced, and
// whose power with the others' missing ones reaches 1/3, halts the chain
// until it runs. Vote a university in once its node has caught up.
//
// ledger must not import p2p, scheduler, storage or node. It may import
// identity (addresses) and wire (deterministic encoding).
package ledger
