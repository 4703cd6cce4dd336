package sandbox

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The seccomp filter is a deny list: a training job needs most of Linux
// (threads, files, sockets, shared memory, NUMA hints), and an allow list
// that TensorFlow, NumPy's BLAS and CUDA all live with would break with
// each of their releases. What it denies is what a job has no business
// with and what lets a process out of its sandbox or into the kernel's
// attack surface: new namespaces, mounts, tracing other processes, keys,
// BPF, perf, modules, kexec, reboot, swap, raw and packet sockets,
// userfaultfd, io_uring, fallocate, and the other ABIs of the CPU, through
// which a deny list could be bypassed.

// deniedSyscalls fail with EPERM.
var deniedSyscalls = []string{
	// Namespaces and mounts: a sandbox inside the sandbox is a way out.
	"unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr", "mount_setattr",
	// Other processes' memory and descriptors.
	"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "migrate_pages", "move_pages",
	// The kernel's keyring, BPF, perf, modules, kexec and power.
	"keyctl", "add_key", "request_key", "bpf", "perf_event_open",
	"init_module", "finit_module", "delete_module", "create_module", "get_kernel_syms", "query_module",
	"kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
	// The host's clock, accounting, quotas, logs and file handles.
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime", "acct",
	"quotactl", "quotactl_fd", "syslog", "lookup_dcookie", "name_to_handle_at", "open_by_handle_at",
	"nfsservctl", "sysfs", "_sysctl", "ustat", "uselib", "vhangup",
	// I/O ports, old-style VM86, fanotify of the whole system.
	"ioperm", "iopl", "vm86", "vm86old", "fanotify_init",
	// Page-fault handling in user space makes kernel races easy to win.
	"userfaultfd",
}

// enosysSyscalls fail with ENOSYS, which callers take for an old kernel
// and fall back from: clone3 passes its flags in memory, out of the
// filter's sight, so glibc's threads fall back to clone, whose flags it
// checks; io_uring is a large kernel surface no training job needs.
var enosysSyscalls = []string{"clone3", "io_uring_setup", "io_uring_enter", "io_uring_register"}

// eopnotsuppSyscalls fail with EOPNOTSUPP, as on a file system without
// them. fallocate reserves disk in an instant, and with FALLOC_FL_KEEP_SIZE
// past RLIMIT_FSIZE and out of the file's visible size: many files could
// fill the lender's disk between two checks of the disk watchdog. glibc's
// posix_fallocate falls back to writing, which runs at disk speed.
var eopnotsuppSyscalls = []string{"fallocate"}

// cloneNewFlags are the clone flags that make namespaces (CLONE_NEWTIME is
// unshare- and clone3-only: in clone's flags its bit is the exit signal).
const cloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// Terminal ioctls that push input into, or take over, a terminal.
const (
	ioctlTIOCSTI   = 0x5412
	ioctlTIOCLINUX = 0x541C
)

// personalities a job may set, as Docker allows: the plain one, 32-bit
// (PER_LINUX32), UNAME26 and the query 0xffffffff. Others turn off ASLR or
// map page 0.
var personalities = []uint32{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

var (
	seccompOnce  sync.Once
	seccompProgs [][]byte
	seccompErr   error
)

// seccompPrograms are the job's filters as raw cBPF programs (struct
// sock_filter in native byte order), each for one bwrap --add-seccomp-fd.
// The kernel runs every filter on every call and the most restrictive
// answer wins.
func seccompPrograms() ([][]byte, error) {
	seccompOnce.Do(func() {
		filters, err := seccompFilters()
		if err != nil {
			seccompErr = err
			return
		}
		for _, insts := range filters {
			raw, err := bpf.Assemble(insts)
			if err != nil {
				seccompErr = fmt.Errorf("seccomp: assemble: %w", err)
				return
			}
			b := make([]byte, 0, 8*len(raw))
			for _, r := range raw {
				b = binary.NativeEndian.AppendUint16(b, r.Op)
				b = append(b, r.Jt, r.Jf)
				b = binary.NativeEndian.AppendUint32(b, r.K)
			}
			seccompProgs = append(seccompProgs, b)
		}
	})
	return seccompProgs, seccompErr
}

// seccompFilters builds the filters for this CPU's architecture.
//
// They are several because the library assembles a group that checks a
// call's arguments with loads that overwrite the syscall number, then
// compares the next group against the argument: a group with conditions
// must be the last of its policy and name one call. So the unconditional
// denials share one filter that ends with clone's flags, and each other
// call with conditions (socket, ioctl, personality) has a filter of its
// own.
func seccompFilters() ([][]bpf.Instruction, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	known := func(names []string) []string {
		var out []string
		for _, n := range names {
			if _, ok := info.SyscallNames[n]; ok {
				out = append(out, n)
			}
		}
		return out
	}
	denied := known(append(slices.Clone(deniedSyscalls), "socketcall")) // socketcall hides socket's arguments in memory
	eperm := seccomp.ActionErrno
	main := []seccomp.SyscallGroup{
		{Action: eperm, Names: denied},
		{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: known(enosysSyscalls)},
		{Action: seccomp.ActionErrno | seccomp.Action(unix.EOPNOTSUPP), Names: known(eopnotsuppSyscalls)},
		{Action: eperm, NamesWithCondtions: []seccomp.NameWithConditions{{Name: "clone", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.BitsSet, Value: cloneNewFlags}}}}},
	}
	// socket's and ioctl's arguments are 32-bit ints: compared on their
	// low half only, since the kernel ignores the high half, and a filter
	// that looked at it could be fooled by garbage there.
	raw := seccomp.ArgumentConditions{ // type&0xf is SOCK_RAW (3)
		{Argument: 1, Operation: seccomp.BitsSet, Value: 0x1}, {Argument: 1, Operation: seccomp.BitsSet, Value: 0x2}}
	packet := seccomp.ArgumentConditions{ // type&0xf is SOCK_PACKET (10)
		{Argument: 1, Operation: seccomp.BitsSet, Value: 0x2}, {Argument: 1, Operation: seccomp.BitsSet, Value: 0x8}}
	socket := []seccomp.NameWithConditions{
		{Name: "socket", Conditions: low32Equal(0, unix.AF_PACKET)},
		{Name: "socket", Conditions: append(low32Equal(0, unix.AF_INET), raw...)},
		{Name: "socket", Conditions: append(low32Equal(0, unix.AF_INET6), raw...)},
		{Name: "socket", Conditions: append(low32Equal(0, unix.AF_INET), packet...)},
	}
	ioctl := []seccomp.NameWithConditions{
		{Name: "ioctl", Conditions: low32Equal(1, ioctlTIOCSTI)},
		{Name: "ioctl", Conditions: low32Equal(1, ioctlTIOCLINUX)},
	}
	// Any personality but the allowed ones; its argument is compared whole,
	// so garbage in the high half is refused rather than let through.
	var other seccomp.ArgumentConditions
	for _, p := range personalities {
		other = append(other, seccomp.Condition{Argument: 0, Operation: seccomp.NotEqual, Value: uint64(p)})
	}
	personality := []seccomp.NameWithConditions{{Name: "personality", Conditions: other}}

	var filters [][]bpf.Instruction
	for _, groups := range [][]seccomp.SyscallGroup{
		main,
		{{Action: eperm, NamesWithCondtions: socket}},
		{{Action: eperm, NamesWithCondtions: ioctl}},
		{{Action: eperm, NamesWithCondtions: personality}},
	} {
		if g := groups[len(groups)-1]; len(g.NamesWithCondtions) > 0 && len(known([]string{g.NamesWithCondtions[0].Name})) == 0 {
			groups = groups[:len(groups)-1] // not a call on this architecture
		}
		if len(groups) == 0 {
			continue
		}
		policy := seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: groups}
		insts, err := policy.Assemble()
		if err != nil {
			return nil, fmt.Errorf("seccomp: %w", err)
		}
		// The library lets a call from another ABI of this CPU (int 0x80
		// on x86-64) through to the default action, which for a deny list
		// is "allow": such calls kill the process instead.
		guard := []bpf.Instruction{
			bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
			bpf.RetConstant{Val: uint32(seccomp.ActionKillProcess)},
		}
		filters = append(filters, append(guard, insts...))
	}
	return filters, nil
}

// low32Equal matches when the low 32 bits of argument arg are v, whatever
// the high 32 bits hold: each bit of v set, every other low bit clear.
func low32Equal(arg uint32, v uint32) seccomp.ArgumentConditions {
	var c seccomp.ArgumentConditions
	for bit := uint32(1); bit != 0; bit <<= 1 {
		if v&bit != 0 {
			c = append(c, seccomp.Condition{Argument: arg, Operation: seccomp.BitsSet, Value: uint64(bit)})
		}
	}
	if ^v != 0 {
		c = append(c, seccomp.Condition{Argument: arg, Operation: seccomp.BitsNotSet, Value: uint64(^v)})
	}
	return c
}
