package storage

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts what the store adds, fetches and rejects. A nil *Metrics
// records nothing.
type Metrics struct {
	bytes    *prometheus.CounterVec
	corrupt  prometheus.Counter
	gcBlocks prometheus.Counter
}

// NewMetrics registers the storage metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "deepmarket", Subsystem: "storage", Name: "bytes_total",
			Help: "Block bytes imported (add), fetched from peers (fetch) and exported to files (export).",
		}, []string{"op"}),
		corrupt: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "deepmarket", Subsystem: "storage", Name: "corrupt_blocks_total",
			Help: "Blocks on this node's disk whose bytes did not match their CID; each was dropped and fetched again.",
		}),
		gcBlocks: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "deepmarket", Subsystem: "storage", Name: "gc_removed_blocks_total",
			Help: "Unpinned blocks removed by garbage collection.",
		}),
	}
	reg.MustRegister(m.bytes, m.corrupt, m.gcBlocks)
	return m
}

func (m *Metrics) addBytes(op string, n int64) {
	if m != nil {
		m.bytes.WithLabelValues(op).Add(float64(n))
	}
}

func (m *Metrics) incCorrupt() {
	if m != nil {
		m.corrupt.Inc()
	}
}

func (m *Metrics) addGC(n int) {
	if m != nil {
		m.gcBlocks.Add(float64(n))
	}
}
