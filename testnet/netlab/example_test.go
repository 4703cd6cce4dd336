package netlab_test

import (
	"context"
	"fmt"
	"log"

	"github.com/deepmarket/deepmarket/testnet/netlab"
)

// Two sites of three nodes in two cloud regions: start a program on a node,
// cut the second site off, heal it.
func Example() {
	if err := netlab.Available(); err != nil {
		log.Fatal(err) // e.g. "network profiles need root: run with sudo"
	}
	p, err := netlab.ProfileByName("multi-dc")
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	lab, err := netlab.Create(ctx, netlab.Config{Tag: "dm3f2a", Sites: []int{3, 3}, Profile: p})
	if err != nil {
		log.Fatal(err)
	}
	defer lab.Close()

	// A node listens on its own address; the others, and the host,
	// reach it there.
	addr := fmt.Sprintf("%s:8080", lab.IP(1, 0))
	srv := lab.Cmd(ctx, 1, 0, "python3", "-m", "http.server", "--bind", lab.IP(1, 0).String(), "8080")
	if err := srv.Start(); err != nil {
		log.Fatal(err)
	}
	defer srv.Wait()
	defer srv.Process.Kill()
	fmt.Println("serving at", addr, "RTT from site 0:", p.RTT(0, 1))

	if err := lab.Partition(1); err != nil { // site 1 reaches only itself and the host
		log.Fatal(err)
	}
	if err := lab.Heal(1); err != nil {
		log.Fatal(err)
	}
}
