package lender

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/p2p"
)

// workerPort is where worker j of a run listens, inside the run's
// network namespace on every machine: the namespace is fresh, so the
// same ports serve every run.
func workerPort(j int) int { return 20000 + j }

// avgPort is worker j's second port, for traffic the job runs beside its
// framework's (the deepmarket package's DiLoCo averaging; DM_AVG_PEERS
// lists them): 1000 above workerPort(j). Its tunnel is told apart from
// the first port's by the worker index avgIndex(j).
func avgPort(j int) int { return workerPort(j) + 1000 }

func avgIndex(j int) int { return p2p.MaxWorkers + j }

// holderPort is where, in a held job, worker j reaches the model's holder
// (its own port, so the holder knows each connection's rank by the port
// it came in on: the holder's machine exposes it to worker j's machine
// only), and holderIndex(j) the tunnel that carries it.
func holderPort(j int) int { return 23000 + j }

func holderIndex(j int) int { return 2*p2p.MaxWorkers + j }

// runNet is a run's network namespace on this machine, shared by its
// workers here, with the forwarders to its workers elsewhere.
type runNet struct {
	ns   *sandbox.NetNS
	refs int
	fwd  map[int]io.Closer
}

// acquireNet gives worker w its run's namespace, made on first use, with a
// forwarder to each remote worker and, in a held job, to the model's
// holder on its submitter's machine (none for the holder itself).
func (e *Executor) acquireNet(ctx context.Context, w *worker) (*sandbox.NetNS, error) {
	l := w.l
	e.mu.Lock()
	defer e.mu.Unlock()
	rn := e.nets[l.JobID]
	fresh := rn == nil
	if fresh {
		ns, err := sandbox.NewNetNS()
		if err != nil {
			return nil, fmt.Errorf("cannot isolate the job's network (%v): not running it", err)
		}
		rn = &runNet{ns: ns, fwd: map[int]io.Closer{}}
		e.nets[l.JobID] = rn
	}
	rn.refs++
	if fresh && l.Framework == "torch" && !w.holder {
		if err := e.meshPorts(ctx, rn, l); err != nil {
			return rn.ns, err
		}
	}
	self := e.self
	if w.holder {
		return rn.ns, nil
	}
	if hi := holderIndex(l.Index); l.Training.Held() && w.bidder.String() != self && rn.fwd[hi] == nil {
		e.dial.LearnMachine(w.bidder, nil)
		_, closer, err := e.tunnels.ForwardIn(ctx, rn.ns, holderPort(l.Index), l.JobID, hi, w.bidder)
		if err != nil {
			return rn.ns, fmt.Errorf("tunnel to the model's holder: %w", err)
		}
		rn.fwd[hi] = closer
	}
	for j, m := range l.World {
		if m == self || rn.fwd[j] != nil {
			continue
		}
		id, err := peer.Decode(m)
		if err != nil {
			return rn.ns, err
		}
		var known []string
		if j < len(l.Addrs) {
			known = l.Addrs[j]
		}
		e.dial.LearnMachine(id, known)
		_, closer, err := e.tunnels.ForwardIn(ctx, rn.ns, workerPort(j), l.JobID, j, id)
		if err != nil {
			return rn.ns, fmt.Errorf("tunnel to worker %d: %w", j, err)
		}
		rn.fwd[j] = closer
		_, closer, err = e.tunnels.ForwardIn(ctx, rn.ns, avgPort(j), l.JobID, avgIndex(j), id)
		if err != nil {
			return rn.ns, fmt.Errorf("tunnel to worker %d's second port: %w", j, err)
		}
		rn.fwd[avgIndex(j)] = closer
	}
	return rn.ns, nil
}

// A torch run's gloo (torch.distributed's CPU backend) has each worker
// listen for its peers on a port the kernel picks (it binds port 0) and
// tell them that port through its store: no tunnel could know it in
// advance. So the run's namespace on each machine picks its ephemeral
// ports from a range of its own, meshPortsPer from meshBase on, one range
// per machine of the run in the order they appear in its world, and
// every other machine of the run forwards that whole range to it.
const (
	meshBase        = 40000
	meshPortsPer    = 64
	maxMeshMachines = (65536 - meshBase) / meshPortsPer
)

// meshRange is the ephemeral ports of the run's slot-th machine.
func meshRange(slot int) (lo, hi int) {
	lo = meshBase + slot*meshPortsPer
	return lo, lo + meshPortsPer - 1
}

// machineSlots lists the run's machines once each, in the order of the
// workers they run.
func machineSlots(world []string) []string {
	var out []string
	for _, m := range world {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// meshPorts gives a torch run's namespace its machine's range of
// ephemeral ports, exposed to the run's other machines (each port its
// own tunnel index: the port, above every worker's index), and forwards
// every other machine's range to that machine.
func (e *Executor) meshPorts(ctx context.Context, rn *runNet, l p2p.Launch) error {
	slots := machineSlots(l.World)
	if len(slots) > maxMeshMachines {
		return fmt.Errorf("a torch run on %d machines: gloo's ports reach %d at most", len(slots), maxMeshMachines)
	}
	allowed := remotePeers(l.World, e.self)
	for m, machine := range slots {
		lo, hi := meshRange(m)
		if machine == e.self {
			if err := rn.ns.SetPortRange(lo, hi); err != nil {
				return fmt.Errorf("the run's ephemeral ports: %w", err)
			}
			for port := lo; port <= hi; port++ {
				rn.fwd[port] = closeFunc(e.tunnels.ExposeIn(rn.ns, l.JobID, port, port, allowed))
			}
			continue
		}
		id, err := peer.Decode(machine)
		if err != nil {
			return err
		}
		for port := lo; port <= hi; port++ {
			_, closer, err := e.tunnels.ForwardIn(ctx, rn.ns, port, l.JobID, port, id)
			if err != nil {
				return fmt.Errorf("tunnel to machine %d's ports: %w", m, err)
			}
			rn.fwd[port] = closer
		}
	}
	return nil
}

// closeFunc is an io.Closer of a func.
type closeFunc func()

func (f closeFunc) Close() error { f(); return nil }

func (e *Executor) releaseNet(run string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	rn := e.nets[run]
	if rn == nil {
		return
	}
	if rn.refs--; rn.refs > 0 {
		return
	}
	for _, c := range rn.fwd {
		c.Close()
	}
	rn.ns.Close()
	delete(e.nets, run)
}

// wireNet puts the worker in its run's network namespace and exposes its
// two ports there, through authenticated tunnels, to the run's other
// machines; the worker's closers undo both.
func (e *Executor) wireNet(ctx context.Context, w *worker) (*sandbox.NetNS, error) {
	l := w.l
	allowed := remotePeers(l.World, e.self)
	ns, err := e.acquireNet(ctx, w)
	if ns != nil {
		w.set(func() { w.closers = append(w.closers, func() { e.releaseNet(l.JobID) }) })
	}
	if err != nil {
		return nil, err
	}
	if w.holder { // a port for each worker, to that worker's machine only
		for j, m := range l.World {
			id, err := peer.Decode(m)
			if err != nil || m == e.self {
				continue // a worker here reaches the port in the namespace itself
			}
			unexpose := e.tunnels.ExposeIn(ns, l.JobID, holderIndex(j), holderPort(j), []peer.ID{id})
			w.set(func() { w.closers = append(w.closers, unexpose) })
		}
		return ns, nil
	}
	unexpose := e.tunnels.ExposeIn(ns, l.JobID, l.Index, workerPort(l.Index), allowed)
	unexposeAvg := e.tunnels.ExposeIn(ns, l.JobID, avgIndex(l.Index), avgPort(l.Index), allowed)
	w.set(func() { w.closers = append(w.closers, unexpose, unexposeAvg) })
	return ns, nil
}

// clusterAddrs is the cluster of a run of n workers as every worker sees
// it: worker j at 127.0.0.1 on workerPort(j) (addrs) and avgPort(j) (avg)
// of the run's network namespace, where only loopback exists; remote
// workers are forwarders through authenticated tunnels.
func clusterAddrs(n int) (addrs, avg []string) {
	addrs = make([]string, n)
	avg = make([]string, n)
	for j := range n {
		addrs[j] = "127.0.0.1:" + strconv.Itoa(workerPort(j))
		avg[j] = "127.0.0.1:" + strconv.Itoa(avgPort(j))
	}
	return addrs, avg
}

// remotePeers lists the machines of a run's world other than self: the
// only peers whose tunnels may reach its workers here.
func remotePeers(world []string, self string) []peer.ID {
	var allowed []peer.ID
	for _, m := range world {
		if id, err := peer.Decode(m); err == nil && m != self && !slices.Contains(allowed, id) {
			allowed = append(allowed, id)
		}
	}
	return allowed
}
