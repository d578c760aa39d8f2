package shardingconfig

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placement"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
)

func TestUnservedBuckets(t *testing.T) {
	shard := func(cluster, buckets string, state ctrlmeshv1alpha1.ShardState, health ctrlmeshv1alpha1.ShardHealth) ctrlmeshv1alpha1.ShardPlacement {
		return ctrlmeshv1alpha1.ShardPlacement{Cluster: cluster, Buckets: buckets, State: state, Health: health}
	}
	const serving, pending, healthy, unhealthy, unknown = ctrlmeshv1alpha1.ShardServing, ctrlmeshv1alpha1.ShardPending,
		ctrlmeshv1alpha1.ShardHealthy, ctrlmeshv1alpha1.ShardUnhealthy, ctrlmeshv1alpha1.ShardHealthUnknown
	tests := []struct {
		name      string
		scope     ctrlmeshv1alpha1.ShardingScope
		domains   int
		placement []ctrlmeshv1alpha1.ShardPlacement
		want      int
	}{
		{"all served", ctrlmeshv1alpha1.ScopePerCluster, 2, []ctrlmeshv1alpha1.ShardPlacement{
			shard("a", "0-15", serving, healthy), shard("a", "16-31", serving, healthy), shard("b", "0-31", serving, healthy)}, 0},
		{"an unhealthy owner serves nothing", ctrlmeshv1alpha1.ScopePerCluster, 2, []ctrlmeshv1alpha1.ShardPlacement{
			shard("a", "0-15", serving, unhealthy), shard("a", "16-31", serving, healthy), shard("b", "0-31", serving, healthy)}, 16},
		{"pending and unknown", ctrlmeshv1alpha1.ScopePerCluster, 2, []ctrlmeshv1alpha1.ShardPlacement{
			shard("a", "0-7", pending, healthy), shard("a", "8-31", serving, healthy), shard("b", "0-31", serving, unknown)}, 40},
		{"a cluster without shards", ctrlmeshv1alpha1.ScopePerCluster, 2, []ctrlmeshv1alpha1.ShardPlacement{
			shard("a", "0-31", serving, healthy)}, 32},
		{"fleet: one domain across clusters", ctrlmeshv1alpha1.ScopeFleet, 1, []ctrlmeshv1alpha1.ShardPlacement{
			shard("a", "0-15", serving, healthy), shard("b", "16-30", serving, healthy)}, 1},
		{"overlapping shards count once", ctrlmeshv1alpha1.ScopeFleet, 1, []ctrlmeshv1alpha1.ShardPlacement{
			shard("a", "0-20", serving, healthy), shard("b", "16-31", serving, healthy)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := &ctrlmeshv1alpha1.ShardingConfig{Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Scope: tt.scope, Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: 32}}}
			if got := unservedBuckets(sc, tt.domains, tt.placement); got != tt.want {
				t.Errorf("unservedBuckets = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestServingMetricsObserveStatus: the shard counts follow the status, the
// proxies behind the placed generation are counted, and the handover and
// unserved intervals are observed when they end.
func TestServingMetricsObserveStatus(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	sc := &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "operator"},
		Spec:       ctrlmeshv1alpha1.ShardingConfigSpec{Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: 32}},
	}
	mems := members([]string{"a", "b"})
	// Neither member has reported: both pods' proxies are behind.
	handingOver := &outcome{members: mems, domains: []domainOutcome{{step: placement.Step{Table: route.Table{Generation: 3, Shards: []route.Shard{
		tableShard(t, "0", "0-15", "16-23", pods("a", "a-0")...)}}}}}}
	status := &ctrlmeshv1alpha1.ShardingConfigStatus{Placement: []ctrlmeshv1alpha1.ShardPlacement{
		{Shard: "0", Cluster: "a", Buckets: "0-15", State: ctrlmeshv1alpha1.ShardPending, Health: ctrlmeshv1alpha1.ShardUnhealthy},
	}}
	t0 := time.Unix(1000, 0)
	m.serving.observeStatus(sc, handingOver, status, t0)
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{"ctrlmesh_hub_shards", "health=Unhealthy,name=operator,namespace=ops,state=Pending", 1},
		{"ctrlmesh_hub_unserved_buckets", "name=operator,namespace=ops", 32},
		{"ctrlmesh_hub_clusters_selected", "name=operator,namespace=ops", 2},
		{"ctrlmesh_hub_proxies_behind", "name=operator,namespace=ops", 1},
	} {
		if got, ok := value(t, reg, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s{%s} = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}

	// The handover ends 30s later, and every bucket is served: one
	// observation each, of 30s; the Pending series is gone.
	done := &outcome{members: mems, domains: []domainOutcome{{step: placement.Step{Table: route.Table{Generation: 3, Shards: []route.Shard{
		tableShard(t, "0", "0-31", "")}}}}}}
	status = &ctrlmeshv1alpha1.ShardingConfigStatus{Placement: []ctrlmeshv1alpha1.ShardPlacement{
		{Shard: "0", Cluster: "a", Buckets: "0-31", State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
	}}
	m.serving.observeStatus(sc, done, status, t0.Add(30*time.Second))
	if _, ok := value(t, reg, "ctrlmesh_hub_shards", "health=Unhealthy,name=operator,namespace=ops,state=Pending"); ok {
		t.Error("the Pending shard series outlived the status that had it")
	}
	if got, ok := value(t, reg, "ctrlmesh_hub_proxies_behind", "name=operator,namespace=ops"); !ok || got != 0 {
		t.Errorf("ctrlmesh_hub_proxies_behind = %v (present %v) with no proxy behind, want 0", got, ok)
	}
	if got, _ := value(t, reg, "ctrlmesh_hub_unserved_buckets", "name=operator,namespace=ops"); got != 0 {
		t.Errorf("unserved = %v, want 0", got)
	}
	for _, h := range []string{"ctrlmesh_hub_handover_duration_seconds", "ctrlmesh_hub_unserved_duration_seconds"} {
		s := series(t, reg, h)[""]
		if s.GetHistogram().GetSampleCount() != 1 || s.GetHistogram().GetSampleSum() != 30 {
			t.Errorf("%s = %v, want one sample of 30s", h, s.GetHistogram())
		}
	}

	m.forget(sc)
	for _, name := range []string{"ctrlmesh_hub_shards", "ctrlmesh_hub_unserved_buckets", "ctrlmesh_hub_clusters_selected", "ctrlmesh_hub_proxies_behind"} {
		if s := series(t, reg, name); len(s) != 0 {
			t.Errorf("%s: %d series after forget, want none", name, len(s))
		}
	}
}

// TestServingMetricsPerConfig: a config's series follow its own status
// alone — another config's stay, and observing the same status again
// counts nothing twice —, and they grow with configs, not with their
// clusters: proxies behind in two clusters are one series.
func TestServingMetricsPerConfig(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	config := func(name string) *ctrlmeshv1alpha1.ShardingConfig {
		return &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: name},
			Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: 32}}}
	}
	placed := &outcome{members: members([]string{"a", "b"}), domains: []domainOutcome{
		{step: placement.Step{Table: route.Table{Generation: 1, Shards: []route.Shard{tableShard(t, "0", "0-31", "", pods("a", "a-0", "a-1")...)}}}},
		{step: placement.Step{Table: route.Table{Generation: 1, Shards: []route.Shard{tableShard(t, "0", "0-31", "", pods("b", "b-0")...)}}}},
	}}
	status := &ctrlmeshv1alpha1.ShardingConfigStatus{Placement: []ctrlmeshv1alpha1.ShardPlacement{
		{Shard: "0", Cluster: "a", Buckets: "0-31", State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
		{Shard: "1", Cluster: "a", Buckets: "0-31", State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
		{Shard: "0", Cluster: "b", Buckets: "0-31", State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
	}}
	t0 := time.Unix(1000, 0)
	for _, name := range []string{"one", "two", "one"} {
		m.serving.observeStatus(config(name), placed, status, t0)
	}
	want := map[string]float64{}
	for _, name := range []string{"one", "two"} {
		want["ctrlmesh_hub_shards{health=Healthy,name="+name+",namespace=ops,state=Serving}"] = 3
		want["ctrlmesh_hub_proxies_behind{name="+name+",namespace=ops}"] = 3
	}
	check := func(when string) {
		t.Helper()
		got := map[string]float64{}
		for _, metric := range []string{"ctrlmesh_hub_shards", "ctrlmesh_hub_proxies_behind"} {
			for labels, s := range series(t, reg, metric) {
				got[metric+"{"+labels+"}"] = s.GetGauge().GetValue()
			}
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: series %v, want %v", when, got, want)
		}
	}
	check("both configs observed, one twice")

	// One loses cluster b: its series of b go, two's stay.
	onlyA := &outcome{members: members([]string{"a"}), domains: placed.domains[:1]}
	m.serving.observeStatus(config("one"), onlyA, &ctrlmeshv1alpha1.ShardingConfigStatus{Placement: status.Placement[:2]}, t0)
	want["ctrlmesh_hub_shards{health=Healthy,name=one,namespace=ops,state=Serving}"] = 2
	want["ctrlmesh_hub_proxies_behind{name=one,namespace=ops}"] = 2
	check("one without cluster b")

	// Two's proxy in b reports enforcing generation 1: two has the two of
	// a behind.
	enforcing := members([]string{"a", "b"})
	enforcing["b"].published = &state.Published{Revision: state.Revision{Generation: 1, RulesHash: "h1"}, History: []state.Revision{{Generation: 1, RulesHash: "h1"}}}
	enforcing["b"].report = &state.Report{Pods: []state.Pod{{Name: "b-0", AppliedRulesHash: "h1"}}}
	m.serving.observeStatus(config("two"), &outcome{members: enforcing, domains: placed.domains}, status, t0)
	want["ctrlmesh_hub_proxies_behind{name=two,namespace=ops}"] = 2
	check("two's proxy in b enforcing")

	m.forget(config("two"))
	for key := range want {
		if strings.Contains(key, "name=two") {
			delete(want, key)
		}
	}
	check("two forgotten")
}

// BenchmarkObserveStatus observes one config's status of 10 members among
// 10 and 1000 configs: the cost must not grow with the other configs'
// series (a deletion by partial match scanned them all).
func BenchmarkObserveStatus(b *testing.B) {
	clusters := []string{"c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9"}
	out := &outcome{members: members(clusters)}
	status := &ctrlmeshv1alpha1.ShardingConfigStatus{}
	for _, c := range clusters {
		out.domains = append(out.domains, domainOutcome{step: placement.Step{Table: route.Table{Generation: 1,
			Shards: []route.Shard{tableShard(b, "0", "0-31", "", pods(c, c+"-0")...)}}}})
		status.Placement = append(status.Placement, ctrlmeshv1alpha1.ShardPlacement{Shard: "0", Cluster: c, Buckets: "0-31",
			State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy})
	}
	for _, configs := range []int{10, 1000} {
		b.Run(fmt.Sprintf("configs=%d", configs), func(b *testing.B) {
			m, err := NewMetrics(prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			config := func(i int) *ctrlmeshv1alpha1.ShardingConfig {
				return &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: fmt.Sprintf("op%04d", i)},
					Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: 32}}}
			}
			for i := range configs {
				m.serving.observeStatus(config(i), out, status, time.Unix(0, 0))
			}
			sc := config(0)
			for b.Loop() {
				m.serving.observeStatus(sc, out, status, time.Unix(0, 0))
			}
		})
	}
}

// TestServingMetricsRegisteredAgain: a hub run again in one process finds
// its vectors registered by the first, and records its series in those.
func TestServingMetricsRegisteredAgain(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	again, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	sc := &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "op"},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: 32}}}
	out := &outcome{members: members([]string{"a"}), domains: []domainOutcome{{step: placement.Step{Table: route.Table{Generation: 1,
		Shards: []route.Shard{tableShard(t, "0", "0-31", "", pods("a", "a-0")...)}}}}}}
	status := &ctrlmeshv1alpha1.ShardingConfigStatus{Placement: []ctrlmeshv1alpha1.ShardPlacement{
		{Shard: "0", Cluster: "a", Buckets: "0-31", State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy}}}
	again.serving.observeStatus(sc, out, status, time.Unix(0, 0))
	if got, ok := value(t, reg, "ctrlmesh_hub_shards", "health=Healthy,name=op,namespace=ops,state=Serving"); !ok || got != 1 {
		t.Errorf("ctrlmesh_hub_shards = %v (present %v), want 1", got, ok)
	}
}
