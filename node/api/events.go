package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// Server-sent events: what keeps the dashboard live without reloading.
// GET /api/v1/events sends one event per topic at once and then whenever
// that topic changes; GET /api/v1/jobs/{id}/logs/stream sends a job's log
// as it grows.

// EventEvery is how often the event stream looks for changes.
var EventEvery = time.Second

// keepAliveEvery is how often an idle stream sends a comment, so proxies
// and the browser keep it open.
const keepAliveEvery = 15 * time.Second

// JobSummary is one job in the "jobs" event.
type JobSummary struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	State     jobs.State      `json:"state"`
	Reason    string          `json:"reason,omitempty"`
	Confirmed bool            `json:"confirmed"`
	Cost      uint64          `json:"cost"`
	Updated   time.Time       `json:"updated"`
	Workers   []WorkerSummary `json:"workers"`
	Queue     *jobs.Queued    `json:"queue,omitempty"`
	Summary   *jobs.Summary   `json:"summary,omitempty"`
}

// WorkerSummary is a job's worker in the "jobs" event.
type WorkerSummary struct {
	Machine  string          `json:"machine"`
	State    p2p.WorkerState `json:"state"`
	LastSeen time.Time       `json:"last_seen,omitzero"`
}

// OfferSummary is one offer in the "offers" event: what a change of the
// market's offers (not a mere re-announcement) is judged by.
type OfferSummary struct {
	Machine  string `json:"machine"`
	Cores    uint32 `json:"cores"`
	MemBytes uint64 `json:"mem_bytes"`
	GPUs     uint32 `json:"gpus"`
	Price    uint64 `json:"price"`
	Busy     uint32 `json:"allocated_cores"`
}

// eventTopics computes each topic's current payload; a topic whose source
// fails this time is left out.
func (s *Server) eventTopics(r *http.Request) map[string]any {
	out := map[string]any{}
	ctx := r.Context()
	if s.p.Status != nil {
		st := s.p.Status.Status()
		st.UptimeS = 0 // changes every second; the page counts it itself
		out["status"] = st
	}
	if s.p.Lending != nil {
		out["lend"] = s.p.Lending.Lend()
	}
	if s.p.Ledger != nil {
		if b, err := s.p.Ledger.Balance(ctx, ""); err == nil {
			b.Height = 0
			out["balance"] = b
		}
	}
	if s.p.Jobs != nil {
		if l, err := s.p.Jobs.Jobs(ctx); err == nil {
			sum := make([]JobSummary, 0, len(l))
			for _, j := range l {
				js := JobSummary{ID: j.ID, Name: j.Spec.Name, State: j.State, Reason: j.Reason, Confirmed: j.Confirmed, Cost: j.Cost,
					Updated: j.Updated, Workers: []WorkerSummary{}, Queue: j.Queue, Summary: j.Summary}
				for _, w := range j.Workers {
					js.Workers = append(js.Workers, WorkerSummary{Machine: w.Machine, State: w.State, LastSeen: w.LastSeen})
				}
				sum = append(sum, js)
			}
			out["jobs"] = sum
		}
	}
	if s.p.Market != nil {
		offers := s.p.Market.Offers()
		sum := make([]OfferSummary, 0, len(offers))
		for _, o := range offers {
			sum = append(sum, OfferSummary{Machine: o.Machine, Cores: o.Cores, MemBytes: o.MemBytes, GPUs: o.GPUs, Price: o.Price, Busy: o.Allocated.Cores})
		}
		slices.SortFunc(sum, func(a, b OfferSummary) int { return strings.Compare(a.Machine, b.Machine) })
		out["offers"] = sum
		out["peers"] = map[string]int{"count": len(s.p.Market.Peers())}
	}
	return out
}

// sse prepares w for an event stream; false when w cannot flush.
func sse(w http.ResponseWriter) (http.Flusher, bool) {
	f, ok := w.(http.Flusher)
	if !ok {
		writeJSON(w, http.StatusInternalServerError, &Error{Message: "streaming unsupported"})
		return nil, false
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	f.Flush()
	return f, true
}

func writeEvent(w http.ResponseWriter, name string, data []byte) error {
	_, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data)
	return err
}

// events streams the topics until the client goes or the node stops.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	if s.refuse(w, r) {
		return
	}
	f, ok := sse(w)
	if !ok {
		return
	}
	fmt.Fprintf(w, "retry: 2000\n\n")
	last := map[string][]byte{}
	tick := time.NewTicker(EventEvery)
	defer tick.Stop()
	lastWrite := time.Now()
	for {
		topics := s.eventTopics(r)
		names := make([]string, 0, len(topics))
		for k := range topics {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, name := range names {
			b, err := json.Marshal(topics[name])
			if err != nil || bytes.Equal(b, last[name]) {
				continue
			}
			last[name] = b
			if writeEvent(w, name, b) != nil {
				return
			}
			lastWrite = time.Now()
		}
		if time.Since(lastWrite) >= keepAliveEvery {
			if _, err := fmt.Fprintf(w, ": keep-alive\n\n"); err != nil {
				return
			}
			lastWrite = time.Now()
		}
		f.Flush()
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}

// logStream streams a job's log from ?offset= as "log" events ({data,
// next}) and ends with a "done" event once the job has ended and its log
// is all sent.
func (s *Server) logStream(w http.ResponseWriter, r *http.Request) {
	if s.refuse(w, r) {
		return
	}
	id := r.PathValue("id")
	off, _ := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	// The first read answers errors (no such job) as JSON, before the
	// stream starts.
	lg, err := s.p.Jobs.Logs(r.Context(), id, off)
	if err != nil {
		writeError(w, err)
		return
	}
	f, ok := sse(w)
	if !ok {
		return
	}
	lastWrite := time.Now()
	for {
		if lg.Data != "" {
			b, _ := json.Marshal(lg)
			if writeEvent(w, "log", b) != nil {
				return
			}
			off, lastWrite = lg.Next, time.Now()
		}
		if lg.Done {
			writeEvent(w, "done", []byte("{}"))
			f.Flush()
			return
		}
		if time.Since(lastWrite) >= keepAliveEvery {
			if _, err := fmt.Fprintf(w, ": keep-alive\n\n"); err != nil {
				return
			}
			lastWrite = time.Now()
		}
		f.Flush()
		if lg.Data == "" {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
		if lg, err = s.p.Jobs.Logs(r.Context(), id, off); err != nil {
			b, _ := json.Marshal(toAPIError(err))
			writeEvent(w, "error", b)
			f.Flush()
			return
		}
	}
}
