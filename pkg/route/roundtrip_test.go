package route

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

// TestRoundTrip: a table the hub publishes — built into each cluster's
// ShardRoute, carried in a Work, decoded from it and merged — reads back as
// the same table. That is how a restarted hub learns what it published.
func TestRoundTrip(t *testing.T) {
	config := func(scope ctrlmeshv1alpha1.ShardingScope) *ctrlmeshv1alpha1.ShardingConfig {
		c := testConfig("team-a", scope)
		c.Spec.Sharding.Buckets = 32
		c.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}}}
		return c
	}
	shard := func(id, cluster, buckets, pending string, podIDs ...PodID) Shard {
		return Shard{ID: id, Cluster: cluster, Pods: podIDs, Buckets: set32(t, buckets), PendingBuckets: set32(t, pending)}
	}
	canary := func(s Shard, namespaces, pending []string) Shard {
		s.Canary, s.Namespaces, s.PendingNamespaces = true, namespaces, pending
		return s
	}
	for _, tc := range []struct {
		name     string
		scope    ctrlmeshv1alpha1.ShardingScope
		clusters []string
		table    Table
	}{{
		name: "PerCluster", scope: ctrlmeshv1alpha1.ScopePerCluster, clusters: []string{"c1"},
		table: Table{Generation: 3, Shards: []Shard{
			shard("0", "c1", "0-15", "", pods("c1", "a", "b")...),
			shard("1", "c1", "16-31", "", pods("c1", "c")...),
		}},
	}, {
		name: "PerCluster, handing over, with a canary", scope: ctrlmeshv1alpha1.ScopePerCluster, clusters: []string{"c1"},
		table: Table{Generation: 7, Shards: []Shard{
			shard("0", "c1", "0-7", "8-11", pods("c1", "a")...),
			shard("1", "c1", "", "16-31", pods("c1", "b")...),
			shard("2", "c1", "12-15", "", pods("c1", "c")...),
			canary(shard("canary", "c1", "", "", pods("c1", "z")...), []string{"team-a"}, []string{"team-b"}),
		}},
	}, {
		name: "Fleet", scope: ctrlmeshv1alpha1.ScopeFleet, clusters: []string{"c1", "c2", "c3"},
		table: Table{Generation: 2, Shards: []Shard{
			shard("0", "c1", "0-10", "", pods("c1", "a", "b")...),
			// Pod names repeat across clusters.
			shard("1", "c2", "11-21", "", pods("c2", "a", "b")...),
			shard("2", "c3", "22-31", "", pods("c3", "a")...),
		}},
	}, {
		name: "Fleet, handing over, a shard across clusters, a canary", scope: ctrlmeshv1alpha1.ScopeFleet, clusters: []string{"c1", "c2"},
		table: Table{Generation: 9, Shards: []Shard{
			shard("0", "c1", "0-7", "", append(pods("c1", "a", "b"), pods("c2", "a")...)...),
			shard("2", "c2", "", "8-15", pods("c2", "b")...),
			shard("10", "c2", "16-31", "", pods("c2", "c")...),
			canary(shard("canary", "c1", "", "", pods("c1", "z")...), nil, []string{"team-a"}),
		}},
	}, {
		name: "Fleet, shards mostly in the cluster named last", scope: ctrlmeshv1alpha1.ScopeFleet, clusters: []string{"c1", "c2"},
		table: Table{Generation: 5, Shards: []Shard{
			shard("0", "c2", "0-15", "", append(pods("c1", "a"), pods("c2", "a", "b")...)...),
			// A tie goes to the first by name.
			shard("1", "c1", "16-31", "", append(pods("c1", "b"), pods("c2", "c")...)...),
		}},
	}, {
		name: "Fleet, a shard of no pod", scope: ctrlmeshv1alpha1.ScopeFleet, clusters: []string{"c1", "c2"},
		table: Table{Generation: 4, Shards: []Shard{
			shard("0", "c1", "0-15", "", pods("c1", "a")...),
			shard("1", "", "16-31", ""),
		}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			routes := map[string]*ctrlmeshv1alpha1.ShardRoute{}
			for _, cluster := range tc.clusters {
				built, err := Build(config(tc.scope), cluster, tc.table, nil, FleetValidity)
				if err != nil {
					t.Fatal(err)
				}
				routes[cluster] = throughWork(t, cluster, built)
			}
			got, err := Merge(space32, routes)
			if err != nil {
				t.Fatal(err)
			}
			if got.Generation != tc.table.Generation || !reflect.DeepEqual(viewTable(got), viewTable(tc.table)) {
				t.Errorf("read back generation %d\n%+v\nwant generation %d\n%+v", got.Generation, viewTable(got), tc.table.Generation, viewTable(tc.table))
			}
		})
	}
}

// throughWork is the route as it reaches the member: the one manifest of a
// Work.
func throughWork(t *testing.T, cluster string, route *ctrlmeshv1alpha1.ShardRoute) *ctrlmeshv1alpha1.ShardRoute {
	t.Helper()
	work := routework.NewWork(routework.WorkKey(cluster, route.Namespace, route.Name))
	if err := routework.SetManifests(work, route, nil); err != nil {
		t.Fatal(err)
	}
	decoded, err := routework.Decode(work)
	if err != nil {
		t.Fatal(err)
	}
	return decoded
}
