// Package testutil holds what several packages' tests share. Only tests
// import it.
package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var (
	portsMu     sync.Mutex
	portsHanded = map[int]bool{}
)

// portSpan is the part of the ports below the ephemeral range this test
// binary hands out: make test runs packages' tests in parallel processes,
// and a port one process found free and handed to a node could be bound
// by another's node before the first binds it (CI: a node test's ledger
// found its port taken). The packages that start nodes each get a span of
// their own; the rest share one.
func portSpan() (lo, n int) {
	switch strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe") {
	case "node.test":
		return 21000, 4000
	case "testnet.test":
		return 25000, 3000
	case "deepmarket.test":
		return 28000, 2000
	}
	return 30000, 2000
}

// FreePort returns a loopback TCP port free now and not handed out
// before in this process. It is below the kernel's ephemeral range (32768
// up), where outgoing connections could take it between this check and
// the caller's bind.
func FreePort(t testing.TB) string {
	t.Helper()
	lo, span := portSpan()
	for range 1000 {
		p := lo + rand.IntN(span)
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
	lo, span := portSpan()
	for range 1000 {
		base := lo + rand.IntN(span-n)
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
