package sandbox

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// NetNS is a network namespace with nothing in it but a loopback
// interface. A job's workers on one machine share one: TensorFlow's gRPC
// server binds every interface whatever TF_CONFIG says, and runs any graph
// it is sent, so a worker must have no interface but loopback. The node
// reaches into the namespace only to listen and dial on its loopback,
// which is how its tunnels carry the job's cluster traffic.
type NetNS struct {
	f *os.File
}

// NewNetNS makes a fresh network namespace (root only). It lives while
// the NetNS is open or a process is in it.
func NewNetNS() (*NetNS, error) {
	var f *os.File
	err := onNetThread(func() error { return unix.Unshare(unix.CLONE_NEWNET) }, func() (err error) {
		if f, err = os.Open("/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/ns/net"); err != nil {
			return err
		}
		if err := loopbackUp(); err != nil {
			f.Close()
			return fmt.Errorf("loopback: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("new network namespace: %w", err)
	}
	return &NetNS{f: f}, nil
}

// onNetThread runs enter, then fn, on a thread of their own, and puts the
// thread back in its network namespace after. A thread that cannot be put
// back stays locked, so the runtime discards it when the goroutine ends:
// no goroutine of the node ever runs in a job's network. (Discarding every
// such thread instead would wedge the main thread, the one /proc/PID/ns
// shows, in a job's namespace whenever the goroutine happened to run on
// it, and keep that namespace alive.)
func onNetThread(enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer home.Close()
		if err := enter(); err != nil {
			runtime.UnlockOSThread() // enter failed: still home
			errc <- err
			return
		}
		err = fn()
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// in runs fn on a thread inside the namespace; sockets fn makes stay in
// it.
func (n *NetNS) in(fn func() error) error {
	return onNetThread(func() error {
		if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		return nil
	}, fn)
}

// ListenTCP listens on 127.0.0.1:port inside the namespace.
func (n *NetNS) ListenTCP(port int) (*net.TCPListener, error) {
	var ln *net.TCPListener
	err := n.in(func() (err error) {
		ln, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		return err
	})
	return ln, err
}

// DialTCP connects to 127.0.0.1:port inside the namespace.
func (n *NetNS) DialTCP(ctx context.Context, port int) (*net.TCPConn, error) {
	var c net.Conn
	err := n.in(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		return err
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// SetPortRange sets the namespace's ephemeral ports (its
// net.ipv4.ip_local_port_range) to lo..hi: a port a process in it binds
// as port 0 (gloo's listeners) is then one the node knows to forward.
func (n *NetNS) SetPortRange(lo, hi int) error {
	return n.in(func() error {
		// A net sysctl is the namespace of the thread that opens it.
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte(fmt.Sprintf("%d %d\n", lo, hi)), 0o644)
	})
}

// Close lets the namespace go once no process is in it.
func (n *NetNS) Close() error { return n.f.Close() }
