// Package testutil holds what several packages' tests share. Only tests
// import it.
package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

var (
	portsMu     sync.Mutex
	portsHanded = map[int]bool{}
)

// FreePort returns a loopback TCP port free now and not handed out
// before in this process. It is below the kernel's ephemeral range (32768
// up), where outgoing connections could take it between this check and
// the caller's bind.
func FreePort(t testing.TB) string {
	t.Helper()
	for range 1000 {
		p := 21000 + rand.IntN(11000)
		portsMu.Lock()
		taken := portsHanded[p]
		portsHanded[p] = true
		portsMu.Unlock()
		if taken {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		ln.Close()
		return strconv.Itoa(p)
	}
	t.Fatal("no free port")
	return ""
}

// FreePortRange returns the first of n consecutive loopback TCP ports,
// all free now and not handed out before in this process, below the
// ephemeral range.
func FreePortRange(t testing.TB, n int) int {
	t.Helper()
	for range 1000 {
		base := 21000 + rand.IntN(11000-n)
		portsMu.Lock()
		taken := false
		for p := base; p < base+n; p++ {
			taken = taken || portsHanded[p]
		}
		if !taken {
			for p := base; p < base+n; p++ {
				portsHanded[p] = true
			}
		}
		portsMu.Unlock()
		if taken {
			continue
		}
		free := true
		for p := base; p < base+n && free; p++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				free = false
				continue
			}
			ln.Close()
		}
		if free {
			return base
		}
	}
	t.Fatalf("no %d free ports in a row", n)
	return 0
}
