package lender

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// TestLastTTYInputSeesTyping: typing at a new pseudo-terminal (the kernel
// moves a tty's access time on input, in steps of 8 s) shows as input.
func TestLastTTYInputSeesTyping(t *testing.T) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminals here: %v", err)
	}
	defer m.Close()
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatal(e)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatal(e)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer slave.Close()
	before := LastTTYInput()
	if before.IsZero() {
		t.Fatal("a pseudo-terminal is open, and no terminal has an access time")
	}
	time.Sleep(9 * time.Second)
	if _, err := m.Write([]byte("ls\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if _, err := slave.Read(buf); err != nil {
		t.Fatal(err)
	}
	if after := LastTTYInput(); !after.After(before) {
		t.Fatalf("typed at /dev/pts/%d: last input %s, was %s", n, after, before)
	}
}
