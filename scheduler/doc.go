// Package scheduler is DeepMarket's pricing and placement: the
// cost-benefit framework of Amir, Awerbuch and Borgstrom ("A Cost-Benefit
// Framework for Online Management of a Metacomputing System"), run by every
// node over the machines whose offers it holds.
//
// A machine's resource at load l (allocated / lent) costs base * n^l per
// unit-hour, n being the number of machines in the view; a job's workers go,
// one by one, where the marginal cost of adding them is least, and a job is
// admitted only if its benefit covers that cost ("miserly" admission).
// Baseline policies (round robin, random, first fit, and Kubernetes'
// least-requested and balanced-resource scoring) place jobs on the same view
// for comparison.
//
// Place and Quote look at every machine for every worker. An Index, built
// once from a View, gives the same placements and prices in time that grows
// far slower than the view (a branch-and-bound search over the machines'
// next-unit prices), for a node that prices many bids against one view; it
// is kept current with Update as machines' offers and allocations change.
//
// The package is pure: no I/O, no goroutines, no clock or randomness it was
// not handed. Time is an argument; the same inputs give the same outputs. An
// Index holds its own copy of the view and changes only through Update, so
// its answers are a function of the view, the updates and the arguments too.
// It must not import p2p, ledger, storage or node: the node converts offers
// into a View.
package scheduler
