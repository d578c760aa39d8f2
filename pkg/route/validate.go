package route

import (
	"errors"
	"fmt"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// Owners is who serves what under a route, read the way a proxy reads it: a
// namespace that a shard lists goes to that shard, any other namespace to the
// owner of its bucket. "" is nobody.
type Owners struct {
	Space sharding.Space
	// Bucket is the shard serving each bucket of Space.
	Bucket []string
	// Exact is the shard serving each namespace a shard lists.
	Exact map[string]string
}

// NewOwners is nobody serving anything of space.
func NewOwners(space sharding.Space) Owners {
	return Owners{Space: space, Bucket: make([]string, space.Buckets()), Exact: map[string]string{}}
}

// Namespace is the shard serving the namespace, "" for nobody.
func (o Owners) Namespace(namespace string) string {
	if owner, ok := o.Exact[namespace]; ok {
		return owner
	}
	return o.Bucket[o.Space.Bucket(namespace)]
}

// Validate checks the rule every route must keep, whoever reads it: no two
// shards serve a bucket now, list a namespace or have a pod, and no shard ID
// is listed twice. Buckets pending for a shard are served by nobody, so they
// may be pending for one shard and served by another. Every set must be one
// of space: a zero Set is not. It returns who serves what.
func Validate(space sharding.Space, shards []Shard) (Owners, error) {
	if space.Buckets() == 0 {
		return Owners{}, errors.New("no bucket space")
	}
	owners := NewOwners(space)
	seen := map[string]bool{}
	podShard := map[PodID]string{}
	for _, s := range shards {
		if seen[s.ID] {
			return Owners{}, fmt.Errorf("shard %q is listed twice", s.ID)
		}
		seen[s.ID] = true
		for _, set := range []struct {
			what string
			set  sharding.Set
		}{{"buckets", s.Buckets}, {"pending buckets", s.PendingBuckets}} {
			if set.set.Space() != space {
				return Owners{}, fmt.Errorf("shard %q: %s are a set of %d buckets, want %d", s.ID, set.what, set.set.Space().Buckets(), space.Buckets())
			}
		}
		for _, b := range s.Buckets.Buckets() {
			if prev := owners.Bucket[b]; prev != "" {
				return Owners{}, fmt.Errorf("bucket %d is served by both shard %q and shard %q", b, prev, s.ID)
			}
			owners.Bucket[b] = s.ID
		}
		for _, ns := range s.Namespaces {
			if prev, ok := owners.Exact[ns]; ok {
				return Owners{}, fmt.Errorf("namespace %q is served by both shard %q and shard %q", ns, prev, s.ID)
			}
			owners.Exact[ns] = s.ID
		}
		for _, p := range s.Pods {
			if prev, ok := podShard[p]; ok {
				return Owners{}, fmt.Errorf("pod %s is listed in both shard %q and shard %q", p, prev, s.ID)
			}
			podShard[p] = s.ID
		}
	}
	return owners, nil
}
