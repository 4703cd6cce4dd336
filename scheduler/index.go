package scheduler

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Index is a view prepared for many placements: the same placements and
// prices as Place and Quote, found without looking at every machine.
//
// Place's cost of a worker on a machine is (risk * sum_r cost_r + net) *
// hours / speed, where cost_r, the integral of base * n^load over the d
// units the worker adds, is base * n^(load now) * d * (e^y - 1) / y with
// y = d ln(n) / lent: the next unit's price times a factor that only
// shrinks as the machine grows. So over any group of machines the cost is
// at least what the group's lowest next-unit prices (risk over speed
// included), largest capacities, lowest reserve prices and fastest speed
// would give, and nothing in the group can take the worker if its most
// free capacity is short, or if none of its machines lends at this time of
// day, or for as long as the run. The index keeps the machines in a tree
// whose nodes hold those minima and maxima, the quarter hours its
// machines' windows open and their offers' latest end, and which sites it
// spans: a k-d tree over the logarithms of each machine's next-unit prices
// and capacities, with each large site in a subtree of its own, so that a
// node's network term is bounded too. A placement is one
// branch-and-bound search, cheapest bound first, that ends each worker
// when no node or machine left can beat the best machine found (or tie
// it with a lower index). Adding a worker only raises the network terms
// of the machines it did not go to, so the bounds found for one worker
// still hold for the next: the search goes on from where it stopped,
// refreshing a bound when it reaches the top, and prices the machines
// that already hold workers, whose load the placement changed, apart.
// Nothing is approximated: each worker goes where Place puts it.
//
// Measured RTTs (View.RTT) have no structure to bound, so there the
// network term's bound is 0: placements are still Place's, but a job of
// several workers prices most machines whose resources alone cost less
// than its best machine in all, and the index gains a few times over
// Place rather than orders of magnitude. Site labels bound it well.
//
// Purity: NewIndex copies the view's machines, so the index changes only
// through Update; its placements are a function of the view it was built
// from, the Params, the updates since and the call's arguments, like
// Place's (no clock, no randomness; a View.RTT it keeps must be pure, and
// give durations of at least 0). Quote and Place only read the index: any
// number may run at once, and each leaves it as it was (a placement's
// workers load private copies of the machines they go to). Update
// writes: the caller keeps it apart from them.
type Index struct {
	v  View
	md model
	// Site ordinals: one per named site, and one per machine without a
	// site (a site of its own, as in Place), handed out in tree order so
	// that a node's machines span a range of ordinals.
	sites  map[string]int32
	nsites int32
	// entries holds the machines in tree order; pos maps a machine's
	// index in the view to its entry.
	entries []entry
	pos     []int32
	nodes   []inode // nodes[0] is the root
}

// leafSize is the most machines a leaf of the tree holds: a leaf is
// scanned whole, so small leaves examine fewer machines and large ones
// open fewer nodes.
const leafSize = 8

// entry is one machine as the index bounds it.
type entry struct {
	idx, site, leaf int32
	always          bool       // lent all day, with no end to the offer
	inv             float64    // 1 / speed
	free            [3]float64 // cores, bytes, GPUs
	lent            [3]float64 // cores, GiB, GPUs
	eff             [3]float64 // risk / speed * n^load; +Inf where nothing is lent
	res             [3]float64 // risk / speed * reserve price
}

// inode is a node of the tree: its machines are entries[lo:hi].
type inode struct {
	lo, hi, left, right, parent int32 // left < 0 in a leaf
	minIdx, siteLo, siteHi      int32
	minInv                      float64
	maxFree, maxLent            [3]float64
	minEff, minRes              [3]float64
	// sites has bit s%64 set for each site ordinal s under the node;
	// open has bit k set if a machine under it may start a run in the
	// k-th quarter hour of the day (UTC); until is the latest end of an
	// offer under it (Unix ns; no end is math.MaxInt64).
	sites uint64
	open  [2]uint64
	until int64
}

// NewIndex prepares v for placements priced with p. It takes O(n log n)
// for n machines; a machine's change of offer or allocation is then
// Update's O(log n). A machine joining or leaving the view changes n, the
// base of every price (unless Params.N fixes it), and takes a new index.
func NewIndex(v View, p Params) *Index {
	n := len(v.Machines)
	x := &Index{v: View{Machines: slices.Clone(v.Machines), RTT: v.RTT}, md: newModel(p, n),
		sites: map[string]int32{}, pos: make([]int32, n), nodes: make([]inode, 0, 4*n/leafSize+1)}
	var names []string
	for i := range x.v.Machines {
		if s := x.v.Machines[i].Site; s != "" {
			names = append(names, s)
		}
	}
	slices.Sort(names)
	// A large site has a subtree of its own, whose network term is bounded
	// by that site's; every group costs the search a region to look at,
	// so small sites (and machines without one) share the rest of the tree,
	// where a node's site bits bound the term.
	groupOf := map[string]int32{}
	for k := 0; k < len(names); {
		run := 1
		for k+run < len(names) && names[k+run] == names[k] {
			run++
		}
		x.sites[names[k]] = x.nsites
		x.nsites++
		if run >= max(64, n/32) {
			groupOf[names[k]] = int32(len(groupOf))
		}
		k += run
	}
	shared := int32(len(groupOf))
	byMachine := make([]entry, n)
	pts := make([]point, n)
	for i := range x.v.Machines {
		e := &byMachine[i]
		x.fill(e, i)
		pt := &pts[i]
		pt.i, pt.group = int32(i), shared
		if g, ok := groupOf[x.v.Machines[i].Site]; ok {
			pt.group = g
		}
		for r := range 3 {
			pt.k[r] = math.NaN()
			if e.lent[r] > 0 {
				pt.k[r] = math.Log(e.eff[r])
			}
			pt.k[3+r] = 0.5 * math.Log(max(e.lent[r], 0.5))
		}
	}
	// A machine that lends none of a resource goes just past the dearest
	// that lends it: far enough to part them where that resource's prices
	// spread widest, not so far that every other split waits for it (a
	// job asking no GPUs can use a GPU machine's cores).
	for r := range 3 {
		dearest := math.Inf(-1)
		for k := range pts {
			if v := pts[k].k[r]; v == v && v < math.Inf(1) {
				dearest = max(dearest, v)
			}
		}
		if math.IsInf(dearest, -1) { // none lends it: one value, no spread
			dearest = 0
		}
		for k := range pts {
			if v := pts[k].k[r]; v != v || v > dearest+1 {
				pts[k].k[r] = dearest + 1
			}
		}
	}
	pts = byGroup(pts, shared+1)
	x.entries = make([]entry, n)
	if n > 0 {
		b := builder{x: x, pts: pts}
		b.build(0, n, -1)
	}
	for k := range pts {
		i := pts[k].i
		leaf := x.entries[k].leaf // build set it
		x.entries[k] = byMachine[i]
		x.entries[k].leaf = leaf
		x.pos[i] = int32(k)
		if site := x.v.Machines[i].Site; site != "" {
			x.entries[k].site = x.sites[site]
		} else {
			x.entries[k].site = x.nsites
			x.nsites++
		}
	}
	for id := len(x.nodes) - 1; id >= 0; id-- { // children come after their parent
		x.pull(int32(id))
	}
	return x
}

// Len is the number of machines in the index's view.
func (x *Index) Len() int { return len(x.v.Machines) }

// Machine is machine i of the index's view as it stands.
func (x *Index) Machine(i int) Machine { return x.v.Machines[i] }

// Update replaces machine i of the view (its offer changed, or its
// allocation: a hold granted or released, a job ended). The machine keeps
// its place in the tree, where the bounds stay correct however far its
// prices move; they only grow looser, and a new index after many updates
// makes them tight again. A machine to leave alone until the next index
// (unreachable, its offer withdrawn) can be updated with all it lends
// allocated: it is then never chosen, though n, the base of the prices,
// still counts it.
func (x *Index) Update(i int, m Machine) {
	old := x.v.Machines[i].Site
	x.v.Machines[i] = m
	e := &x.entries[x.pos[i]]
	site := e.site
	switch {
	case m.Site == old && m.Site != "":
	case m.Site == "":
		if old != "" {
			site = x.nsites
			x.nsites++
		}
	default:
		s, ok := x.sites[m.Site]
		if !ok {
			s = x.nsites
			x.sites[m.Site] = s
			x.nsites++
		}
		site = s
	}
	leaf := e.leaf
	x.fill(e, i)
	e.site, e.leaf = site, leaf
	for id := leaf; id >= 0; id = x.nodes[id].parent {
		x.pull(id)
	}
}

// fill computes machine i's entry (all but its site and leaf).
func (x *Index) fill(e *entry, i int) {
	m := &x.v.Machines[i]
	rs := x.md.risk(m) / m.speed()
	f := m.Free()
	lent := [3]float64{float64(m.Lent.Cores), float64(m.Lent.MemBytes) / gib, float64(m.Lent.GPUs)}
	alloc := [3]float64{float64(m.Allocated.Cores), float64(m.Allocated.MemBytes) / gib, float64(m.Allocated.GPUs)}
	reserve := [3]float64{float64(m.Reserve.CoreHour), float64(m.Reserve.MemGiBHour), float64(m.Reserve.GPUHour)}
	e.idx = int32(i)
	e.always = m.Window.AllDay() && m.Until.IsZero()
	e.inv = 1 / m.speed()
	e.free = [3]float64{float64(f.Cores), float64(f.MemBytes), float64(f.GPUs)}
	for r := range 3 {
		e.lent[r] = lent[r]
		e.eff[r] = math.Inf(1)
		if lent[r] > 0 {
			e.eff[r] = rs * math.Exp(x.md.lnN*alloc[r]/lent[r])
		}
		e.res[r] = rs * reserve[r]
	}
}

// pull recomputes node id's bounds from its machines or children.
func (x *Index) pull(id int32) {
	nd := &x.nodes[id]
	nd.minIdx, nd.siteLo, nd.siteHi, nd.minInv = math.MaxInt32, math.MaxInt32, -1, math.Inf(1)
	nd.sites, nd.open, nd.until = 0, [2]uint64{}, math.MinInt64
	nd.maxFree, nd.maxLent = [3]float64{}, [3]float64{}
	inf := math.Inf(1)
	nd.minEff, nd.minRes = [3]float64{inf, inf, inf}, [3]float64{inf, inf, inf}
	if nd.left < 0 {
		for k := nd.lo; k < nd.hi; k++ {
			e := &x.entries[k]
			nd.minIdx, nd.siteLo, nd.siteHi = min(nd.minIdx, e.idx), min(nd.siteLo, e.site), max(nd.siteHi, e.site)
			nd.minInv = min(nd.minInv, e.inv)
			nd.sites |= 1 << (e.site & 63)
			m := &x.v.Machines[e.idx]
			open := windowSlots(m.Window)
			nd.open[0], nd.open[1] = nd.open[0]|open[0], nd.open[1]|open[1]
			until := int64(math.MaxInt64)
			if !m.Until.IsZero() {
				until = m.Until.UnixNano()
			}
			nd.until = max(nd.until, until)
			for r := range 3 {
				nd.maxFree[r], nd.maxLent[r] = max(nd.maxFree[r], e.free[r]), max(nd.maxLent[r], e.lent[r])
				nd.minEff[r], nd.minRes[r] = min(nd.minEff[r], e.eff[r]), min(nd.minRes[r], e.res[r])
			}
		}
		return
	}
	for _, c := range [2]int32{nd.left, nd.right} {
		ch := &x.nodes[c]
		nd.minIdx, nd.siteLo, nd.siteHi = min(nd.minIdx, ch.minIdx), min(nd.siteLo, ch.siteLo), max(nd.siteHi, ch.siteHi)
		nd.minInv = min(nd.minInv, ch.minInv)
		nd.sites |= ch.sites
		nd.open[0], nd.open[1] = nd.open[0]|ch.open[0], nd.open[1]|ch.open[1]
		nd.until = max(nd.until, ch.until)
		for r := range 3 {
			nd.maxFree[r], nd.maxLent[r] = max(nd.maxFree[r], ch.maxFree[r]), max(nd.maxLent[r], ch.maxLent[r])
			nd.minEff[r], nd.minRes[r] = min(nd.minEff[r], ch.minEff[r]), min(nd.minRes[r], ch.minRes[r])
		}
	}
}

// byGroup sorts points by group, in machine order within one (a
// counting sort: groups are few and small integers).
func byGroup(pts []point, groups int32) []point {
	start := make([]int, groups+1)
	for k := range pts {
		start[pts[k].group+1]++
	}
	for g := int32(1); g <= groups; g++ {
		start[g] += start[g-1]
	}
	out := make([]point, len(pts))
	for k := range pts {
		g := pts[k].group
		out[start[g]] = pts[k]
		start[g]++
	}
	return out
}

// windowSlots has bit k set where a run may start in the k-th quarter
// hour of the day, UTC, under window w: any quarter hour that has a
// minute of the window.
func windowSlots(w Window) [2]uint64 {
	const day = 24 * 60
	all := [2]uint64{^uint64(0), 1<<32 - 1}
	if w.AllDay() || w.StartMin < 0 || w.StartMin >= day || w.EndMin < 0 || w.EndMin >= day {
		return all // all day, or a window Covers reads in ways not worth copying
	}
	mod := func(a int) int { return ((a % day) + day) % day }
	first := mod(w.StartMin - w.OffsetMin) // in UTC minutes
	length := mod(w.EndMin - w.StartMin)
	var out [2]uint64
	for k := first / 15; k <= (first+length-1)/15; k++ {
		slot := k % 96
		out[slot>>6] |= 1 << (slot & 63)
	}
	return out
}

// kdims are the coordinates the tree splits on: the logarithm of each
// resource's next-unit price (with risk and speed), and half the
// logarithm of each capacity (a machine twice the size prices a worker's
// units less than twice as differently).
const kdims = 6

// point is a machine as the tree is built: its coordinates, index and
// site group.
type point struct {
	k        [kdims]float64
	i, group int32
}

type builder struct {
	x   *Index
	pts []point
}

// build makes the node for pts[lo:hi] and its subtree: split between
// site groups while it spans several, then at the median of the
// coordinate that spreads widest.
func (b *builder) build(lo, hi int, parent int32) int32 {
	id := int32(len(b.x.nodes))
	b.x.nodes = append(b.x.nodes, inode{lo: int32(lo), hi: int32(hi), left: -1, right: -1, parent: parent})
	if hi-lo <= leafSize {
		for k := lo; k < hi; k++ {
			b.x.entries[k].leaf = id
		}
		return id
	}
	pts := b.pts[lo:hi]
	mid := len(pts) / 2
	if pts[0].group != pts[len(pts)-1].group {
		cut := -1
		for k := 1; k < len(pts); k++ {
			if pts[k].group != pts[k-1].group && (cut < 0 || abs(k-mid) < abs(cut-mid)) {
				cut = k
			}
		}
		mid = cut
	} else {
		var least, most [kdims]float64
		least, most = pts[0].k, pts[0].k
		for k := range pts {
			for d := range kdims {
				least[d], most[d] = min(least[d], pts[k].k[d]), max(most[d], pts[k].k[d])
			}
		}
		dim := 0
		for d := range kdims {
			if most[d]-least[d] > most[dim]-least[dim] {
				dim = d
			}
		}
		selectNth(pts, mid, dim)
	}
	l := b.build(lo, lo+mid, id)
	r := b.build(lo+mid, hi, id)
	b.x.nodes[id].left, b.x.nodes[id].right = l, r
	return id
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// less orders points by coordinate dim, then index.
func (a *point) less(b *point, dim int) bool {
	if a.k[dim] != b.k[dim] {
		return a.k[dim] < b.k[dim]
	}
	return a.i < b.i
}

// selectNth reorders s so that s[k] is the point a sort by coordinate
// dim would put there, smaller ones before it and larger after
// (quickselect with a median-of-three pivot).
func selectNth(s []point, k, dim int) {
	lo, hi := 0, len(s)-1
	for hi > lo {
		mid := lo + (hi-lo)/2
		if s[mid].less(&s[lo], dim) {
			s[mid], s[lo] = s[lo], s[mid]
		}
		if s[hi].less(&s[lo], dim) {
			s[hi], s[lo] = s[lo], s[hi]
		}
		if s[hi].less(&s[mid], dim) {
			s[hi], s[mid] = s[mid], s[hi]
		}
		pivot := s[mid]
		i, j := lo, hi
		for i <= j {
			for s[i].less(&pivot, dim) {
				i++
			}
			for pivot.less(&s[j], dim) {
				j--
			}
			if i <= j {
				s[i], s[j] = s[j], s[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return
		}
	}
}

// Quote is Quote(v, j, now, p) for the index's view and params.
func (x *Index) Quote(j Job, now time.Time) (Placement, error) {
	pl, err := x.Place(j, now)
	if err != nil {
		return Placement{}, err
	}
	return admit(pl, j, now)
}

// host is a machine the job's workers already went to, with its private
// copy loaded by them.
type host struct {
	i, perMachine int
	m             Machine
	cost, hrs     float64 // workerCost's total at m; +Inf once a worker no longer fits
}

// siteCount is how many of the job's workers a site has.
type siteCount struct{ site, n int32 }

// item is a node or a machine waiting in the search. Its place in the
// heap carries a lower bound of its cost for the worker it was last priced
// for (epoch); adding a worker only raises network terms, so a bound stays
// a bound for the workers after, and the search refreshes one when it
// reaches the top.
type item struct {
	res float64 // the resources' part of the bound: the same for every worker
	wc  float64 // a machine's workerCost total, once computed (NaN before)
	inv float64 // the least 1 / speed under the item
	// ref is a node, or -1-k for entries[k]; siteLo..siteHi the site
	// ordinals under it and sites their bits. A refresh needs no more than
	// the item.
	ref, epoch, siteLo, siteHi int32
	sites                      uint64
}

// queued is an item's place in the heap: its bound, the lowest machine
// index under it (ties go to the lowest index) and the item.
type queued struct {
	bound       float64
	minIdx, arg int32
}

func (a *queued) before(b *queued) bool {
	return a.bound < b.bound || (a.bound == b.bound && a.minIdx < b.minIdx)
}

// search is one placement's state.
type search struct {
	x     *Index
	j     Job
	now   time.Time
	hours float64
	need  [3]float64 // for free capacity: cores, bytes, GPUs
	d     [3]float64 // for prices: cores, GiB, GPUs
	base  [3]float64
	y     [3]float64 // d ln(n): a machine lending L prices the worker's units with growth(y / L)
	// loss times L is the share of that price Place's rounding may lose:
	// it takes the integral as a difference of exponentials, n^((a+d)/L)
	// - n^(a/L), whose rounding is about ε (ln n + 2) n^(a/L), against a
	// difference of y/L n^(a/L) (more where a worker is a sliver of a
	// machine).
	loss   [3]float64
	hosts  []host
	sites  []siteCount
	placed []int // machines of the workers so far, in order
	heap   []queued
	items  []item
	// slot is the quarter hour of the day (UTC) the run starts in, and
	// start its Unix ns.
	slot  int
	start int64
	// The best machine so far for the current worker: its index, cost
	// and workerCost total.
	best             int
	bestCost, bestWC float64
}

// scratch keeps searches' memory between placements (it holds nothing a
// placement's answer depends on): a node prices bids back to back, and
// garbage from each would have the collector scanning its views.
var scratch = sync.Pool{New: func() any { return new(search) }}

// Place is Place(v, j, now, p) for the index's view and params.
func (x *Index) Place(j Job, now time.Time) (Placement, error) {
	if err := j.Validate(); err != nil {
		return Placement{}, &Rejection{Resource: "job", Reason: err.Error()}
	}
	if len(x.v.Machines) == 0 {
		return Placement{}, explain(x.v, j, now, 0)
	}
	b := x.md.p.Base
	s := scratch.Get().(*search)
	defer scratch.Put(s)
	*s = search{x: x, j: j, now: now, hours: hours(j.Duration),
		need:  [3]float64{float64(j.Per.Cores), float64(j.Per.MemBytes), float64(j.Per.GPUs)},
		d:     [3]float64{float64(j.Per.Cores), float64(j.Per.MemBytes) / gib, float64(j.Per.GPUs)},
		base:  [3]float64{float64(b.CoreHour), float64(b.MemGiBHour), float64(b.GPUHour)},
		hosts: s.hosts[:0], sites: s.sites[:0], placed: s.placed[:0], heap: s.heap[:0], items: s.items[:0]}
	u := now.UTC()
	s.slot, s.start = (u.Hour()*60+u.Minute())/15, now.UnixNano()
	for r := range 3 {
		s.y[r] = x.md.lnN * s.d[r]
		s.loss[r] = 64 * 0x1p-52 * (x.md.lnN + 2) / s.y[r]
	}
	s.push(math.Inf(-1), x.nodes[0].minIdx, item{wc: math.NaN()})
	t := newTally(j.Workers)
	for w := 0; w < j.Workers; w++ {
		best, cost := s.next()
		if best < 0 {
			return Placement{}, explain(x.v, j, now, w)
		}
		k := s.host(best)
		if k < 0 {
			m := &x.v.Machines[best]
			s.hosts = append(s.hosts, host{i: best, m: *m, cost: cost, hrs: s.hours / m.speed()})
			k = len(s.hosts) - 1
		}
		h := &s.hosts[k]
		site := x.entries[x.pos[best]].site
		t.add(x.md, best, &h.m, j.Per, h.cost, s.net(best, h.perMachine, site))
		h.m.add(j.Per)
		h.perMachine++
		h.cost = math.Inf(1)
		if h.m.fits(j.Per) {
			h.cost, _ = x.md.workerCost(&h.m, j.Per)
		}
		if k := slices.IndexFunc(s.sites, func(c siteCount) bool { return c.site == site }); k >= 0 {
			s.sites[k].n++
		} else {
			s.sites = append(s.sites, siteCount{site, 1})
		}
		s.placed = append(s.placed, best)
	}
	return t.finish(j, now), nil
}

// host finds machine i among the hosts, or -1.
func (s *search) host(i int) int {
	for k := range s.hosts {
		if s.hosts[k].i == i {
			return k
		}
	}
	return -1
}

// net is the network term of one more worker on machine i (in site
// ordinal site, holding perMachine of the job's workers): Place's, to the
// bit.
func (s *search) net(i, perMachine int, site int32) float64 {
	placed := len(s.placed)
	if placed == 0 {
		return 0
	}
	x := s.x
	if x.v.RTT != nil {
		net := 0.0
		for _, k := range s.placed {
			net += x.md.pairCost(&x.v, i, k)
		}
		return net
	}
	onSite := 0
	for _, c := range s.sites {
		if c.site == site {
			onSite = int(c.n)
		}
	}
	return float64(x.md.p.SameSite)*float64(onSite-perMachine) + float64(x.md.p.CrossSite)*float64(placed-onSite)
}

// netBound is at most the network term of one more worker on any machine
// not yet holding one of the job's workers, in site ordinals lo..hi whose
// bits (ordinal % 64) are in mask.
func (s *search) netBound(lo, hi int32, mask uint64) float64 {
	placed := len(s.placed)
	if placed == 0 || s.x.v.RTT != nil { // measured RTTs have no structure to bound: 0
		return 0
	}
	same, cross := float64(s.x.md.p.SameSite), float64(s.x.md.p.CrossSite)
	b, in := math.Inf(1), 0
	for _, c := range s.sites {
		if c.site >= lo && c.site <= hi && mask&(1<<(c.site&63)) != 0 {
			in++
			b = min(b, same*float64(c.n)+cross*float64(placed-int(c.n)))
		}
	}
	if int(hi-lo)+1 > in {
		b = min(b, cross*float64(placed))
	}
	return b
}

// shortest is at most the run, in ns, on any machine whose 1 / speed is
// at least inv: a microsecond less than Place's reckoning, for rounding.
func (s *search) shortest(inv float64) int64 {
	return int64(time.Duration(s.hours*inv*safety*float64(time.Hour))) - int64(time.Microsecond)
}

// safety keeps a bound below the exact cost it bounds whatever the
// rounding of either.
const safety = 1 - 1e-9

// growth is at most (e^y - 1) / y, how much more than d units at the
// current price adding them costs when y = d ln(n) / lent, and within 2 %
// of it, without an exponential (the search takes it for every node it
// looks at): below 1/4, the series to y^2; above, e^y = 2^k 2^f with 2^f
// at least its series to f^3, 2^k exact from the exponent's bits.
func growth(y float64) float64 {
	if y < 0.25 {
		return 1 + y*(0.5+y/6)
	}
	t := y * math.Log2E
	if t >= 1023 {
		return math.Inf(1)
	}
	k := int(t)
	f := (t - float64(k)) * math.Ln2
	return (math.Float64frombits(uint64(1023+k)<<52)*(1+f*(1+f*(0.5+f/6))) - 1) / y
}

// resBound is at most the resources' part of the hourly cost, per hour
// of speed, of one worker on any machine whose next-unit prices (risk
// over speed included) are at least eff, reserve prices res, capacities
// at most lent and free capacity at most free: +Inf where it cannot fit.
func (s *search) resBound(free, lent, eff, res *[3]float64) float64 {
	b := 0.0
	for r := range 3 {
		if s.need[r] == 0 {
			continue
		}
		if free[r] < s.need[r] {
			return math.Inf(1)
		}
		b += max(s.base[r]*eff[r]*s.d[r]*growth(s.y[r]/lent[r])*(1-s.loss[r]*lent[r]), res[r]*s.d[r])
	}
	return b
}

// next finds the machine for the next worker, as Place would: the least
// (cost + network) * hours, the lowest index on ties; -1 if none has
// room. cost is the machine's workerCost total.
func (s *search) next() (best int, cost float64) {
	s.best, s.bestCost, s.bestWC = -1, math.Inf(1), 0
	for k := range s.hosts {
		h := &s.hosts[k]
		if !math.IsInf(h.cost, 1) {
			s.consider(h.i, (h.cost+s.net(h.i, h.perMachine, s.x.entries[s.x.pos[h.i]].site))*h.hrs, h.cost)
		}
	}
	w := int32(len(s.placed))
	x := s.x
	for len(s.heap) > 0 && s.beats(s.heap[0].bound, s.heap[0].minIdx) {
		q := s.heap[0]
		it := &s.items[q.arg]
		if it.epoch < w && (it.ref >= 0 || math.IsNaN(it.wc)) {
			q.bound, it.epoch = (it.res+s.netBound(it.siteLo, it.siteHi, it.sites)*it.inv)*s.hours*safety, w
			if !s.beats(q.bound, q.minIdx) {
				s.fixTop(q)
				continue
			}
		}
		if it.ref >= 0 { // a node
			s.popTop()
			s.expand(it.ref)
			continue
		}
		if s.host(int(q.minIdx)) >= 0 {
			s.popTop() // priced above, loaded with the job's workers
			continue
		}
		q.bound = s.price(it, &x.entries[-1-it.ref])
		s.fixTop(q)
	}
	if s.best < 0 || math.IsInf(s.bestCost, 1) {
		return -1, 0
	}
	return s.best, s.bestWC
}

// beats reports whether cost c at machine index i (or a bound c of
// machines from index i on) would be chosen over the best so far.
func (s *search) beats(c float64, i int32) bool {
	return c < s.bestCost || (c == s.bestCost && int(i) < s.best)
}

func (s *search) consider(i int, c, wc float64) {
	if s.beats(c, int32(i)) {
		s.best, s.bestCost, s.bestWC = i, c, wc
	}
}

// price gives a machine's item its exact cost for the current worker.
func (s *search) price(it *item, e *entry) float64 {
	m := &s.x.v.Machines[e.idx]
	if math.IsNaN(it.wc) {
		it.wc, _ = s.x.md.workerCost(m, s.j.Per)
	}
	it.epoch = int32(len(s.placed))
	c := (it.wc + s.net(int(e.idx), 0, e.site)) * (s.hours / m.speed())
	s.consider(int(e.idx), c, it.wc)
	return c
}

// expand puts node id's children, or a leaf's machines, in the search,
// pricing the machines whose bound beats the best so far. Machines and
// nodes without room, and machines whose window does not cover the run,
// leave the search for good.
func (s *search) expand(id int32) {
	x := s.x
	nd := &x.nodes[id]
	w := int32(len(s.placed))
	if nd.left >= 0 {
		for _, c := range [2]int32{nd.left, nd.right} {
			ch := &x.nodes[c]
			if ch.open[s.slot>>6]&(1<<(s.slot&63)) == 0 || s.start+s.shortest(ch.minInv) > ch.until {
				continue // no machine under it is lending for the run now
			}
			res := s.resBound(&ch.maxFree, &ch.maxLent, &ch.minEff, &ch.minRes)
			if !math.IsInf(res, 1) {
				s.push((res+s.netBound(ch.siteLo, ch.siteHi, ch.sites)*ch.minInv)*s.hours*safety, ch.minIdx,
					item{res: res, wc: math.NaN(), inv: ch.minInv, ref: c, epoch: w, siteLo: ch.siteLo, siteHi: ch.siteHi, sites: ch.sites})
			}
		}
		return
	}
	for k := nd.lo; k < nd.hi; k++ {
		e := &x.entries[k]
		res := s.resBound(&e.free, &e.lent, &e.eff, &e.res)
		if math.IsInf(res, 1) || s.host(int(e.idx)) >= 0 {
			continue
		}
		if m := &x.v.Machines[e.idx]; !e.always && !m.available(s.now, s.now.Add(time.Duration(s.hours/m.speed()*float64(time.Hour)))) {
			continue
		}
		bit := uint64(1) << (e.site & 63)
		it := item{res: res, wc: math.NaN(), inv: e.inv, ref: -1 - k, epoch: w, siteLo: e.site, siteHi: e.site, sites: bit}
		bound := (res + s.netBound(e.site, e.site, bit)*e.inv) * s.hours * safety
		if s.beats(bound, e.idx) {
			bound = s.price(&it, e)
		}
		s.push(bound, e.idx, it)
	}
}

func (s *search) push(bound float64, minIdx int32, it item) {
	s.items = append(s.items, it)
	h := append(s.heap, queued{bound, minIdx, int32(len(s.items) - 1)})
	for k := len(h) - 1; k > 0; {
		p := (k - 1) / 2
		if !h[k].before(&h[p]) {
			break
		}
		h[k], h[p] = h[p], h[k]
		k = p
	}
	s.heap = h
}

func (s *search) popTop() {
	last := len(s.heap) - 1
	q := s.heap[last]
	s.heap = s.heap[:last]
	if last > 0 {
		s.fixTop(q)
	}
}

// fixTop puts q at the top of the heap, in place of what was there, and
// sifts it down.
func (s *search) fixTop(q queued) {
	h := s.heap
	k := 0
	for {
		l := 2*k + 1
		if l >= len(h) {
			break
		}
		c := l
		if r := l + 1; r < len(h) && h[r].before(&h[l]) {
			c = r
		}
		if !h[c].before(&q) {
			break
		}
		h[k] = h[c]
		k = c
	}
	h[k] = q
}
