package shardingconfig

import (
	"fmt"
	"slices"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placement"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// publishedRules merges the ShardRoutes published to the clusters of one
// placement domain back into the domain's rules. In PerCluster scope there
// is one route. In Fleet scope every member's route lists every shard, with
// only that member's pods: a shard's pods are the union, its cluster the one
// whose route lists pods for it. The generation is the highest published,
// and only the routes of that generation are merged; a cluster whose route
// is older is brought up to it by the next publish.
func publishedRules(space sharding.Space, routes map[string]*ctrlmeshv1alpha1.ShardRoute) (placement.Rules, error) {
	var rules placement.Rules
	byID := map[string]*placement.RuleShard{}
	var order []string
	clusters := make([]string, 0, len(routes))
	for cluster := range routes {
		clusters = append(clusters, cluster)
	}
	slices.Sort(clusters)
	for _, cluster := range clusters {
		route := routes[cluster]
		if int(route.Spec.Buckets) != space.Buckets() {
			return placement.Rules{}, fmt.Errorf("the rules published to %s count %d buckets, the ShardingConfig %d: the bucket count cannot change once published; delete and recreate the ShardingConfig to change it",
				cluster, route.Spec.Buckets, space.Buckets())
		}
		rules.Generation = max(rules.Generation, route.Spec.RoutingGeneration)
	}
	for _, cluster := range clusters {
		route := routes[cluster]
		if route.Spec.RoutingGeneration < rules.Generation {
			// A member that left the domain and missed later generations:
			// its pods are gone for the hub, and the rules it holds are
			// superseded; a returning member's pods count as live and
			// unacknowledged until they enforce the latest generation.
			continue
		}
		for _, rs := range route.Spec.Shards {
			buckets, err := space.ParseSet(rs.Buckets)
			if err != nil {
				return placement.Rules{}, fmt.Errorf("the rules published to %s, shard %q: %w", cluster, rs.ID, err)
			}
			pending, err := space.ParseSet(rs.PendingBuckets)
			if err != nil {
				return placement.Rules{}, fmt.Errorf("the rules published to %s, shard %q: %w", cluster, rs.ID, err)
			}
			shard, ok := byID[rs.ID]
			if !ok {
				shard = &placement.RuleShard{
					ID: rs.ID, Canary: rs.Canary, Buckets: buckets, PendingBuckets: pending,
					Namespaces: slices.Clone(rs.Namespaces), PendingNamespaces: slices.Clone(rs.PendingNamespaces),
				}
				byID[rs.ID] = shard
				order = append(order, rs.ID)
			}
			for _, p := range rs.Pods {
				shard.Pods = append(shard.Pods, placement.PodID{Cluster: cluster, Name: p.Name})
				if shard.Cluster == "" {
					shard.Cluster = cluster
				}
			}
		}
	}
	slices.SortFunc(order, placement.CompareShardIDs)
	for _, id := range order {
		shard := byID[id]
		slices.SortFunc(shard.Pods, placement.ComparePodIDs)
		if len(shard.Namespaces) == 0 {
			shard.Namespaces = nil
		}
		if len(shard.PendingNamespaces) == 0 {
			shard.PendingNamespaces = nil
		}
		rules.Shards = append(rules.Shards, *shard)
	}
	return rules, nil
}

// previousPlacement is the placement the published rules head for: what
// each shard serves now or has pending. Compute keeps it where it can, so
// that an unchanged fleet keeps its placement across hub restarts.
func previousPlacement(space sharding.Space, rules placement.Rules) placement.Placement {
	prev := placement.Placement{Space: space}
	for _, rs := range rules.Shards {
		prev.Shards = append(prev.Shards, placement.Shard{
			ID: rs.ID, Cluster: rs.Cluster, Pods: slices.Clone(rs.Pods),
			Buckets:    rs.Buckets.Union(rs.PendingBuckets),
			Namespaces: slices.Concat(rs.Namespaces, rs.PendingNamespaces), Canary: rs.Canary,
		})
	}
	return prev
}
