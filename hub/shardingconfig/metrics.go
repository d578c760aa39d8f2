package shardingconfig

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/metricsutil"
)

// Metrics of the controller.
type Metrics struct {
	computations     *prometheus.CounterVec
	duration         prometheus.Histogram
	bucketsMoved     *prometheus.CounterVec
	handoversPending *prometheus.GaugeVec
	unownedBuckets   *prometheus.GaugeVec
	clustersUsable   *prometheus.GaugeVec
	// serving: what the status says is served (servingmetrics.go).
	serving *servingMetrics
}

// NewMetrics makes the controller's metrics and registers them on reg, or
// reuses those registered before (a hub run again in one process).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		computations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctrlmesh_hub_placement_computations_total",
			Help: "Placements computed, by ShardingConfig and outcome (placed, invalid, failed).",
		}, []string{"namespace", "name", "outcome"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ctrlmesh_hub_placement_duration_seconds",
			Help:    "Time to compute and publish one ShardingConfig's placement.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		bucketsMoved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctrlmesh_hub_buckets_moved_total",
			Help: "Buckets granted to a shard that did not serve them, by ShardingConfig.",
		}, []string{"namespace", "name"}),
		handoversPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ctrlmesh_hub_handovers_pending",
			Help: "Placement domains of a ShardingConfig with buckets waiting for their previous owner to let go.",
		}, []string{"namespace", "name"}),
		unownedBuckets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ctrlmesh_hub_unowned_buckets",
			Help: "Buckets no shard serves, summed over a ShardingConfig's placement domains; 0 in steady state.",
		}, []string{"namespace", "name"}),
		clustersUsable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ctrlmesh_hub_clusters_available",
			Help: "Selected member clusters that are accepted and have a fresh heartbeat, by ShardingConfig.",
		}, []string{"namespace", "name"}),
	}
	var err error
	for _, c := range []**prometheus.CounterVec{&m.computations, &m.bucketsMoved} {
		if *c, err = metricsutil.Register(reg, *c); err != nil {
			return nil, err
		}
	}
	for _, g := range []**prometheus.GaugeVec{&m.handoversPending, &m.unownedBuckets, &m.clustersUsable} {
		if *g, err = metricsutil.Register(reg, *g); err != nil {
			return nil, err
		}
	}
	if m.duration, err = metricsutil.Register(reg, m.duration); err != nil {
		return nil, err
	}
	if m.serving, err = newServingMetrics(reg); err != nil {
		return nil, err
	}
	return m, nil
}

// observe records one placement of sc; out is nil when it failed.
func (m *Metrics) observe(sc *ctrlmeshv1alpha1.ShardingConfig, out *outcome, took time.Duration) {
	m.duration.Observe(took.Seconds())
	switch {
	case out == nil:
		m.computations.WithLabelValues(sc.Namespace, sc.Name, "failed").Inc()
		return
	case out.invalid != nil:
		m.computations.WithLabelValues(sc.Namespace, sc.Name, "invalid").Inc()
		return
	}
	m.computations.WithLabelValues(sc.Namespace, sc.Name, "placed").Inc()
	pending, unowned, usable := 0, 0, 0
	for _, d := range out.domains {
		if d.step.Table.HasPending() {
			pending++
		}
		owned := make(map[int]bool)
		for _, s := range d.step.Table.Shards {
			for _, b := range s.Buckets.Buckets() {
				owned[b] = true
			}
		}
		unowned += int(sc.Spec.Sharding.Buckets) - len(owned)
	}
	for _, mem := range out.members {
		if mem.usable() {
			usable++
		}
	}
	m.handoversPending.WithLabelValues(sc.Namespace, sc.Name).Set(float64(pending))
	m.unownedBuckets.WithLabelValues(sc.Namespace, sc.Name).Set(float64(unowned))
	m.clustersUsable.WithLabelValues(sc.Namespace, sc.Name).Set(float64(usable))
}

// forget drops the gauges of a deleted ShardingConfig.
func (m *Metrics) forget(sc *ctrlmeshv1alpha1.ShardingConfig) {
	for _, v := range []*prometheus.GaugeVec{m.handoversPending, m.unownedBuckets, m.clustersUsable} {
		v.DeleteLabelValues(sc.Namespace, sc.Name)
	}
	m.serving.forget(sc)
}
