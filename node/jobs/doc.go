// Package jobs holds what a job is, apart from running it: the spec a
// researcher writes (TOML, validated with errors that name the key), and
// the job's life on its submitting node (states and what each may become).
// It does no I/O beyond reading the spec file and the directories it
// names; the node runs jobs.
package jobs
