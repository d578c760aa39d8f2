package placement

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

var space32 = sharding.MustSpace(32)

// pods are PodIDs of one cluster.
func pods(cluster string, names ...string) []route.PodID {
	out := make([]route.PodID, 0, len(names))
	for _, n := range names {
		out = append(out, route.PodID{Cluster: cluster, Name: n})
	}
	return out
}

// tableShard is a route table shard of space32.
func tableShard(t testing.TB, id, buckets, pending string, podIDs ...route.PodID) route.Shard {
	t.Helper()
	return route.Shard{ID: id, Pods: podIDs, Buckets: mustSet(t, space32, buckets), PendingBuckets: mustSet(t, space32, pending)}
}

// shardView is a Shard with its buckets in compact notation.
type shardView struct {
	ID, Cluster string
	Canary      bool
	Pods        []route.PodID
	Buckets     string
	Namespaces  []string
}

func viewPlacement(p Placement) []shardView {
	var out []shardView
	for _, s := range p.Shards {
		out = append(out, shardView{ID: s.ID, Cluster: s.Cluster, Canary: s.Canary, Pods: s.Pods, Buckets: s.Buckets.String(), Namespaces: s.Namespaces})
	}
	return out
}

func TestFromTable(t *testing.T) {
	withNamespaces := func(rs route.Shard, canary bool, namespaces, pending []string) route.Shard {
		rs.Canary, rs.Namespaces, rs.PendingNamespaces = canary, namespaces, pending
		return rs
	}
	withCluster := func(rs route.Shard, cluster string) route.Shard {
		rs.Cluster = cluster
		return rs
	}
	tests := []struct {
		name  string
		table route.Table
		want  []shardView
	}{{
		name: "nothing published",
	}, {
		name: "what a shard serves",
		table: route.Table{Generation: 2, Shards: []route.Shard{
			withCluster(tableShard(t, "0", "0-15", "", pods("c1", "a", "b")...), "c1"),
			withCluster(tableShard(t, "1", "16-31", "", pods("c2", "c")...), "c2"),
		}},
		want: []shardView{
			{ID: "0", Cluster: "c1", Pods: pods("c1", "a", "b"), Buckets: "0-15"},
			{ID: "1", Cluster: "c2", Pods: pods("c2", "c"), Buckets: "16-31"},
		},
	}, {
		name: "pending buckets and namespaces are the shard's",
		table: route.Table{Generation: 5, Shards: []route.Shard{
			withCluster(tableShard(t, "0", "0-7", "8-11", pods("c1", "a")...), "c1"),
			withCluster(tableShard(t, "1", "", "16-31", pods("c1", "b")...), "c1"),
			withCluster(withNamespaces(tableShard(t, "canary", "12-15", "", pods("c1", "z")...), true, []string{"team-a"}, []string{"team-b"}), "c1"),
			withCluster(withNamespaces(tableShard(t, "canary-2", "", "", pods("c1", "y")...), true, nil, []string{"team-c"}), "c1"),
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
			got := FromTable(space32, tt.table)
			if got.Space != space32 {
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
			for _, s := range tt.table.Shards {
				for _, p := range s.Pods {
					if p.Name == "changed" {
						t.Fatalf("the placement shares the pods of table shard %s", s.ID)
					}
				}
			}
		})
	}
}

// TestFromMergedTable: what a restarted hub reads back from the Works is
// the placement they head for.
func TestFromMergedTable(t *testing.T) {
	r := &ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{Cluster: "c1", RoutingGeneration: 9, RulesHash: "hash", Buckets: 32, Shards: []ctrlmeshv1alpha1.RouteShard{
		{ID: "0", Buckets: "0-7", PendingBuckets: "8-15", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "a"}}},
		{ID: "1", Buckets: "16-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "b"}}},
	}}}
	table, err := route.Merge(space32, map[string]*ctrlmeshv1alpha1.ShardRoute{"c1": r})
	if err != nil {
		t.Fatal(err)
	}
	want := []shardView{
		{ID: "0", Cluster: "c1", Pods: pods("c1", "a"), Buckets: "0-15"},
		{ID: "1", Cluster: "c1", Pods: pods("c1", "b"), Buckets: "16-31"},
	}
	if view := viewPlacement(FromTable(space32, table)); !reflect.DeepEqual(view, want) {
		t.Errorf("shards\n got %+v\nwant %+v", view, want)
	}
}

// TestSteadyAcrossReadBack drives placement the way the hub does: each
// round starts from the table read back from the routes it published. Once
// every proxy enforces the latest generation and nothing changes, a round
// must publish nothing new, also for a Fleet shard whose pods are in two
// clusters, most of them in the cluster named last.
func TestSteadyAcrossReadBack(t *testing.T) {
	config := &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "op"},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Scope:    ctrlmeshv1alpha1.ScopeFleet,
			Sharding: ctrlmeshv1alpha1.ShardingLayout{Buckets: 32, PodsPerShard: 3},
		},
	}
	clusters := []string{"c1", "c2"}
	in := Input{Space: space32, PodsPerShard: 3, Pods: append(makePods("c1", "a"), makePods("c2", "b", "c")...)}
	var published route.Table
	for round := range 5 {
		in.Previous = FromTable(space32, published)
		desired := mustCompute(t, in)
		var acks []PodAck
		for _, p := range in.Pods {
			acks = append(acks, PodAck{Pod: p.PodID, Acked: published.Generation})
		}
		step := mustHandover(t, desired, published, acks)
		if round > 1 && step.Changed {
			t.Fatalf("round %d: generation %d, changed though nothing did: published %s, next %s",
				round, step.Table.Generation, describeTable(published), describeTable(step.Table))
		}
		routes := map[string]*ctrlmeshv1alpha1.ShardRoute{}
		for _, c := range clusters {
			r, err := route.Build(config, c, step.Table, nil, route.FleetValidity)
			if err != nil {
				t.Fatal(err)
			}
			routes[c] = r
		}
		var err error
		if published, err = route.Merge(space32, routes); err != nil {
			t.Fatal(err)
		}
	}
}
