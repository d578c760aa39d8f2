package route

import (
	"reflect"
	"testing"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// space32 is the default bucket count of a ShardingConfig.
var space32 = sharding.MustSpace(32)

// publishedRoute is a ShardRoute published to cluster at generation gen, in
// a space of buckets buckets.
func publishedRoute(cluster string, gen int64, buckets int32, shards ...ctrlmeshv1alpha1.RouteShard) *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{
		Cluster: cluster, RoutingGeneration: gen, RulesHash: "hash", Buckets: buckets, Shards: shards,
	}}
}

// specShard is a RouteShard serving buckets, with the named pods.
func specShard(id, buckets string, pods ...string) ctrlmeshv1alpha1.RouteShard {
	rs := ctrlmeshv1alpha1.RouteShard{ID: id, Buckets: buckets}
	for _, p := range pods {
		rs.Pods = append(rs.Pods, ctrlmeshv1alpha1.RoutePod{Name: p})
	}
	return rs
}

// pods are PodIDs of one cluster.
func pods(cluster string, names ...string) []PodID {
	out := make([]PodID, 0, len(names))
	for _, n := range names {
		out = append(out, PodID{Cluster: cluster, Name: n})
	}
	return out
}

// shardView is a Shard with its sets in compact notation, so that
// expectations compare with ==-like equality.
type shardView struct {
	ID, Cluster             string
	Canary                  bool
	Pods                    []PodID
	Buckets, PendingBuckets string
	Namespaces, Pending     []string
}

func viewTable(table Table) []shardView {
	var out []shardView
	for _, s := range table.Shards {
		out = append(out, shardView{
			ID: s.ID, Cluster: s.Cluster, Canary: s.Canary, Pods: s.Pods,
			Buckets: s.Buckets.String(), PendingBuckets: s.PendingBuckets.String(),
			Namespaces: s.Namespaces, Pending: s.PendingNamespaces,
		})
	}
	return out
}

func TestMerge(t *testing.T) {
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
		want       []shardView
	}{{
		name: "nothing published",
	}, {
		name: "per cluster: one route, shards in ID order, pods sorted",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": publishedRoute("c1", 3, 32,
				specShard("10", "24-31", "p-e"),
				canary(specShard("canary", "", "p-z"), "team-a"),
				specShard("2", "16-23", "p-d", "p-c"),
				specShard("0", "0-15", "p-b", "p-a"),
			),
		},
		generation: 3,
		want: []shardView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "p-a", "p-b"), Buckets: "0-15"},
			{ID: "2", Cluster: "c1", Pods: pods("c1", "p-c", "p-d"), Buckets: "16-23"},
			{ID: "10", Cluster: "c1", Pods: pods("c1", "p-e"), Buckets: "24-31"},
			{ID: "canary", Cluster: "c1", Canary: true, Pods: pods("c1", "p-z"), Namespaces: []string{"team-a"}},
		},
	}, {
		name: "fleet: routes of one generation merge pods per shard, the cluster is the one listing them",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c2": publishedRoute("c2", 4, 32,
				specShard("0", "0-15"),
				specShard("1", "16-31", "b2", "b1"),
				canary(specShard("canary", "", "b3"), "team-a"),
			),
			"c1": publishedRoute("c1", 4, 32,
				specShard("0", "0-15", "a1"),
				specShard("1", "16-31"),
				canary(specShard("canary", ""), "team-a"),
			),
		},
		generation: 4,
		want: []shardView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "a1"), Buckets: "0-15"},
			{ID: "1", Cluster: "c2", Pods: pods("c2", "b1", "b2"), Buckets: "16-31"},
			{ID: "canary", Cluster: "c2", Canary: true, Pods: pods("c2", "b3"), Namespaces: []string{"team-a"}},
		},
	}, {
		name: "fleet: a shard with pods in two clusters has them all",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": publishedRoute("c1", 2, 32, specShard("0", "0-31", "a1")),
			"c2": publishedRoute("c2", 2, 32, specShard("0", "0-31", "b1")),
		},
		generation: 2,
		want: []shardView{
			{ID: "0", Cluster: "c1", Pods: append(pods("c1", "a1"), pods("c2", "b1")...), Buckets: "0-31"},
		},
	}, {
		name: "fleet: a shard no route lists pods for has no cluster",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": publishedRoute("c1", 2, 32, specShard("0", "0-15", "a1"), specShard("1", "16-31")),
			"c2": publishedRoute("c2", 2, 32, specShard("0", "0-15"), specShard("1", "16-31")),
		},
		generation: 2,
		want: []shardView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "a1"), Buckets: "0-15"},
			{ID: "1", Buckets: "16-31"},
		},
	}, {
		name: "fleet: a route of an older generation is ignored",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": publishedRoute("c1", 3, 32, specShard("0", "0-15", "a1"), specShard("1", "16-31", "a2")),
			"c2": publishedRoute("c2", 5, 32, specShard("0", "0-31", "b1")),
		},
		generation: 5,
		want: []shardView{
			{ID: "0", Cluster: "c2", Pods: pods("c2", "b1"), Buckets: "0-31"},
		},
	}, {
		name: "fleet: the newest generation wins whichever cluster has it",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": publishedRoute("c1", 6, 32, specShard("0", "0-15", "a1"), specShard("1", "16-31", "a2")),
			"c2": publishedRoute("c2", 6, 32, specShard("0", "0-15"), specShard("1", "16-31", "b1")),
			"c3": publishedRoute("c3", 4, 32, specShard("0", "0-31", "c1")),
		},
		generation: 6,
		want: []shardView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "a1"), Buckets: "0-15"},
			{ID: "1", Cluster: "c1", Pods: append(pods("c1", "a2"), pods("c2", "b1")...), Buckets: "16-31"},
		},
	}, {
		name: "pending buckets and namespaces round trip",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": publishedRoute("c1", 7, 32,
				pending(specShard("0", "0-7", "p0"), "8-15"),
				pending(specShard("1", "", "p1"), "16-31"),
				pending(canary(specShard("canary", "", "p2"), "team-a"), "", "team-b", "team-c"),
			),
		},
		generation: 7,
		want: []shardView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "p0"), Buckets: "0-7", PendingBuckets: "8-15"},
			{ID: "1", Cluster: "c1", Pods: pods("c1", "p1"), PendingBuckets: "16-31"},
			{ID: "canary", Cluster: "c1", Canary: true, Pods: pods("c1", "p2"), Namespaces: []string{"team-a"}, Pending: []string{"team-b", "team-c"}},
		},
	}, {
		name: "a canary shard without namespaces",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{
			"c1": publishedRoute("c1", 1, 32, pending(canary(specShard("0", "0-31", "p0")), "")),
		},
		generation: 1,
		want: []shardView{
			{ID: "0", Cluster: "c1", Canary: true, Pods: pods("c1", "p0"), Buckets: "0-31"},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Lists decoded from a Work may be empty rather than absent:
			// Merge reads both as none.
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
			got, err := Merge(space32, tt.routes)
			if err != nil {
				t.Fatalf("Merge: %v", err)
			}
			if got.Generation != tt.generation {
				t.Errorf("generation %d, want %d", got.Generation, tt.generation)
			}
			for _, rs := range got.Shards {
				if rs.Buckets.Space() != space32 || rs.PendingBuckets.Space() != space32 {
					t.Errorf("shard %s: sets of %d and %d buckets, want 32", rs.ID, rs.Buckets.Space().Buckets(), rs.PendingBuckets.Space().Buckets())
				}
			}
			if view := viewTable(got); !reflect.DeepEqual(view, tt.want) {
				t.Errorf("shards\n got %+v\nwant %+v", view, tt.want)
			}
		})
	}
}

func TestMergeRefuses(t *testing.T) {
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
			"c1": publishedRoute("c1", 1, 32, specShard("0", "0-31", "a")),
			"c2": publishedRoute("c2", 1, 16, specShard("0", "0-15", "b")),
		},
		want: "the rules published to c2 count 16 buckets, the ShardingConfig 32: the bucket count cannot change once published; delete and recreate the ShardingConfig to change it",
	}, {
		name:   "buckets that are no numbers",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{"c1": publishedRoute("c1", 1, 32, specShard("0", "0-x", "a"))},
		want:   `the rules published to c1: shard "0" buckets: bucket set "0-x": "x" is not a bucket number`,
	}, {
		name:   "a bucket out of range",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{"c1": publishedRoute("c1", 1, 32, specShard("0", "0-15", "a"), specShard("1", "16-40", "b"))},
		want:   `the rules published to c1: shard "1" buckets: bucket set "16-40": bucket 40 is out of range: with 32 buckets they are numbered 0 to 31`,
	}, {
		name:   "pending buckets running backwards",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{"c1": publishedRoute("c1", 1, 32, withPending(specShard("0", "0-7", "a"), "15-8"))},
		want:   `the rules published to c1: shard "0" pendingBuckets: bucket set "15-8": range "15-8" runs backwards; write it low to high, as 8-15`,
	}, {
		name:   "an empty item",
		routes: map[string]*ctrlmeshv1alpha1.ShardRoute{"c1": publishedRoute("c1", 1, 32, specShard("0", "0-7,,9", "a"))},
		want:   `the rules published to c1: shard "0" buckets: bucket set "0-7,,9": item 2 is empty`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Merge(space32, tt.routes)
			if err == nil {
				t.Fatalf("Merge accepted the routes: %+v", viewTable(got))
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %s\nwant %s", err, tt.want)
			}
			if got.Generation != 0 || got.Shards != nil {
				t.Errorf("table %+v returned with the error, want none", got)
			}
		})
	}
}
