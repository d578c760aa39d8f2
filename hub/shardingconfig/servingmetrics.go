package shardingconfig

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/metricsutil"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// servingMetrics say, from the status the hub writes, whether every bucket
// has a live owner: what the alerts in deploy/monitoring and the dashboard
// read. The gauges of metrics.go describe the placement computed; these
// describe what the members report serving.
//
// Their series grow with ShardingConfigs, not with ShardingConfigs x
// members: at 1000 members x 100 configs a series per config and member
// would be 100,000 series or more, a load on the hub (about 1 KB of heap
// each) and on Prometheus alike. The status names the clusters. That holds
// for proxiesBehind too: by cluster, it had a series for every config and
// member whose proxies had not yet acknowledged their rules, none in
// steady state but every one during an apply, 55 MB of the hub's heap at
// 1000 x 100 (make bench-scale).
type servingMetrics struct {
	shards          *prometheus.GaugeVec
	unserved        *prometheus.GaugeVec
	clustersChosen  *prometheus.GaugeVec
	proxiesBehind   *prometheus.GaugeVec
	handoverSeconds prometheus.Histogram
	unservedSeconds prometheus.Histogram

	// Since when a config has had handovers pending, and buckets unserved.
	mu               sync.Mutex
	handingOverSince map[types.NamespacedName]time.Time
	unservedSince    map[types.NamespacedName]time.Time
	// The series each config has in shards.
	shardSeries map[types.NamespacedName]seriesSet
}

// seriesSet is the series of one config in a vector, by their label values
// joined.
type seriesSet map[string]labelled

type labelled struct {
	labels []string
	value  float64
}

// add adds value to the series of those label values.
func (s seriesSet) add(value float64, labels ...string) {
	key := strings.Join(labels, "\x00")
	e := s[key]
	e.labels, e.value = labels, e.value+value
	s[key] = e
}

// setShards gives config's series in shards the values of next, and
// deletes those it had (shardSeries) and next has not. A deletion by
// partial match (namespace and name) would find them too, but scans every
// series of the vector, so at 10 members x 1000 configs it took half the
// hub's CPU when the vector had a series per config and member (make
// bench-scale). Gauges are set rather than deleted and counted up again,
// so a scrape never sees a config's series half counted.
func (m *servingMetrics) setShards(config types.NamespacedName, next seriesSet) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range next {
		m.shards.WithLabelValues(e.labels...).Set(e.value)
	}
	for key, e := range m.shardSeries[config] {
		if _, ok := next[key]; !ok {
			m.shards.DeleteLabelValues(e.labels...)
		}
	}
	if next == nil {
		delete(m.shardSeries, config)
		return
	}
	m.shardSeries[config] = next
}

func newServingMetrics(reg prometheus.Registerer) (*servingMetrics, error) {
	durations := prometheus.ExponentialBuckets(0.5, 2, 14) // 0.5s .. ~68min
	m := &servingMetrics{
		shards: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ctrlmesh_hub_shards",
			Help: "Shards in a ShardingConfig's status, by state (Pending, Serving, Draining) and health (Healthy, Unhealthy, Unknown); the status names their clusters.",
		}, []string{"namespace", "name", "state", "health"}),
		unserved: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ctrlmesh_hub_unserved_buckets",
			Help: "Buckets, summed over a ShardingConfig's placement domains, that no Serving and Healthy shard serves: unowned, pending, or owned by a shard without a live leader enforcing the rules; 0 in steady state.",
		}, []string{"namespace", "name"}),
		clustersChosen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ctrlmesh_hub_clusters_selected",
			Help: "Member clusters spec.clusters of a ShardingConfig selects; ctrlmesh_hub_clusters_available of them are usable.",
		}, []string{"namespace", "name"}),
		proxiesBehind: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ctrlmesh_hub_proxies_behind",
			Help: "Pods of a ShardingConfig's shards whose proxy does not report enforcing the routing generation placed; 0 in steady state. The status lists their shards as Pending and names their clusters and pods.",
		}, []string{"namespace", "name"}),
		handoverSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ctrlmesh_hub_handover_duration_seconds",
			Help:    "Time a ShardingConfig had buckets waiting for their previous owner to let go, from the first placement that moved them until none waited.",
			Buckets: durations,
		}),
		unservedSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ctrlmesh_hub_unserved_duration_seconds",
			Help:    "Time a ShardingConfig had unserved buckets (ctrlmesh_hub_unserved_buckets > 0), until every bucket was served again: failover and start-up time.",
			Buckets: durations,
		}),
		handingOverSince: map[types.NamespacedName]time.Time{},
		unservedSince:    map[types.NamespacedName]time.Time{},
		shardSeries:      map[types.NamespacedName]seriesSet{},
	}
	var err error
	for _, g := range []**prometheus.GaugeVec{&m.shards, &m.unserved, &m.clustersChosen, &m.proxiesBehind} {
		if *g, err = metricsutil.Register(reg, *g); err != nil {
			return nil, err
		}
	}
	for _, h := range []*prometheus.Histogram{&m.handoverSeconds, &m.unservedSeconds} {
		if *h, err = metricsutil.Register(reg, *h); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observeStatus records what sc's status computed from out says is
// served, at now: written, or waiting for its turn at the status rate.
func (m *servingMetrics) observeStatus(sc *ctrlmeshv1alpha1.ShardingConfig, out *outcome, status *ctrlmeshv1alpha1.ShardingConfigStatus, now time.Time) {
	if out == nil || out.invalid != nil {
		return
	}
	key := types.NamespacedName{Namespace: sc.Namespace, Name: sc.Name}
	shards := seriesSet{}
	for _, p := range status.Placement {
		shards.add(1, sc.Namespace, sc.Name, string(p.State), string(p.Health))
	}
	m.setShards(key, shards)
	unserved := unservedBuckets(sc, len(out.domains), status.Placement)
	m.unserved.WithLabelValues(sc.Namespace, sc.Name).Set(float64(unserved))

	selected := 0
	for _, mem := range out.members {
		if !mem.leaving {
			selected++
		}
	}
	m.clustersChosen.WithLabelValues(sc.Namespace, sc.Name).Set(float64(selected))

	behind := 0
	for _, d := range out.domains {
		for _, rs := range d.step.Table.Shards {
			for _, id := range rs.Pods {
				if !out.members[id.Cluster].enforces(id.Name, d.step.Table.Generation) {
					behind++
				}
			}
		}
	}
	m.proxiesBehind.WithLabelValues(sc.Namespace, sc.Name).Set(float64(behind))

	pending := false
	for _, d := range out.domains {
		pending = pending || d.step.Table.HasPending()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	interval(m.handingOverSince, key, pending, now, m.handoverSeconds)
	interval(m.unservedSince, key, unserved > 0, now, m.unservedSeconds)
}

// interval observes into h how long a condition held, when it stops holding.
func interval(since map[types.NamespacedName]time.Time, key types.NamespacedName, holds bool, now time.Time, h prometheus.Histogram) {
	start, held := since[key]
	switch {
	case holds && !held:
		since[key] = now
	case !holds && held:
		h.Observe(now.Sub(start).Seconds())
		delete(since, key)
	}
}

// unservedBuckets counts the buckets of each placement domain that no
// Serving and Healthy shard serves. A PerCluster config has a domain per
// cluster, whose shards name it; a Fleet config one domain.
func unservedBuckets(sc *ctrlmeshv1alpha1.ShardingConfig, domains int, placement []ctrlmeshv1alpha1.ShardPlacement) int {
	space, err := sharding.NewSpace(int(sc.Spec.Sharding.Buckets))
	if err != nil {
		return 0
	}
	served := map[string]sharding.Set{}
	for _, p := range placement {
		if p.State != ctrlmeshv1alpha1.ShardServing || p.Health != ctrlmeshv1alpha1.ShardHealthy {
			continue
		}
		domain := p.Cluster
		if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
			domain = ""
		}
		set, err := space.ParseSet(p.Buckets)
		if err != nil {
			// The hub wrote it from a Set; it parses.
			continue
		}
		if prev, ok := served[domain]; ok {
			set = set.Union(prev)
		}
		served[domain] = set
	}
	unserved := domains * space.Buckets()
	for _, set := range served {
		unserved -= set.Len()
	}
	return max(unserved, 0)
}

// forget drops the series and intervals of a deleted ShardingConfig.
func (m *servingMetrics) forget(sc *ctrlmeshv1alpha1.ShardingConfig) {
	key := types.NamespacedName{Namespace: sc.Namespace, Name: sc.Name}
	m.setShards(key, nil)
	m.proxiesBehind.DeleteLabelValues(sc.Namespace, sc.Name)
	m.unserved.DeleteLabelValues(sc.Namespace, sc.Name)
	m.clustersChosen.DeleteLabelValues(sc.Namespace, sc.Name)
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.handingOverSince, key)
	delete(m.unservedSince, key)
}

// enforces reports whether the member reports the pod's proxy enforcing
// the rules of generation gen or newer.
func (m *member) enforces(pod string, gen int64) bool {
	p, reported := m.pod(pod)
	if !reported {
		return false
	}
	got, ok := m.generationOf(p.AppliedRulesHash)
	return ok && got >= gen
}
