package labeler

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ctrlmesh/ctrlmesh/pkg/metricsutil"
)

// metrics of one Labeler.
type metrics struct {
	unlabeled     *prometheus.GaugeVec
	labelsWritten *prometheus.CounterVec
}

// newMetrics makes the labeler's metrics and registers them on reg, unless
// reg is nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		unlabeled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			// The metric keeps the name it was published with; the code says "unlabeled".
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
	// The agent replaces its Labeler when the targets change; the new one keeps
	// counting into the collectors the first one registered.
	var err error
	if m.unlabeled, err = metricsutil.Register(reg, m.unlabeled); err != nil {
		return nil, err
	}
	if m.labelsWritten, err = metricsutil.Register(reg, m.labelsWritten); err != nil {
		return nil, err
	}
	return m, nil
}
