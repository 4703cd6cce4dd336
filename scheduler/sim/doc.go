// Package sim replays a job trace over a machine set under a placement
// policy and measures what each policy does to the same work: slowdown,
// completion time, utilization, peak load, rejections and the credits each
// machine earns.
//
// Two machine models:
//
//   - Shared: the workstation cluster of Amir, Awerbuch, Barak, Borgstrom
//     and Keren (IEEE TPDS 11(7), 2000). Every job is placed on arrival
//     and nothing waits; a machine shares its CPU equally among the
//     processes on it, and one whose memory is over-committed thrashes:
//     each process's share is divided by Scenario.Thrash (10).
//   - Reserved: how DeepMarket lends. A worker holds the cores, memory and
//     GPUs it asked for; a job that fits nowhere waits, first come first
//     served, until one does. Workers of a job step in lock-step and
//     exchange CommBytes per step (ring all-reduce) over the links between
//     their sites, so the network between machines matters.
//
// Policies: the marginal-cost scheduler (scheduler.Place, and the same
// through a scheduler.Index as a node runs it at scale), the baselines of
// package scheduler, a Mosix-like least-loaded balancer that migrates
// running processes, and a decentralized mode in which K marginal-cost
// schedulers each see an overlapping subset of the machines and the bidder
// takes the cheapest of their quotes.
//
// The package is deterministic: a scenario, policy and seed give the same
// result every run. Scenarios (Workstations, Edge) document every
// parameter they had to choose.
package sim
