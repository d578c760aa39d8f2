package shardingconfig

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placement"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
)

// The metrics are read back from the registry. (prometheus/testutil needs
// github.com/kylelemons/godebug, which go.mod does not require.)

// series are the series of one metric in reg, by their labels as
// "name=value" pairs sorted by name and joined with ","; nil if the metric
// has none.
func series(t *testing.T, reg *prometheus.Registry, name string) map[string]*dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering the metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		out := map[string]*dto.Metric{}
		for _, m := range f.GetMetric() {
			var key string
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetName() + "=" + l.GetValue()
			}
			out[key] = m
		}
		return out
	}
	return nil
}

// value is the value of a gauge or counter series; ok is false when the
// series does not exist.
func value(t *testing.T, reg *prometheus.Registry, name, labels string) (v float64, ok bool) {
	t.Helper()
	m, ok := series(t, reg, name)[labels]
	switch {
	case !ok:
		return 0, false
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	}
	t.Fatalf("%s{%s} is neither a gauge nor a counter", name, labels)
	return 0, false
}

func TestMetricsObserve(t *testing.T) {
	domain := func(shards ...route.Shard) domainOutcome {
		return domainOutcome{step: placement.Step{Table: route.Table{Generation: 2, Shards: shards}}}
	}
	tests := []struct {
		name string
		out  *outcome
		// -1: the gauge has no value for the config.
		wantPending, wantUnowned, wantClusters float64
		wantOutcome                            string
	}{{
		name:         "steady state",
		out:          &outcome{members: members([]string{"a", "b"}), domains: []domainOutcome{domain(tableShard(t, "0", "0-15", ""), tableShard(t, "1", "16-31", ""))}},
		wantPending:  0,
		wantUnowned:  0,
		wantClusters: 2,
		wantOutcome:  "placed",
	}, {
		name: "pending buckets are not owned yet",
		out: &outcome{members: members([]string{"a", "b", "c"}, "b"), domains: []domainOutcome{
			domain(tableShard(t, "0", "0-7", ""), tableShard(t, "1", "16-31", "8-15")),
			domain(tableShard(t, "0", "0-31", "")),
		}},
		wantPending:  1,
		wantUnowned:  8,
		wantClusters: 2,
		wantOutcome:  "placed",
	}, {
		name: "pending namespaces",
		out: &outcome{members: members([]string{"a", "b"}), domains: []domainOutcome{
			domain(tableShard(t, "0", "0-31", ""), route.Shard{
				ID: "canary", Canary: true, Buckets: mustSet(t, ""), PendingBuckets: mustSet(t, ""), PendingNamespaces: []string{"team-a"},
			}),
			domain(tableShard(t, "0", "0-15", "16-23")),
		}},
		wantPending:  2,
		wantUnowned:  16,
		wantClusters: 2,
		wantOutcome:  "placed",
	}, {
		name: "a bucket two shards serve counts once",
		out: &outcome{members: members([]string{"a"}), domains: []domainOutcome{
			domain(tableShard(t, "0", "0-20", ""), tableShard(t, "1", "16-30", "")),
		}},
		wantPending:  0,
		wantUnowned:  1,
		wantClusters: 1,
		wantOutcome:  "placed",
	}, {
		name:         "a domain with no shards owns nothing",
		out:          &outcome{members: members([]string{"a", "b"}, "a", "b"), domains: []domainOutcome{domain(), domain()}},
		wantPending:  0,
		wantUnowned:  64,
		wantClusters: 0,
		wantOutcome:  "placed",
	}, {
		name:         "no clusters",
		out:          &outcome{members: members(nil)},
		wantPending:  0,
		wantUnowned:  0,
		wantClusters: 0,
		wantOutcome:  "placed",
	}, {
		name:         "invalid",
		out:          &outcome{members: members([]string{"a"}), invalid: errors.New("bad")},
		wantPending:  -1,
		wantUnowned:  -1,
		wantClusters: -1,
		wantOutcome:  "invalid",
	}, {
		name:         "failed",
		wantPending:  -1,
		wantUnowned:  -1,
		wantClusters: -1,
		wantOutcome:  "failed",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m, err := NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			sc := &ctrlmeshv1alpha1.ShardingConfig{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "operator"},
				Spec:       ctrlmeshv1alpha1.ShardingConfigSpec{Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: 32}},
			}
			m.observe(sc, tt.out, 250*time.Millisecond)
			for _, g := range []struct {
				name string
				want float64
			}{
				{"ctrlmesh_hub_handovers_pending", tt.wantPending},
				{"ctrlmesh_hub_unowned_buckets", tt.wantUnowned},
				{"ctrlmesh_hub_clusters_available", tt.wantClusters},
			} {
				if g.want < 0 {
					if s := series(t, reg, g.name); s != nil {
						t.Errorf("%s: %d series, want none", g.name, len(s))
					}
					continue
				}
				if got, ok := value(t, reg, g.name, "name=operator,namespace=ops"); !ok || got != g.want {
					t.Errorf("%s = %v (present: %v), want %v", g.name, got, ok, g.want)
				}
			}
			for _, outcome := range []string{"placed", "invalid", "failed"} {
				got, ok := value(t, reg, "ctrlmesh_hub_placement_computations_total", "name=operator,namespace=ops,outcome="+outcome)
				if want := outcome == tt.wantOutcome; ok != want || (ok && got != 1) {
					t.Errorf("computations{outcome=%q} = %v (present: %v), want present: %v, 1", outcome, got, ok, want)
				}
			}
			d, ok := series(t, reg, "ctrlmesh_hub_placement_duration_seconds")[""]
			if !ok || d.GetHistogram().GetSampleCount() != 1 || d.GetHistogram().GetSampleSum() != 0.25 {
				t.Errorf("duration %v, want one sample of 0.25s", d)
			}
		})
	}
}

// TestMetricsObserveUpdates: the gauges follow the latest placement of
// each config, and a failed placement leaves them as they were.
func TestMetricsObserveUpdates(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	sc := func(name string) *ctrlmeshv1alpha1.ShardingConfig {
		return &ctrlmeshv1alpha1.ShardingConfig{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: name},
			Spec:       ctrlmeshv1alpha1.ShardingConfigSpec{Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: 32}},
		}
	}
	handingOver := &outcome{members: members([]string{"a", "b"}, "b"), domains: []domainOutcome{{step: placement.Step{Table: route.Table{
		Generation: 3, Shards: []route.Shard{tableShard(t, "0", "0-15", ""), tableShard(t, "1", "", "16-31")},
	}}}}}
	settled := &outcome{members: members([]string{"a", "b"}), domains: []domainOutcome{{step: placement.Step{Table: route.Table{
		Generation: 4, Shards: []route.Shard{tableShard(t, "0", "0-15", ""), tableShard(t, "1", "16-31", "")},
	}}}}}
	check := func(when, name string, pending, unowned, clusters float64) {
		t.Helper()
		for _, g := range []struct {
			metric string
			want   float64
		}{
			{"ctrlmesh_hub_handovers_pending", pending},
			{"ctrlmesh_hub_unowned_buckets", unowned},
			{"ctrlmesh_hub_clusters_available", clusters},
		} {
			if got, ok := value(t, reg, g.metric, "name="+name+",namespace=ops"); !ok || got != g.want {
				t.Errorf("%s: %s{%s} = %v (present: %v), want %v", when, g.metric, name, got, ok, g.want)
			}
		}
	}
	m.observe(sc("one"), handingOver, time.Millisecond)
	m.observe(sc("two"), settled, time.Millisecond)
	check("handing over", "one", 1, 16, 1)
	check("handing over", "two", 0, 0, 2)
	m.observe(sc("one"), nil, time.Millisecond)
	check("after a failure", "one", 1, 16, 1)
	m.observe(sc("one"), settled, time.Millisecond)
	check("settled", "one", 0, 0, 2)

	m.forget(sc("one"))
	for _, name := range []string{"ctrlmesh_hub_handovers_pending", "ctrlmesh_hub_unowned_buckets", "ctrlmesh_hub_clusters_available"} {
		s := series(t, reg, name)
		if _, ok := s["name=two,namespace=ops"]; !ok || len(s) != 1 {
			t.Errorf("after forgetting one config, %s has %d series, want only two's", name, len(s))
		}
	}
	for outcome, want := range map[string]float64{"placed": 2, "failed": 1} {
		if got, _ := value(t, reg, "ctrlmesh_hub_placement_computations_total", "name=one,namespace=ops,outcome="+outcome); got != want {
			t.Errorf("computations of one, %s = %v, want %v", outcome, got, want)
		}
	}
}
