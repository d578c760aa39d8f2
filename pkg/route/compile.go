package route

import (
	"fmt"
	"slices"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// Assignment is a ShardRoute read for one pod: the pod's shard, what that
// shard serves now, and which shard serves every other namespace, for
// routing admission requests to it.
type Assignment struct {
	// Pod the assignment is for.
	Pod string
	// Shard is the pod's shard, "" when the route does not list the pod:
	// such a pod serves nothing.
	Shard string
	// Ownership is what the pod's shard serves now.
	Ownership sharding.Ownership

	owners Owners
	// shards of the compiled spec, by ID.
	shards map[string]*ctrlmeshv1alpha1.RouteShard
}

// Compile reads spec for pod: it parses the shards, checks them with
// Validate, and finds the pod's shard. A listed pod must serve something or
// wait for something pending. OwnerOf returns shards of spec itself, so spec
// must not change afterwards.
func Compile(spec *ctrlmeshv1alpha1.ShardRouteSpec, pod string) (Assignment, error) {
	space, table, err := Parse(spec)
	if err != nil {
		return Assignment{}, err
	}
	owners, err := Validate(space, table.Shards)
	if err != nil {
		return Assignment{}, err
	}
	a := Assignment{Pod: pod, owners: owners, shards: make(map[string]*ctrlmeshv1alpha1.RouteShard, len(spec.Shards))}
	for i := range spec.Shards {
		a.shards[spec.Shards[i].ID] = &spec.Shards[i]
	}
	me := PodID{Cluster: spec.Cluster, Name: pod}
	i := slices.IndexFunc(table.Shards, func(s Shard) bool { return slices.Contains(s.Pods, me) })
	if i < 0 {
		return a, nil
	}
	mine := table.Shards[i]
	var othersNamespaces []string
	for _, s := range table.Shards {
		if s.ID != mine.ID {
			othersNamespaces = append(othersNamespaces, s.Namespaces...)
		}
	}
	a.Shard = mine.ID
	a.Ownership = sharding.NewOwnership(mine.Buckets, mine.Namespaces, othersNamespaces)
	// A new shard waits for its buckets or namespaces while their previous
	// owners let them go (revoke before grant): it leads its lock but serves
	// nothing.
	if a.Ownership.IsEmpty() && !mine.hasPending() {
		return Assignment{}, fmt.Errorf("shard %q of pod %q has an empty bucket set, no pending buckets and no namespaces: a listed pod must serve something", mine.ID, pod)
	}
	return a, nil
}

// Assigned reports whether the pod belongs to a shard: it may take the
// shard's leader-election lock.
func (a Assignment) Assigned() bool { return a.Shard != "" }

// Serving reports whether the pod's shard serves anything now; a shard whose
// buckets are all still pending does not.
func (a Assignment) Serving() bool { return a.Shard != "" && !a.Ownership.IsEmpty() }

// Owns reports whether the pod's shard serves the namespace.
func (a Assignment) Owns(namespace string) bool {
	return a.Assigned() && a.Ownership.Owns(namespace)
}

// Bucket is the namespace's bucket under the route.
func (a Assignment) Bucket(namespace string) int { return a.owners.Space.Bucket(namespace) }

// OwnerOf returns the shard that serves the namespace now, or nil while no
// shard does (its bucket is pending).
func (a Assignment) OwnerOf(namespace string) *ctrlmeshv1alpha1.RouteShard {
	id := a.owners.Namespace(namespace)
	if id == "" {
		return nil
	}
	return a.shards[id]
}
