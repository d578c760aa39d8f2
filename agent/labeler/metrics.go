package labeler

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ctrlmesh/ctrlmesh/pkg/metricsutil"
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
	// The agent replaces its Labeler when the rules change; the new one keeps
	// counting into the collectors the first one registered.
	var err error
	if m.unlabelled, err = metricsutil.Register(reg, m.unlabelled); err != nil {
		return nil, err
	}
	if m.labelsWritten, err = metricsutil.Register(reg, m.labelsWritten); err != nil {
		return nil, err
	}
	return m, nil
}
