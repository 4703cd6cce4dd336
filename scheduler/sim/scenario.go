package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/deepmarket/deepmarket/scheduler"
)

// Model says how machines run what is placed on them.
type Model string

// Machine models (see the package documentation).
const (
	Shared   Model = "shared"
	Reserved Model = "reserved"
)

// Machine is one machine of a scenario.
type Machine struct {
	ID       string  `json:"id"`
	Site     int     `json:"site"` // index into Scenario.Sites
	Cores    int     `json:"cores"`
	MemBytes uint64  `json:"mem_bytes"`
	GPUs     int     `json:"gpus,omitempty"`
	Speed    float64 `json:"speed"` // relative; 1 is the reference machine
}

// Job is one job of a trace.
type Job struct {
	ID      string  `json:"id"`
	Arrival float64 `json:"arrival_s"` // seconds after the trace starts
	Workers int     `json:"workers"`
	// Per is what each worker asks for. In the Shared model a worker is
	// one process: only its memory counts, its CPU is a share.
	Per scheduler.Resources `json:"per_worker"`
	// Work is each worker's computation in seconds on a speed-1 machine
	// with nothing else on it.
	Work float64 `json:"work_s"`
	// StepWork is the computation between two exchanges of CommBytes
	// (bytes each worker sends per step, ring all-reduce); 0 for jobs
	// whose workers do not talk.
	StepWork  float64 `json:"step_work_s,omitempty"`
	CommBytes float64 `json:"comm_bytes,omitempty"`
	// Benefit is the most the job pays, in micro-credits (0: no limit).
	Benefit uint64 `json:"benefit,omitempty"`
}

// Link joins two sites.
type Link struct {
	A         int     `json:"a"`
	B         int     `json:"b"`
	Mbps      float64 `json:"mbps"`
	LatencyMs float64 `json:"latency_ms"`
}

// Scenario is a machine set, the network between its sites and a job
// trace.
type Scenario struct {
	Name  string   `json:"name"`
	Model Model    `json:"model"`
	Sites []string `json:"sites"`
	Links []Link   `json:"links,omitempty"`
	// LANMbps and LANLatencyMs are the network inside a site.
	LANMbps      float64 `json:"lan_mbps"`
	LANLatencyMs float64 `json:"lan_latency_ms"`
	// Thrash divides each process's CPU share on a machine whose memory
	// is over-committed (Shared model).
	Thrash float64 `json:"thrash"`
	// MigrateMBps is how fast a migrating balancer moves a process's
	// memory; the process stands still meanwhile.
	MigrateMBps float64 `json:"migrate_mbps"`
	// Load is the offered load the trace was drawn for: work arriving per
	// second over the CPU capacity (cores x speed). Informational.
	Load     float64   `json:"offered_load"`
	Machines []Machine `json:"machines"`
	Jobs     []Job     `json:"jobs"`
}

// Validate checks that the scenario can be simulated.
func (s *Scenario) Validate() error {
	switch {
	case s.Model != Shared && s.Model != Reserved:
		return fmt.Errorf("scenario %q: model %q: want %q or %q", s.Name, s.Model, Shared, Reserved)
	case len(s.Machines) == 0:
		return fmt.Errorf("scenario %q: no machines", s.Name)
	case len(s.Sites) == 0:
		return fmt.Errorf("scenario %q: no sites (machines name theirs by index)", s.Name)
	case s.Model == Shared && s.Thrash < 1:
		return fmt.Errorf("scenario %q: thrash factor %v: want at least 1", s.Name, s.Thrash)
	case s.LANMbps <= 0:
		return fmt.Errorf("scenario %q: lan_mbps must be positive", s.Name)
	}
	for i, m := range s.Machines {
		switch {
		case m.Site < 0 || m.Site >= len(s.Sites):
			return fmt.Errorf("machine %d (%s): site %d: there are %d sites", i, m.ID, m.Site, len(s.Sites))
		case m.Cores <= 0 || m.MemBytes == 0:
			return fmt.Errorf("machine %d (%s): needs cores and memory", i, m.ID)
		case !(m.Speed > 0) || math.IsInf(m.Speed, 0):
			return fmt.Errorf("machine %d (%s): speed %v: want a positive number", i, m.ID, m.Speed)
		}
	}
	for i, l := range s.Links {
		if l.A < 0 || l.B < 0 || l.A >= len(s.Sites) || l.B >= len(s.Sites) || l.A == l.B {
			return fmt.Errorf("link %d: sites %d-%d: want two different sites of %d", i, l.A, l.B, len(s.Sites))
		}
		if !(l.Mbps > 0) || l.LatencyMs < 0 {
			return fmt.Errorf("link %d: want positive mbps and latency >= 0", i)
		}
	}
	if p := s.paths(); len(s.Sites) > 1 {
		for i := range s.Sites {
			if math.IsInf(p.latMs[0][i], 1) {
				return fmt.Errorf("scenario %q: no path between sites %q and %q", s.Name, s.Sites[0], s.Sites[i])
			}
		}
	}
	prev := 0.0
	for i, j := range s.Jobs {
		switch {
		case j.Arrival < prev || math.IsNaN(j.Arrival):
			return fmt.Errorf("job %d (%s): arrivals must be in order, %v after %v", i, j.ID, j.Arrival, prev)
		case j.Workers < 1 || j.Workers > 10000:
			return fmt.Errorf("job %d (%s): workers %d: want 1 to 10000", i, j.ID, j.Workers)
		case !(j.Work > 0) || math.IsInf(j.Work, 0):
			return fmt.Errorf("job %d (%s): work must be positive", i, j.ID)
		case j.StepWork < 0 || j.CommBytes < 0:
			return fmt.Errorf("job %d (%s): step work and comm bytes must not be negative", i, j.ID)
		case s.Model == Reserved && j.Per == scheduler.Resources{}:
			return fmt.Errorf("job %d (%s): a worker must ask for some cores, memory or GPUs", i, j.ID)
		}
		prev = j.Arrival
	}
	return nil
}

// ReadScenario reads a scenario written by WriteJSON (or by hand).
func ReadScenario(r io.Reader) (*Scenario, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var s Scenario
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("reading scenario: %w", err)
	}
	if s.Thrash == 0 {
		s.Thrash = 10
	}
	if s.LANMbps == 0 {
		s.LANMbps = 1000
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// WriteJSON writes the scenario as JSON, the format ReadScenario reads.
func (s *Scenario) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(s)
}

// paths holds, for every pair of sites, the bottleneck bandwidth and the
// latency of the lowest-latency path between them.
type paths struct {
	mbps, latMs [][]float64
}

func (s *Scenario) paths() paths {
	n := len(s.Sites)
	p := paths{mbps: make([][]float64, n), latMs: make([][]float64, n)}
	for i := range n {
		p.mbps[i] = make([]float64, n)
		p.latMs[i] = make([]float64, n)
		for j := range n {
			p.latMs[i][j] = math.Inf(1)
		}
		p.latMs[i][i] = s.LANLatencyMs
		p.mbps[i][i] = s.LANMbps
	}
	for _, l := range s.Links {
		if l.LatencyMs < p.latMs[l.A][l.B] {
			p.latMs[l.A][l.B], p.latMs[l.B][l.A] = l.LatencyMs, l.LatencyMs
			p.mbps[l.A][l.B], p.mbps[l.B][l.A] = l.Mbps, l.Mbps
		}
	}
	// Floyd-Warshall on latency, carrying the bottleneck along.
	for k := range n {
		for i := range n {
			for j := range n {
				if i == j || i == k || j == k {
					continue
				}
				if d := p.latMs[i][k] + p.latMs[k][j]; d < p.latMs[i][j] {
					p.latMs[i][j] = d
					p.mbps[i][j] = min(p.mbps[i][k], p.mbps[k][j])
				}
			}
		}
	}
	return p
}
