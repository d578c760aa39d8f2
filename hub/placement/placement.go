// Package placement decides where buckets go and how they move safely, for
// one ShardingConfig in one placement domain (one member cluster in
// PerCluster scope; all selected clusters together in Fleet scope).
//
// Compute turns the candidate pods, the canary step in force and the previous
// placement into the desired placement: which pods serve which shard, and
// which buckets and namespaces each shard serves. Handover turns the desired
// placement, the route table published so far (pkg/route) and the pods'
// acknowledgements into the next table to publish, revoking a bucket from its
// old shard before granting it to the new one. FromTable is the placement a
// published table heads for, to start Compute from.
//
// The package is pure logic: no API server, no clock. Callers feed it what the
// agents report and publish what it returns.
package placement

import (
	"fmt"
	"slices"

	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// CanaryShardID is the ID of the canary shard.
const CanaryShardID = "canary"

// Shard is one shard of a placement: the pods that serve it (one leads through
// the lock "<name>---<ID>", the others are hot standbys) and what it serves.
type Shard struct {
	// ID is stable for the shard's life: a DNS label ("0", "1", … or
	// CanaryShardID).
	ID string
	// Cluster is where most of the shard's pods run.
	Cluster string
	// Pods serving the shard, sorted.
	Pods []route.PodID
	// Buckets the shard serves.
	Buckets sharding.Set
	// Namespaces the shard serves exactly, whatever their bucket; every other
	// shard excludes them. Only the canary's and subsets' shards have any.
	Namespaces []string
	// Canary is true for the canary shard.
	Canary bool
	// Subset is the name of the subset the shard serves (its ID too), ""
	// for the canary and the numbered shards.
	Subset string
}

// grouped reports whether the shard serves a group of pods picked by
// label, the canary or a subset, rather than a share of the buckets.
func (s Shard) grouped() bool { return s.Canary || s.Subset != "" }

// Placement is every shard of one placement domain, sorted by ID (numeric IDs
// in numeric order, then the others).
type Placement struct {
	Space  sharding.Space
	Shards []Shard
}

// Shard returns the shard with the given ID.
func (p Placement) Shard(id string) (Shard, bool) {
	for _, s := range p.Shards {
		if s.ID == id {
			return s, true
		}
	}
	return Shard{}, false
}

// Equal reports whether both placements have the same shards, pods, buckets
// and namespaces.
func (p Placement) Equal(other Placement) bool {
	return p.Space == other.Space && slices.EqualFunc(p.Shards, other.Shards, Shard.equal)
}

// FromTable is the placement a published route table heads for: what each
// shard serves now or has pending. Compute keeps it where it can, so that an
// unchanged fleet keeps its placement across hub restarts. The placement
// shares nothing with the table.
func FromTable(space sharding.Space, table route.Table) Placement {
	p := Placement{Space: space}
	for _, s := range table.Shards {
		p.Shards = append(p.Shards, Shard{
			ID: s.ID, Cluster: s.Cluster, Pods: slices.Clone(s.Pods),
			Buckets:    s.Buckets.Union(s.PendingBuckets),
			Namespaces: slices.Concat(s.Namespaces, s.PendingNamespaces), Canary: s.Canary, Subset: s.Subset,
		})
	}
	return p
}

func (s Shard) equal(o Shard) bool {
	return s.ID == o.ID && s.Cluster == o.Cluster && s.Canary == o.Canary && s.Subset == o.Subset &&
		slices.Equal(s.Pods, o.Pods) && s.Buckets.Equal(o.Buckets) && slices.Equal(s.Namespaces, o.Namespaces)
}

// setOf is the set of buckets that are known to lie in the space.
func setOf(space sharding.Space, buckets []int) sharding.Set {
	set, err := space.NewSet(buckets...)
	if err != nil {
		// Callers pass indices below space.Buckets(): this is a bug here.
		panic(fmt.Sprintf("placement: %v", err))
	}
	return set
}

// sortedUnique copies, sorts and deduplicates namespaces, so that equal lists
// compare equal.
func sortedUnique(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	return slices.Compact(slices.Sorted(slices.Values(in)))
}

// checkSpace refuses a set of another bucket count: a zero Set (from a zero
// Shard or CanaryStep) has no space at all.
func checkSpace(space sharding.Space, set sharding.Set, what string) error {
	if set.Space() != space {
		return fmt.Errorf("%s: a set of %d buckets, want %d", what, set.Space().Buckets(), space.Buckets())
	}
	return nil
}
