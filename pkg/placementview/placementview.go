// Package placementview answers "who owns this?" from what the hub
// reports: a ShardingConfig's status.placement, read by ctrlmeshctl explain
// and drawn by the hub's placement map. The bucket of a namespace and what a
// shard serves are pkg/sharding's (sharding.Space.Bucket and
// sharding.Ownership, as route.Compile builds it for each proxy), so the
// answer is the one the proxies enforce.
package placementview

import (
	"fmt"
	"slices"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// Domain is one placement domain of a ShardingConfig: in PerCluster scope
// one cluster's shards, which own that cluster's objects; in Fleet scope
// all shards (Cluster is empty), which own the objects of the API server
// the config shards.
type Domain struct {
	Cluster string
	Shards  []ctrlmeshv1alpha1.ShardPlacement
	// ownerships[i] is what Shards[i] serves.
	ownerships []sharding.Ownership
}

// View is a ShardingConfig's placement as the hub reports it.
type View struct {
	Space   sharding.Space
	Domains []Domain
}

// New builds the view of sc's status. The domains of a PerCluster config
// come in the order their clusters first appear in status.placement.
func New(sc *ctrlmeshv1alpha1.ShardingConfig) (View, error) {
	space, err := sharding.NewSpace(int(sc.Spec.Sharding.Buckets))
	if err != nil {
		return View{}, fmt.Errorf("ShardingConfig %s/%s: %w", sc.Namespace, sc.Name, err)
	}
	v := View{Space: space}
	index := map[string]int{}
	for _, p := range sc.Status.Placement {
		key := p.Cluster
		if sc.Spec.Scope == ctrlmeshv1alpha1.ScopeFleet {
			key = ""
		}
		i, ok := index[key]
		if !ok {
			i = len(v.Domains)
			index[key] = i
			v.Domains = append(v.Domains, Domain{Cluster: key})
		}
		v.Domains[i].Shards = append(v.Domains[i].Shards, p)
	}
	for di := range v.Domains {
		d := &v.Domains[di]
		for si, p := range d.Shards {
			buckets, err := space.ParseSet(p.Buckets)
			if err != nil {
				return View{}, fmt.Errorf("ShardingConfig %s/%s: shard %s reports buckets %q: %w", sc.Namespace, sc.Name, p.Shard, p.Buckets, err)
			}
			// A canary shard serves its namespaces exactly, and no other
			// shard does (route.Compile).
			var others []string
			for oi, o := range d.Shards {
				if oi != si {
					others = append(others, o.Namespaces...)
				}
			}
			d.ownerships = append(d.ownerships, sharding.NewOwnership(buckets, p.Namespaces, others))
		}
	}
	return v, nil
}

// Owner is the shard of one domain that serves a namespace; Shard is nil
// when no shard of the domain does.
type Owner struct {
	Cluster string
	Shard   *ctrlmeshv1alpha1.ShardPlacement
}

// OwnersOf returns the bucket of namespace and its owner in every domain.
func (v View) OwnersOf(namespace string) (bucket int, owners []Owner) {
	for _, d := range v.Domains {
		o := Owner{Cluster: d.Cluster}
		for i := range d.Shards {
			if d.ownerships[i].Owns(namespace) {
				o.Shard = &d.Shards[i]
				break
			}
		}
		owners = append(owners, o)
	}
	return v.Space.Bucket(namespace), owners
}

// BucketOwners returns, for each bucket of the domain, the index in
// d.Shards of the shard that serves the bucket's namespaces, or -1 for
// none. A canary shard that serves single namespaces of a bucket does not
// own the bucket; CanaryBuckets marks those.
func (d Domain) BucketOwners(space sharding.Space) []int {
	out := make([]int, space.Buckets())
	for b := range out {
		out[b] = -1
	}
	for i := range d.Shards {
		for _, b := range d.ownerships[i].Buckets.Buckets() {
			if out[b] < 0 {
				out[b] = i
			}
		}
	}
	return out
}

// CanaryBuckets are the buckets some of whose namespaces a canary shard of
// the domain serves exactly.
func (d Domain) CanaryBuckets(space sharding.Space) []int {
	var out []int
	for _, p := range d.Shards {
		for _, ns := range p.Namespaces {
			out = append(out, space.Bucket(ns))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
