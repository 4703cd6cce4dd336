// Package sandbox runs one untrusted job process (a TensorFlow worker of a
// borrower's job) on a lender's machine with limits the kernel enforces,
// so that the node never has to trust the job to behave.
//
// There is one sandbox and no weaker fallback: a machine that cannot
// build all of it (Probe, Capabilities.Essential) must not run jobs, and
// Start fails there.
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
//     grows past the bound; fallocate, which reserves disk in an instant, is
//     refused. Output reaches the node through pipes only, so the job never
//     holds a descriptor of a node's file.
//
// Each job runs as a uid of its own (an IDRange lease; gid the same), which
// no account and no other job shares, with no supplementary groups and
// no_new_privs set. bubblewrap (bwrap, 0.8 or later) then builds its view
// of the machine in namespaces of its own:
//
//   - a user namespace in which it keeps its uid and has no capability,
//     and may create no further one (--disable-userns);
//   - a mount namespace in which only /usr, /bin, /sbin, /lib*, /sys and
//     /etc (read-only, with its secrets such as /etc/shadow hidden), the
//     ReadOnly paths, the job dir (read-write) and a /tmp and /var/tmp
//     backed by <dir>/tmp exist, over a read-only root; /proc, /dev and
//     /dev/shm are its own; /run, /var, the homes, /root and the Hide paths
//     are absent, so no host socket is reachable by path; /sys/fs/cgroup
//     holds the job's own cgroup alone, where a container's would be, so
//     that no other job's cgroup name shows and the job reads its own CPU
//     quota and memory limit there;
//   - pid, ipc and uts namespaces: it sees and signals its own processes
//     only;
//   - a network namespace: Spec.NetNS, or one of its own with only
//     loopback; never the host's, whose loopback ports and abstract unix
//     sockets belong to the host.
//
// A seccomp filter (built with elastic/go-seccomp-bpf, loaded by bwrap just
// before the job's program) refuses namespaces, mounts, ptrace and
// process_vm_*, keys, BPF, perf, kernel modules, kexec, reboot, swap, raw
// and packet sockets, userfaultfd, io_uring, fallocate and the CPU's other
// system call ABIs.
//
// Configuration cannot widen this: CheckReadOnly refuses a ReadOnly path
// that would expose the host (/, /proc, /dev, /run, /tmp, /etc, /root, a
// whole home, the node's own home).
//
// # The node in a job's dir
//
// A job may change its dir at any moment, symbolic links included. The
// sandbox's own walks of it (handing it to the job's uid, measuring it,
// taking it back) go from descriptor to descriptor and never follow a
// link; once Wait returns, no process of the job is left and the dir
// belongs to root again. Callers import and remove such dirs through an
// os.Root.
//
// # Entering the cgroup
//
// Start re-executes the node's own binary as a trampoline (main must call
// MaybeRunTrampoline first). On cgroup v2 the kernel places the trampoline in
// the job cgroup as it is cloned (CLONE_INTO_CGROUP); on v1 the trampoline,
// still root, writes its own pid into each hierarchy's cgroup.procs. Only then
// does it join the network namespace, set rlimits, drop to the job's uid,
// set no_new_privs and exec bwrap, which execs the job. Start returns only
// after that exec, so a Stop that follows Start always finds the job inside
// its cgroup.
//
// Stopping signals every process in the cgroup (freezing it first, so that
// nothing forks in between; v2 kills with cgroup.kill), which catches
// processes that double-forked away from the job's process tree. The
// SIGTERM skips bwrap's own two processes, whose death would end the job
// before its grace period. When the job's main process exits, whatever it
// left behind is killed and the cgroup is removed.
//
// # Suspending a job
//
// Freeze stops every process of a job where it stands, through the cgroup
// freezer (v2 cgroup.freeze, v1 the freezer controller), so that the
// machine's owner gets the CPU back while the job keeps its memory; Thaw
// lets it run on. Freeze waits at most FreezeTimeout for the kernel and
// leaves the job running when that passes. Stop thaws a frozen job, which
// gets its grace period as any other. CPUUsage reads a job's CPU time from
// its cgroup, and JobsCPUUsage that of every job on the machine, ended
// ones included.
//
// A job outlives a node killed with SIGKILL: it runs on in its cgroup,
// reparented to init. Reap kills such a job by its Spec.Name and removes its
// cgroup; the node must keep its own record of which names are its own,
// since other nodes on the machine share the deepmarket parent.
//
// # What it does not do
//
// Per-GPU isolation is advisory: Limits.GPUs sets CUDA_VISIBLE_DEVICES and
// NVIDIA_VISIBLE_DEVICES; only "no GPU at all" is enforced (no /dev/nvidia*
// nodes are mapped in). The disk bound is measured, not reserved: a job may
// overshoot it by what it writes in one watchdog interval.
//
// sandbox imports only the standard library, golang.org/x/sys, x/net/bpf
// and the seccomp assembler; it must not import other DeepMarket packages,
// so that the node can use it anywhere.
package sandbox
