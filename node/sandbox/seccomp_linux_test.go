package sandbox

import (
	"encoding/binary"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData lays out struct seccomp_data for x/net/bpf's VM, whose
// loads read 32-bit words big-endian: each word the kernel would load
// natively is written big-endian at the offset the filter loads it from.
func seccompData(nr int, archID uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], uint32(nr))
	binary.BigEndian.PutUint32(b[4:], archID)
	for i, a := range args {
		lo, hi := 16+8*i, 16+8*i+4
		if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 { // big-endian host: high word first
			lo, hi = hi, lo
		}
		binary.BigEndian.PutUint32(b[lo:], uint32(a))
		binary.BigEndian.PutUint32(b[hi:], uint32(a>>32))
	}
	return b
}

// filterSet runs stacked filters as the kernel does: every filter sees
// the call, and the action of highest precedence (the lowest, taken as a
// signed number) wins.
type filterSet []*bpf.VM

func (fs filterSet) Run(in []byte) (int, error) {
	best := int32(seccomp.ActionAllow)
	var ret uint32 = uint32(seccomp.ActionAllow)
	for _, vm := range fs {
		got, err := vm.Run(in)
		if err != nil {
			return 0, err
		}
		if a := int32(uint32(got) & 0xffff0000); a < best {
			best, ret = a, uint32(got)
		}
	}
	return int(ret), nil
}

// TestSeccompFilterDecisions runs the filters in a BPF VM on the calls a
// job makes and the ones it must not, 32-bit arguments with garbage in
// their high half included.
func TestSeccompFilterDecisions(t *testing.T) {
	filters, err := seccompFilters()
	if err != nil {
		t.Fatal(err)
	}
	var vm filterSet
	n := 0
	for _, insts := range filters {
		m, err := bpf.NewVM(insts)
		if err != nil {
			t.Fatal(err)
		}
		vm = append(vm, m)
		n += len(insts)
	}
	info, err := arch.GetInfo("")
	if err != nil {
		t.Fatal(err)
	}
	const garbage = 0xdead_beef_0000_0000
	allow := uint32(seccomp.ActionAllow)
	eperm := uint32(seccomp.ActionErrno) | uint32(unix.EPERM)
	enosys := uint32(seccomp.ActionErrno) | uint32(unix.ENOSYS)
	eopnotsupp := uint32(seccomp.ActionErrno) | uint32(unix.EOPNOTSUPP)
	kill := uint32(seccomp.ActionKillProcess)
	type call struct {
		name string
		args []uint64
		want uint32
	}
	calls := []call{
		{"read", nil, allow}, {"write", nil, allow}, {"openat", nil, allow}, {"mmap", nil, allow}, {"futex", nil, allow},
		{"clone", []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD}, allow},
		{"clone", []uint64{uint64(unix.SIGCHLD)}, allow},
		{"clone", []uint64{unix.CLONE_NEWUSER}, eperm},
		{"clone", []uint64{unix.CLONE_NEWNET | uint64(unix.SIGCHLD)}, eperm},
		{"clone", []uint64{unix.CLONE_NEWNS | garbage}, eperm},
		{"clone3", nil, enosys},
		{"unshare", []uint64{unix.CLONE_NEWUSER}, eperm}, {"unshare", []uint64{0}, eperm}, {"setns", nil, eperm},
		{"mount", nil, eperm}, {"umount2", nil, eperm}, {"pivot_root", nil, eperm}, {"fsopen", nil, eperm}, {"open_tree", nil, eperm},
		{"ptrace", nil, eperm}, {"process_vm_readv", nil, eperm}, {"process_vm_writev", nil, eperm}, {"pidfd_getfd", nil, eperm},
		{"keyctl", nil, eperm}, {"add_key", nil, eperm}, {"request_key", nil, eperm}, {"bpf", nil, eperm}, {"perf_event_open", nil, eperm},
		{"init_module", nil, eperm}, {"finit_module", nil, eperm}, {"delete_module", nil, eperm},
		{"kexec_load", nil, eperm}, {"kexec_file_load", nil, eperm}, {"reboot", nil, eperm}, {"swapon", nil, eperm}, {"swapoff", nil, eperm},
		{"userfaultfd", nil, eperm}, {"io_uring_setup", nil, enosys}, {"fallocate", nil, eopnotsupp},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_STREAM | unix.SOCK_CLOEXEC}, allow},
		{"socket", []uint64{unix.AF_INET6, unix.SOCK_DGRAM | unix.SOCK_NONBLOCK}, allow},
		{"socket", []uint64{unix.AF_UNIX, unix.SOCK_SEQPACKET}, allow},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_RAW | unix.SOCK_CLOEXEC}, allow}, // getifaddrs, getaddrinfo
		{"socket", []uint64{unix.AF_PACKET, unix.SOCK_DGRAM}, eperm},
		{"socket", []uint64{unix.AF_PACKET | garbage, unix.SOCK_DGRAM}, eperm},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_RAW}, eperm},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_RAW | unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC | garbage}, eperm},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_PACKET}, eperm},
		{"ioctl", []uint64{1, unix.TCGETS}, allow},
		{"ioctl", []uint64{0, unix.TIOCSTI}, eperm},
		{"ioctl", []uint64{0, unix.TIOCSTI | garbage}, eperm},
		{"personality", []uint64{0}, allow}, {"personality", []uint64{0xffffffff}, allow},
		{"personality", []uint64{0x0040000 /* ADDR_NO_RANDOMIZE */}, eperm},
		{"personality", []uint64{garbage}, eperm},
		// Calls checked after a group with conditions failed its
		// conditions: the syscall number must still be what is compared.
		{"mount", []uint64{unix.AF_PACKET, unix.TIOCSTI}, eperm},
		{"read", []uint64{unix.CLONE_NEWUSER, unix.SOCK_RAW}, allow},
	}
	for _, c := range calls {
		nr, ok := info.SyscallNames[c.name]
		if !ok {
			continue // not on this architecture
		}
		got, err := vm.Run(seccompData(nr, uint32(info.ID), c.args...))
		if err != nil {
			t.Fatal(err)
		}
		if uint32(got) != c.want {
			t.Errorf("%s(%#x) -> %#x, want %#x", c.name, c.args, uint32(got), c.want)
		}
	}
	// The other ABIs of this CPU, through which a deny list is bypassed.
	if info.ID == arch.X86_64.ID {
		if got, _ := vm.Run(seccompData(arch.X86_64.SyscallNames["unshare"]|arch.X32.SeccompMask, uint32(info.ID))); uint32(got) != enosys {
			t.Errorf("an x32 unshare -> %#x, want ENOSYS", uint32(got))
		}
		if got, _ := vm.Run(seccompData(arch.I386.SyscallNames["unshare"], uint32(arch.I386.ID))); uint32(got) != kill {
			t.Errorf("an i386 unshare (int 0x80) -> %#x, want the process killed", uint32(got))
		}
	}
	progs, err := seccompPrograms()
	size := 0
	for _, p := range progs {
		size += len(p)
	}
	if err != nil || len(progs) != len(filters) || size != 8*n {
		t.Errorf("raw programs: %d, %d bytes, %v; want %d, %d bytes", len(progs), size, err, len(filters), 8*n)
	}
}
