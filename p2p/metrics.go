package p2p

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts what the p2p layer validates and publishes. A nil
// *Metrics records nothing, so tests and benchmarks can leave it out.
type Metrics struct {
	validated *prometheus.CounterVec
	published *prometheus.CounterVec
}

// NewMetrics registers the p2p metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		validated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "deepmarket", Subsystem: "p2p", Name: "messages_validated_total",
			Help: "Gossip messages validated, by topic, result (accept/reject), and type or rejection reason.",
		}, []string{"topic", "result", "reason"}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "deepmarket", Subsystem: "p2p", Name: "messages_published_total",
			Help: "Gossip messages this node published, by topic and type.",
		}, []string{"topic", "type"}),
	}
	reg.MustRegister(m.validated, m.published)
	return m
}

func (m *Metrics) incAccepted(topic, typ string) {
	if m != nil {
		m.validated.WithLabelValues(topic, "accept", typ).Inc()
	}
}

func (m *Metrics) incRejected(topic, reason string) {
	if m != nil {
		m.validated.WithLabelValues(topic, "reject", reason).Inc()
	}
}

func (m *Metrics) incPublished(topic, typ string) {
	if m != nil {
		m.published.WithLabelValues(topic, typ).Inc()
	}
}
