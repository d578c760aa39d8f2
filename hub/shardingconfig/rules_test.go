package shardingconfig

import (
	"reflect"
	"testing"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placement"
)

func TestPublishedRules(t *testing.T) {
	pending := func(rs ctrlmeshv1alpha1.RouteShard, buckets string, namespaces ...string) ctrlmeshv1alpha1.RouteShard {
		rs.PendingBuckets, rs.PendingNamespaces = buckets, namespaces
		return rs
	}
	canary := func(rs ctrlmeshv1alpha1.RouteShard, namespaces ...string) ctrlmeshv1alpha1.RouteShard {
		rs.Canary, rs.Namespaces = true, namespaces
		return rs
	}
	tests := []struct {
		name       string
		routes     map[string]*ctrlmeshv1alpha1.ShardRoute
		generation int64
		want       []ruleView
	}{{
		name: "nothing published",
	}, {
		name: "per cluster: one route, shards in ID order, pods sorted",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": route("c1", 3, 32,
				routeShard("10", "24-31", "p-e"),
				canary(routeShard("canary", "", "p-z"), "team-a"),
				routeShard("2", "16-23", "p-d", "p-c"),
				routeShard("0", "0-15", "p-b", "p-a"),
			),
		},
		generation: 3,
		want: []ruleView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "p-a", "p-b"), Buckets: "0-15"},
			{ID: "2", Cluster: "c1", Pods: pods("c1", "p-c", "p-d"), Buckets: "16-23"},
			{ID: "10", Cluster: "c1", Pods: pods("c1", "p-e"), Buckets: "24-31"},
			{ID: "canary", Cluster: "c1", Canary: true, Pods: pods("c1", "p-z"), Namespaces: []string{"team-a"}},
		},
	}, {
		name: "fleet: routes of one generation merge pods per shard, the cluster is the one listing them",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c2": route("c2", 4, 32,
				routeShard("0", "0-15"),
				routeShard("1", "16-31", "b2", "b1"),
				canary(routeShard("canary", "", "b3"), "team-a"),
			),
			"c1": route("c1", 4, 32,
				routeShard("0", "0-15", "a1"),
				routeShard("1", "16-31"),
				canary(routeShard("canary", ""), "team-a"),
			),
		},
		generation: 4,
		want: []ruleView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "a1"), Buckets: "0-15"},
			{ID: "1", Cluster: "c2", Pods: pods("c2", "b1", "b2"), Buckets: "16-31"},
			{ID: "canary", Cluster: "c2", Canary: true, Pods: pods("c2", "b3"), Namespaces: []string{"team-a"}},
		},
	}, {
		name: "fleet: a shard with pods in two clusters has them all",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": route("c1", 2, 32, routeShard("0", "0-31", "a1")),
			"c2": route("c2", 2, 32, routeShard("0", "0-31", "b1")),
		},
		generation: 2,
		want: []ruleView{
			{ID: "0", Cluster: "c1", Pods: append(pods("c1", "a1"), pods("c2", "b1")...), Buckets: "0-31"},
		},
	}, {
		name: "fleet: a shard no route lists pods for has no cluster",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": route("c1", 2, 32, routeShard("0", "0-15", "a1"), routeShard("1", "16-31")),
			"c2": route("c2", 2, 32, routeShard("0", "0-15"), routeShard("1", "16-31")),
		},
		generation: 2,
		want: []ruleView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "a1"), Buckets: "0-15"},
			{ID: "1", Buckets: "16-31"},
		},
	}, {
		name: "fleet: a route of an older generation is ignored",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": route("c1", 3, 32, routeShard("0", "0-15", "a1"), routeShard("1", "16-31", "a2")),
			"c2": route("c2", 5, 32, routeShard("0", "0-31", "b1")),
		},
		generation: 5,
		want: []ruleView{
			{ID: "0", Cluster: "c2", Pods: pods("c2", "b1"), Buckets: "0-31"},
		},
	}, {
		name: "fleet: the newest generation wins whichever cluster has it",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": route("c1", 6, 32, routeShard("0", "0-15", "a1"), routeShard("1", "16-31", "a2")),
			"c2": route("c2", 6, 32, routeShard("0", "0-15"), routeShard("1", "16-31", "b1")),
			"c3": route("c3", 4, 32, routeShard("0", "0-31", "c1")),
		},
		generation: 6,
		want: []ruleView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "a1"), Buckets: "0-15"},
			{ID: "1", Cluster: "c1", Pods: append(pods("c1", "a2"), pods("c2", "b1")...), Buckets: "16-31"},
		},
	}, {
		name: "pending buckets and namespaces round trip",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": route("c1", 7, 32,
				pending(routeShard("0", "0-7", "p0"), "8-15"),
				pending(routeShard("1", "", "p1"), "16-31"),
				pending(canary(routeShard("canary", "", "p2"), "team-a"), "", "team-b", "team-c"),
			),
		},
		generation: 7,
		want: []ruleView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "p0"), Buckets: "0-7", PendingBuckets: "8-15"},
			{ID: "1", Cluster: "c1", Pods: pods("c1", "p1"), PendingBuckets: "16-31"},
			{ID: "canary", Cluster: "c1", Canary: true, Pods: pods("c1", "p2"), Namespaces: []string{"team-a"}, Pending: []string{"team-b", "team-c"}},
		},
	}, {
		name: "a canary shard without namespaces",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": route("c1", 1, 32, pending(canary(routeShard("0", "0-31", "p0")), "")),
		},
		generation: 1,
		want: []ruleView{
			{ID: "0", Cluster: "c1", Canary: true, Pods: pods("c1", "p0"), Buckets: "0-31"},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Lists decoded from a Work may be empty rather than absent:
			// publishedRules reads both as none.
			for _, r := range tt.routes {
				for i := range r.Spec.Shards {
					if r.Spec.Shards[i].Namespaces == nil {
						r.Spec.Shards[i].Namespaces = []string{}
					}
					if r.Spec.Shards[i].PendingNamespaces == nil {
						r.Spec.Shards[i].PendingNamespaces = []string{}
					}
				}
			}
			got, err := publishedRules(scheme32, tt.routes)
			if err != nil {
				t.Fatalf("publishedRules: %v", err)
			}
			if got.Generation != tt.generation {
				t.Errorf("generation %d, want %d", got.Generation, tt.generation)
			}
			for _, rs := range got.Shards {
				if rs.Buckets.Space() != scheme32 || rs.PendingBuckets.Space() != scheme32 {
					t.Errorf("shard %s: sets of %d and %d buckets, want 32", rs.ID, rs.Buckets.Space().Buckets(), rs.PendingBuckets.Space().Buckets())
				}
			}
			if view := viewRules(got); !reflect.DeepEqual(view, tt.want) {
				t.Errorf("shards\n got %+v\nwant %+v", view, tt.want)
			}
		})
	}
}

func TestPublishedRulesRefuses(t *testing.T) {
	withPending := func(rs ctrlmeshv1alpha1.RouteShard, buckets string) ctrlmeshv1alpha1.RouteShard {
		rs.PendingBuckets = buckets
		return rs
	}
	tests := []struct {
		name   string
		routes map[string]*ctrlmeshv1alpha1.ShardRoute
		want   string
	}{{
		name: "another bucket count",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": route("c1", 1, 32, routeShard("0", "0-31", "a")),
			"c2": route("c2", 1, 16, routeShard("0", "0-15", "b")),
		},
		want: "the rules published to c2 count 16 buckets, the ShardingConfig 32: the bucket count cannot change once published; delete and recreate the ShardingConfig to change it",
	}, {
		name:   "buckets that are no numbers",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{"c1": route("c1", 1, 32, routeShard("0", "0-x", "a"))},
		want:   `the rules published to c1, shard "0": bucket set "0-x": "x" is not a bucket number`,
	}, {
		name:   "a bucket out of range",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{"c1": route("c1", 1, 32, routeShard("0", "0-15", "a"), routeShard("1", "16-40", "b"))},
		want:   `the rules published to c1, shard "1": bucket set "16-40": bucket 40 is out of range: with 32 buckets they are numbered 0 to 31`,
	}, {
		name:   "pending buckets running backwards",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{"c1": route("c1", 1, 32, withPending(routeShard("0", "0-7", "a"), "15-8"))},
		want:   `the rules published to c1, shard "0": bucket set "15-8": range "15-8" runs backwards; write it low to high, as 8-15`,
	}, {
		name:   "an empty item",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{"c1": route("c1", 1, 32, routeShard("0", "0-7,,9", "a"))},
		want:   `the rules published to c1, shard "0": bucket set "0-7,,9": item 2 is empty`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := publishedRules(scheme32, tt.routes)
			if err == nil {
				t.Fatalf("publishedRules accepted the routes: %+v", viewRules(got))
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %s\nwant %s", err, tt.want)
			}
			if got.Generation != 0 || got.Shards != nil {
				t.Errorf("rules %+v returned with the error, want none", got)
			}
		})
	}
}

// shardView is a placement.Shard with its buckets in compact notation.
type shardView struct {
	ID, Cluster string
	Canary      bool
	Pods        []placement.PodID
	Buckets     string
	Namespaces  []string
}

func viewPlacement(p placement.Placement) []shardView {
	var out []shardView
	for _, s := range p.Shards {
		out = append(out, shardView{ID: s.ID, Cluster: s.Cluster, Canary: s.Canary, Pods: s.Pods, Buckets: s.Buckets.String(), Namespaces: s.Namespaces})
	}
	return out
}

func TestPreviousPlacement(t *testing.T) {
	withNamespaces := func(rs placement.RuleShard, canary bool, namespaces, pending []string) placement.RuleShard {
		rs.Canary, rs.Namespaces, rs.PendingNamespaces = canary, namespaces, pending
		return rs
	}
	withCluster := func(rs placement.RuleShard, cluster string) placement.RuleShard {
		rs.Cluster = cluster
		return rs
	}
	tests := []struct {
		name  string
		rules placement.Rules
		want  []shardView
	}{{
		name: "nothing published",
	}, {
		name: "what a shard serves",
		rules: placement.Rules{Generation: 2, Shards: []placement.RuleShard{
			withCluster(ruleShard(t, "0", "0-15", "", pods("c1", "a", "b")...), "c1"),
			withCluster(ruleShard(t, "1", "16-31", "", pods("c2", "c")...), "c2"),
		}},
		want: []shardView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "a", "b"), Buckets: "0-15"},
			{ID: "1", Cluster: "c2", Pods: pods("c2", "c"), Buckets: "16-31"},
		},
	}, {
		name: "pending buckets and namespaces are the shard's",
		rules: placement.Rules{Generation: 5, Shards: []placement.RuleShard{
			withCluster(ruleShard(t, "0", "0-7", "8-11", pods("c1", "a")...), "c1"),
			withCluster(ruleShard(t, "1", "", "16-31", pods("c1", "b")...), "c1"),
			withCluster(withNamespaces(ruleShard(t, "canary", "12-15", "", pods("c1", "z")...), true, []string{"team-a"}, []string{"team-b"}), "c1"),
			withCluster(withNamespaces(ruleShard(t, "canary-2", "", "", pods("c1", "y")...), true, nil, []string{"team-c"}), "c1"),
		}},
		want: []shardView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "a"), Buckets: "0-11"},
			{ID: "1", Cluster: "c1", Pods: pods("c1", "b"), Buckets: "16-31"},
			{ID: "canary", Cluster: "c1", Canary: true, Pods: pods("c1", "z"), Buckets: "12-15", Namespaces: []string{"team-a", "team-b"}},
			{ID: "canary-2", Cluster: "c1", Canary: true, Pods: pods("c1", "y"), Namespaces: []string{"team-c"}},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := previousPlacement(scheme32, tt.rules)
			if got.Space != scheme32 {
				t.Errorf("space of %d buckets, want 32", got.Space.Buckets())
			}
			if view := viewPlacement(got); !reflect.DeepEqual(view, tt.want) {
				t.Errorf("shards\n got %+v\nwant %+v", view, tt.want)
			}
			// The placement is a copy: Compute may change it.
			for i := range got.Shards {
				for j := range got.Shards[i].Pods {
					got.Shards[i].Pods[j].Name = "changed"
				}
			}
			for _, rs := range tt.rules.Shards {
				for _, p := range rs.Pods {
					if p.Name == "changed" {
						t.Fatalf("the placement shares the pods of rule shard %s", rs.ID)
					}
				}
			}
		})
	}
}

// TestPreviousPlacementOfPublishedRules: what a restarted hub reads back
// from the Works is the placement they head for.
func TestPreviousPlacementOfPublishedRules(t *testing.T) {
	r := route("c1", 9, 32, routeShard("0", "0-7", "a"), routeShard("1", "16-31", "b"))
	r.Spec.Shards[0].PendingBuckets = "8-15"
	rules, err := publishedRules(scheme32, map[string]*ctrlmeshv1alpha1.ShardRoute{"c1": r})
	if err != nil {
		t.Fatal(err)
	}
	want := []shardView{
		{ID: "0", Cluster: "c1", Pods: pods("c1", "a"), Buckets: "0-15"},
		{ID: "1", Cluster: "c1", Pods: pods("c1", "b"), Buckets: "16-31"},
	}
	if view := viewPlacement(previousPlacement(scheme32, rules)); !reflect.DeepEqual(view, want) {
		t.Errorf("shards\n got %+v\nwant %+v", view, want)
	}
}
