// Package sandbox runs one untrusted job process (a TensorFlow worker of a
// borrower's job) on a lender's machine with limits that the kernel enforces,
// so that the node never has to trust the job to behave.
//
// # What it enforces
//
// Every job runs in its own cgroup, <cgroup root>/deepmarket/<name>, which it
// joins before it executes any of its own code:
//
//   - CPU: pinned to Limits.CPUs through cpuset, and throttled to
//     len(CPUs) cores (or Limits.Cores) through the CFS quota
//     (v2 cpu.max, v1 cpu.cfs_quota_us).
//   - Memory: a hard limit (v2 memory.max, v1 memory.limit_in_bytes) with
//     swap disabled where the kernel accounts it (v2 memory.swap.max=0, v1
//     memory.memsw.limit_in_bytes; otherwise v1 memory.swappiness=0). An OOM
//     inside the cgroup kills the job, never the node; v2 sets
//     memory.oom.group so the whole job dies together. The job's
//     oom_score_adj is raised to 1000 so that under global memory pressure it
//     also dies before the node.
//   - Processes: pids.max (default 512) stops fork bombs.
//   - Disk: RLIMIT_FSIZE bounds any single file to Limits.DiskBytes, and a
//     watchdog measures the job dir every 2 s and kills the job when the dir
//     grows past the bound.
//   - Identity: when the node runs as root the job runs as the unprivileged
//     user deepmarket-job (created with useradd if missing, else nobody),
//     with no supplementary groups and no_new_privs set, so setuid binaries
//     do not help it and files it cannot read by mode (a 0700 /root, another
//     user's 0700 home) stay closed. Its environment is built from scratch:
//     nothing of the node's (API tokens included) leaks in.
//   - Filesystem view: when bubblewrap (bwrap) works here, the job gets a
//     private mount, pid, ipc and uts namespace in which only /usr, /lib*,
//     /bin, /sbin, /etc and /sys (read-only), the ReadOnly paths, the job dir
//     (read-write) and a /tmp backed by <dir>/tmp exist; every home under
//     /home, /root and the Hide paths are absent. Without bwrap, hiding and
//     "writes only in its dir" rest on file modes alone: the job can then read
//     anything world-readable and write world-writable places such as /tmp
//     and /dev/shm (the latter counts against its memory limit).
//
// The node learns which of these work through Probe and must refuse to lend
// when Capabilities.Essential reports an error (no memory or pids limit).
//
// # Entering the cgroup
//
// Start re-executes the node's own binary as a trampoline (main must call
// MaybeRunTrampoline first). On cgroup v2 the kernel places the trampoline in
// the job cgroup as it is cloned (CLONE_INTO_CGROUP); on v1 the trampoline,
// still root, writes its own pid into each hierarchy's cgroup.procs. Only then
// does it set rlimits, drop to the job user, set no_new_privs and exec the job
// (or bwrap, which execs the job). Start returns only after that exec, so a
// Stop that follows Start always finds the job inside its cgroup.
//
// Stopping signals every process in the cgroup (freezing it first, so that
// nothing forks in between; v2 kills with cgroup.kill), which catches
// processes that double-forked away from the job's process tree. Under bwrap
// the SIGTERM skips bwrap's own two processes, whose death would end the job
// before its grace period. When the
// job's main process exits, whatever it left behind is killed and the cgroup
// is removed.
//
// A job outlives a node killed with SIGKILL: it runs on in its cgroup,
// reparented to init. Reap kills such a job by its Spec.Name and removes its
// cgroup; the node must keep its own record of which names are its own,
// since other nodes on the machine share the deepmarket parent.
//
// # What it does not do
//
// It does not restrict the network (another package does; the job shares
// the node's network namespace). Per-GPU isolation is advisory: Limits.GPUs
// sets CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES; only "no GPU at all"
// is enforced, and only under bwrap (no /dev/nvidia* nodes are mapped in).
// Concurrent jobs share the job user, so without bwrap they can signal each
// other's processes; give each job its own Spec.UID to prevent that.
//
// sandbox imports only the standard library and golang.org/x/sys; it must not
// import other DeepMarket packages, so that the node can use it anywhere.
package sandbox
