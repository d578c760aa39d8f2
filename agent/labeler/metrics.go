package labeler

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics of one Labeler.
type metrics struct {
	unlabelled    *prometheus.GaugeVec
	labelsWritten *prometheus.CounterVec
}

// newMetrics makes the labeller's metrics and registers them on reg, unless
// reg is nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		unlabelled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ctrlmesh_agent_unlabelled_objects",
			Help: "Objects in controlled namespaces found lacking ctrlmesh labels, or holding wrong ones, at the last complete sweep, before patching; by resource.",
		}, []string{"resource"}),
		labelsWritten: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctrlmesh_agent_labels_written_total",
			Help: "Objects whose ctrlmesh labels a sweep patched, by resource.",
		}, []string{"resource"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.unlabelled, m.labelsWritten} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("labeler: registering metrics: %w", err)
		}
	}
	return m, nil
}
