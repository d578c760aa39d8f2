package shardingconfig

import (
	"slices"
	"testing"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placement"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// scheme32 is the default bucket count of a ShardingConfig.
var scheme32 = sharding.MustSpace(32)

// mustSet parses a bucket set of scheme32.
func mustSet(t testing.TB, text string) sharding.Set {
	t.Helper()
	set, err := scheme32.ParseSet(text)
	if err != nil {
		t.Fatalf("ParseSet(%q): %v", text, err)
	}
	return set
}

// route is a ShardRoute published to cluster at generation gen, in a
// space of buckets buckets.
func route(cluster string, gen int64, buckets int32, shards ...ctrlmeshv1alpha1.RouteShard) *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{
		Cluster: cluster, RoutingGeneration: gen, RulesHash: "hash", Buckets: buckets, Shards: shards,
	}}
}

// routeShard is a RouteShard serving buckets, with the named pods.
func routeShard(id, buckets string, pods ...string) ctrlmeshv1alpha1.RouteShard {
	rs := ctrlmeshv1alpha1.RouteShard{ID: id, Buckets: buckets}
	for _, p := range pods {
		rs.Pods = append(rs.Pods, ctrlmeshv1alpha1.RoutePod{Name: p})
	}
	return rs
}

// pods are PodIDs of one cluster.
func pods(cluster string, names ...string) []placement.PodID {
	out := make([]placement.PodID, 0, len(names))
	for _, n := range names {
		out = append(out, placement.PodID{Cluster: cluster, Name: n})
	}
	return out
}

// ruleView is a RuleShard with its sets in compact notation, so that
// expectations compare with ==-like equality.
type ruleView struct {
	ID, Cluster             string
	Canary                  bool
	Pods                    []placement.PodID
	Buckets, PendingBuckets string
	Namespaces, Pending     []string
}

func viewRules(rules placement.Rules) []ruleView {
	var out []ruleView
	for _, rs := range rules.Shards {
		out = append(out, ruleView{
			ID: rs.ID, Cluster: rs.Cluster, Canary: rs.Canary, Pods: rs.Pods,
			Buckets: rs.Buckets.String(), PendingBuckets: rs.PendingBuckets.String(),
			Namespaces: rs.Namespaces, Pending: rs.PendingNamespaces,
		})
	}
	return out
}

// ruleShard is a RuleShard of scheme32.
func ruleShard(t testing.TB, id, buckets, pending string, podIDs ...placement.PodID) placement.RuleShard {
	t.Helper()
	return placement.RuleShard{ID: id, Pods: podIDs, Buckets: mustSet(t, buckets), PendingBuckets: mustSet(t, pending)}
}

// cluster is a hub record of a member cluster.
func cluster(name string, accepted, available bool, labels map[string]string) state.Cluster {
	return state.Cluster{Name: name, Accepted: accepted, Available: available, Labels: labels}
}

// members makes members of the named clusters, usable unless listed in
// unusable.
func members(names []string, unusable ...string) map[string]*member {
	out := map[string]*member{}
	for _, n := range names {
		out[n] = &member{cluster: cluster(n, true, !slices.Contains(unusable, n), nil)}
	}
	return out
}
