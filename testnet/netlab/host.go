package netlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

var errNotRoot = fmt.Errorf("%w: network profiles need root: run with sudo", ErrUnavailable)

// hostLink is the name of the lab's one interface in the root namespace.
func hostLink(tag string) string { return tag + "h" }

// labNamespaces lists the namespaces named after tag, nodes and NAT routers
// before the core.
func labNamespaces(tag string) ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(tag) + `-(core|s[0-9]+n[0-9]+|r[0-9]+)$`)
	var names []string
	for _, e := range entries {
		if re.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	core := tag + "-core"
	sort.Slice(names, func(i, j int) bool {
		if (names[i] == core) != (names[j] == core) {
			return names[j] == core
		}
		return names[i] < names[j]
	})
	return names, nil
}

// checkLeftovers fails when something named after tag exists: a lab that
// runs, or one a crash left behind.
func checkLeftovers(tag string) error {
	names, err := labNamespaces(tag)
	if err != nil {
		return fmt.Errorf("netlab: list network namespaces: %w", err)
	}
	if _, err := net.InterfaceByName(hostLink(tag)); err == nil {
		names = append(names, "interface "+hostLink(tag))
	}
	if len(names) > 0 {
		return fmt.Errorf("netlab: tag %s is in use (%s): pick another tag, or remove a crashed run's leftovers with netlab.Cleanup(%q)",
			tag, strings.Join(names, ", "), tag)
	}
	return nil
}

// removeTagged removes, by name, everything a lab with this tag makes. What
// is already gone is not an error.
func removeTagged(ctx context.Context, t tools, tag string) error {
	var errs []error
	// Deleting the host end deletes the core end and the route via it.
	// It goes first: the kernel tears a namespace down in the background,
	// and would leave the interface in the root namespace a while.
	if err := run(ctx, t.ip, "link", "del", "dev", hostLink(tag)); err != nil && !notFound(err) {
		errs = append(errs, err)
	}
	names, err := labNamespaces(tag)
	if err != nil {
		errs = append(errs, err)
	}
	for _, ns := range names {
		if err := run(ctx, t.ip, "netns", "del", ns); err != nil && !notFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Cleanup removes what a lab with this tag left behind, say after its
// process crashed: its namespaces and its interface in the root namespace
// (with the route via it). Removing nothing is not an error.
func Cleanup(tag string) error {
	if !tagPattern.MatchString(tag) {
		return fmt.Errorf("netlab: cleanup: bad tag %q", tag)
	}
	t, err := findTools()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	if err := removeTagged(ctx, t, tag); err != nil {
		return fmt.Errorf("netlab: cleanup %s: %w", tag, err)
	}
	return nil
}

var probes atomic.Int64

// Available says whether this machine can run a lab: nil when it can, else
// an error that wraps ErrUnavailable and says what is missing. It runs as
// root, finds iproute2, creates a namespace and checks that links can be
// shaped, with netem or through TAP devices.
func Available() error {
	if os.Geteuid() != 0 {
		return errNotRoot
	}
	t, err := findTools()
	if err != nil {
		return err
	}
	return inProbeNS(t, func(ctx context.Context, ns string) error {
		netemErr := netemWorks(ctx, t, ns)
		if netemErr == nil {
			return nil
		}
		if tapErr := tapWorks(ns); tapErr != nil {
			return fmt.Errorf("%w: cannot shape links: no netem (%v) and no TAP devices (%v): load sch_netem (modprobe sch_netem) or tun",
				ErrUnavailable, netemErr, tapErr)
		}
		return nil
	})
}

// inProbeNS runs f with a namespace of its own, removed after.
func inProbeNS(t tools, f func(ctx context.Context, ns string) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	ns := "netlabprobe" + strconv.Itoa(os.Getpid()) + "x" + strconv.FormatInt(probes.Add(1), 10)
	if err := run(ctx, t.ip, "netns", "add", ns); err != nil {
		return fmt.Errorf("%w: cannot create a network namespace: %v", ErrUnavailable, err)
	}
	defer run(context.Background(), t.ip, "netns", "del", ns)
	return f(ctx, ns)
}

// tapWorks checks that a TAP device can be made in namespace ns.
func tapWorks(ns string) error {
	f, err := openTAP(ns, "tapprobe")
	if err != nil {
		return err
	}
	return f.Close()
}

// lockHost takes the host-wide lock that Create holds while it picks an
// octet and adds its route, so that concurrent labs don't pick the same.
func lockHost(ctx context.Context) (unlock func(), err error) {
	path := "/run/netlab.lock"
	if _, err := os.Stat("/run"); err != nil {
		path = os.TempDir() + "/netlab.lock"
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("netlab: lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("netlab: lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("netlab: wait for %s: %w", path, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// chooseOctet returns want when 10.want.0.0/16 overlaps no route of the
// root namespace, or, for want 0, the first such octet of 77 to 99.
func chooseOctet(ctx context.Context, t tools, want int) (int, error) {
	routes, err := rootRoutes(ctx, t)
	if err != nil {
		return 0, err
	}
	clash := func(b int) *net.IPNet {
		lab := &net.IPNet{IP: net.IPv4(10, byte(b), 0, 0).To4(), Mask: net.CIDRMask(16, 32)}
		for _, r := range routes {
			if lab.Contains(r.IP) || r.Contains(lab.IP) {
				return r
			}
		}
		return nil
	}
	if want != 0 {
		if r := clash(want); r != nil {
			return 0, fmt.Errorf("netlab: Config.Octet %d: 10.%d.0.0/16 overlaps this host's route to %s (another lab?): choose another octet, or 0 to pick a free one", want, want, r)
		}
		return want, nil
	}
	for b := firstOctet; b <= lastOctet; b++ {
		if clash(b) == nil {
			return b, nil
		}
	}
	return 0, fmt.Errorf("netlab: every 10.B.0.0/16 for B in %d..%d overlaps a route of this host: set Config.Octet", firstOctet, lastOctet)
}

// rootRoutes lists the root namespace's IPv4 routes, in every table, but
// the default ones.
func rootRoutes(ctx context.Context, t tools) ([]*net.IPNet, error) {
	out, err := output(ctx, t.ip, "-j", "-4", "route", "show", "table", "all")
	if err != nil {
		return nil, fmt.Errorf("netlab: list routes: %w", err)
	}
	var rs []struct {
		Dst string `json:"dst"`
	}
	if err := json.Unmarshal(out, &rs); err != nil {
		return nil, fmt.Errorf("netlab: list routes: %w", err)
	}
	var nets []*net.IPNet
	for _, r := range rs {
		if r.Dst == "default" || r.Dst == "" {
			continue
		}
		if !strings.Contains(r.Dst, "/") {
			r.Dst += "/32"
		}
		_, n, err := net.ParseCIDR(r.Dst)
		if err != nil {
			continue // not IPv4 (multicast and the like are skipped too)
		}
		if ones, _ := n.Mask.Size(); ones == 0 {
			continue
		}
		nets = append(nets, n)
	}
	return nets, nil
}
