// Package route is what a ShardRoute means, in one place: the hub builds the
// route of every member cluster from the route table of a placement domain,
// reads the published routes back into that table, and every reader — the
// hub's handover, the agent's route status and each pod's proxy — checks one
// ownership rule and reads the bucket sets one way.
//
//   - Table and Shard are the hub's route table: what every shard of a
//     placement domain serves at one generation, and what it will serve once
//     the previous owners let go.
//   - Validate is the one ownership check: no bucket, namespace or pod in two
//     shards, no shard ID twice.
//   - Build turns a table into the ShardRoute of one member cluster.
//   - Parse reads a ShardRoute's shards back (the one place bucket strings are
//     parsed), and Merge reads the routes of a domain's clusters back into the
//     domain's table.
//   - Compile reads a ShardRoute for one pod: its shard, what that shard
//     serves, and which shard serves every other namespace.
//
// The package links into the proxy, so it depends on the API types and the
// bucket math only: no hub, agent or proxy package, and no Karmada.
package route

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// PodID names an operator pod in the fleet: pod names are unique only within
// a cluster.
type PodID struct {
	Cluster string
	Name    string
}

// String is "cluster/name", or the name alone when the cluster is not known.
func (p PodID) String() string {
	if p.Cluster == "" {
		return p.Name
	}
	return p.Cluster + "/" + p.Name
}

// ComparePodIDs orders pods by cluster, then name.
func ComparePodIDs(a, b PodID) int {
	return cmp.Or(cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Name, b.Name))
}

// CompareShardIDs orders shard IDs: numeric IDs by value ("2" before "10"),
// before any other ID.
func CompareShardIDs(a, b string) int {
	na, errA := strconv.Atoi(a)
	nb, errB := strconv.Atoi(b)
	switch {
	case errA == nil && errB == nil:
		return cmp.Compare(na, nb)
	case errA == nil:
		return -1
	case errB == nil:
		return 1
	}
	return cmp.Compare(a, b)
}

// Table is the route table the hub publishes for one placement domain (one
// member cluster in PerCluster scope; all selected clusters together in
// Fleet scope) at one generation; the zero Table is nothing published. Build
// turns it into the ShardRoute of each cluster of the domain, and Merge reads
// those back into it.
type Table struct {
	// Generation increases with every change; 0 means nothing published yet.
	Generation int64
	// Shards, sorted by ID (CompareShardIDs).
	Shards []Shard
}

// Shard is one shard of a route table. A shard with no buckets, pending
// buckets, namespaces or pending namespaces (a canary shard whose namespaces
// are all held by others) is not listed in the ShardRoutes: the CRD refuses
// it, and its pods serve nothing either way.
type Shard struct {
	// ID is a DNS label, stable for the shard's life; the shard's
	// leader-election lock is "<name>---<ID>".
	ID string
	// Cluster is where most of the shard's pods run.
	Cluster string
	Canary  bool
	// Subset is the name of the subset whose pods serve the shard, if any.
	Subset string
	// Pods serving the shard, sorted (ComparePodIDs).
	Pods []PodID
	// Buckets the shard's pods may serve now.
	Buckets sharding.Set
	// PendingBuckets are the shard's in the desired placement but served by
	// no shard yet, while the pods of their previous owner may still serve
	// them. A bucket is also held back from its own shard while one of its
	// namespaces moves to or from the canary.
	PendingBuckets sharding.Set
	// Namespaces the shard serves exactly, whatever their bucket; every other
	// shard excludes them. Sorted.
	Namespaces []string
	// PendingNamespaces are granted but served by no shard yet. While a
	// namespace is pending its bucket is pending too, so no proxy serves it.
	// Sorted.
	PendingNamespaces []string
}

// HasPending reports whether some bucket or namespace waits for its previous
// owner to let go.
func (t Table) HasPending() bool {
	return slices.ContainsFunc(t.Shards, Shard.hasPending)
}

func (s Shard) hasPending() bool {
	return !s.PendingBuckets.IsEmpty() || len(s.PendingNamespaces) > 0
}

// servesNothing reports whether the shard has nothing, now or pending.
func (s Shard) servesNothing() bool {
	return s.Buckets.IsEmpty() && len(s.Namespaces) == 0 && !s.hasPending()
}

// Equal reports whether both shards are the same in every field.
func (s Shard) Equal(o Shard) bool {
	return s.ID == o.ID && s.Cluster == o.Cluster && s.Canary == o.Canary && s.Subset == o.Subset && slices.Equal(s.Pods, o.Pods) &&
		s.Buckets.Equal(o.Buckets) && s.PendingBuckets.Equal(o.PendingBuckets) &&
		slices.Equal(s.Namespaces, o.Namespaces) && slices.Equal(s.PendingNamespaces, o.PendingNamespaces)
}
