// Package jobs holds what a job is, apart from running it: the spec a
// researcher writes (TOML, validated with errors that name the key), and
// the job's life on its submitting node: its states and what each may
// become, its workers' states, and the decisions along the way (what a
// poll of the workers means, how a run ended, what each machine is paid)
// as pure functions.
// It does no I/O beyond reading the spec file and the directories it
// names; the node runs jobs.
package jobs
