package shardingconfig

import (
	"slices"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
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

// pods are PodIDs of one cluster.
func pods(cluster string, names ...string) []route.PodID {
	out := make([]route.PodID, 0, len(names))
	for _, n := range names {
		out = append(out, route.PodID{Cluster: cluster, Name: n})
	}
	return out
}

// tableShard is a route table shard of scheme32.
func tableShard(t testing.TB, id, buckets, pending string, podIDs ...route.PodID) route.Shard {
	t.Helper()
	return route.Shard{ID: id, Pods: podIDs, Buckets: mustSet(t, buckets), PendingBuckets: mustSet(t, pending)}
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
