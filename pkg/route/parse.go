package route

import (
	"fmt"
	"maps"
	"slices"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// Parse reads the ShardRoute of one member cluster as that cluster's part of
// a route table: its bucket space, its generation and its shards, in the
// route's order, with their bucket sets parsed and their pods as pods of
// spec.Cluster. A shard's cluster is spec.Cluster when the route lists pods
// for it, else unknown (""). It checks nothing but the bucket count and the
// bucket sets: Validate checks ownership.
func Parse(spec *ctrlmeshv1alpha1.ShardRouteSpec) (sharding.Space, Table, error) {
	space, err := sharding.NewSpace(int(spec.Buckets))
	if err != nil {
		return sharding.Space{}, Table{}, fmt.Errorf("spec.buckets: %w", err)
	}
	shards, err := parseShards(space, spec.Cluster, spec.Shards)
	if err != nil {
		return sharding.Space{}, Table{}, err
	}
	return space, Table{Generation: spec.RoutingGeneration, Shards: shards}, nil
}

func parseShards(space sharding.Space, cluster string, in []ctrlmeshv1alpha1.RouteShard) ([]Shard, error) {
	out := make([]Shard, 0, len(in))
	for _, rs := range in {
		buckets, err := space.ParseSet(rs.Buckets)
		if err != nil {
			return nil, fmt.Errorf("shard %q buckets: %w", rs.ID, err)
		}
		pending, err := space.ParseSet(rs.PendingBuckets)
		if err != nil {
			return nil, fmt.Errorf("shard %q pendingBuckets: %w", rs.ID, err)
		}
		shard := Shard{
			ID: rs.ID, Canary: rs.Canary, Subset: rs.Subset, Buckets: buckets, PendingBuckets: pending,
			Namespaces: nilIfEmpty(slices.Clone(rs.Namespaces)), PendingNamespaces: nilIfEmpty(slices.Clone(rs.PendingNamespaces)),
		}
		for _, p := range rs.Pods {
			shard.Pods = append(shard.Pods, PodID{Cluster: cluster, Name: p.Name})
		}
		if len(shard.Pods) > 0 {
			shard.Cluster = cluster
		}
		out = append(out, shard)
	}
	return out, nil
}

// nilIfEmpty makes lists decoded from a Work, which may be empty rather
// than absent, compare equal to absent ones.
func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// Merge reads the ShardRoutes published to the clusters of one placement
// domain, by cluster, back into the domain's route table in space. In
// PerCluster scope there is one route. In Fleet scope every member's route
// lists every shard, with only that member's pods: a shard's pods are the
// union, its cluster the one most of them run in (the first by name on a
// tie), as the hub's placement decides it, so that a table read back is the
// table published. The generation is the highest published, and only the
// routes of that generation are merged; a cluster whose route is older is
// brought up to it by the next publish.
func Merge(space sharding.Space, routes map[string]*ctrlmeshv1alpha1.ShardRoute) (Table, error) {
	var table Table
	clusters := slices.Sorted(maps.Keys(routes))
	for _, cluster := range clusters {
		spec := &routes[cluster].Spec
		if int(spec.Buckets) != space.Buckets() {
			return Table{}, fmt.Errorf("the rules published to %s count %d buckets, the ShardingConfig %d: the bucket count cannot change once published; delete and recreate the ShardingConfig to change it",
				cluster, spec.Buckets, space.Buckets())
		}
		table.Generation = max(table.Generation, spec.RoutingGeneration)
	}
	byID := map[string]*Shard{}
	for _, cluster := range clusters {
		spec := &routes[cluster].Spec
		if spec.RoutingGeneration < table.Generation {
			// A member that left the domain and missed later generations:
			// its pods are gone for the hub, and the rules it holds are
			// superseded; a returning member's pods count as live and
			// unacknowledged until they enforce the latest generation.
			continue
		}
		shards, err := parseShards(space, cluster, spec.Shards)
		if err != nil {
			return Table{}, fmt.Errorf("the rules published to %s: %w", cluster, err)
		}
		for _, s := range shards {
			if merged, ok := byID[s.ID]; ok {
				merged.Pods = append(merged.Pods, s.Pods...)
			} else {
				byID[s.ID] = &s
			}
		}
	}
	for _, id := range slices.SortedFunc(maps.Keys(byID), CompareShardIDs) {
		shard := byID[id]
		slices.SortFunc(shard.Pods, ComparePodIDs)
		shard.Cluster = majorityCluster(shard.Pods)
		table.Shards = append(table.Shards, *shard)
	}
	return table, nil
}

// majorityCluster is the cluster most of the pods run in, the first by name
// on a tie; "" for no pods.
func majorityCluster(pods []PodID) string {
	counts := map[string]int{}
	best := ""
	for _, p := range pods {
		counts[p.Cluster]++
		if n := counts[p.Cluster]; n > counts[best] || (n == counts[best] && p.Cluster < best) {
			best = p.Cluster
		}
	}
	return best
}
