// Package rules compiles a ShardRoute into the immutable Snapshot one proxy
// enforces: which namespaces its pod serves, which resources are sharded and
// with which extra selector, the leader-election lock to rename, and where
// the other shards' pods are. Compile refuses rules that cannot be enforced
// safely; the proxy then keeps the last good snapshot.
package rules

import (
	"errors"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// Mode is how the proxy narrows list and watch.
type Mode string

const (
	// ModeRange asks kube-apiserver to filter by hash range (KEP-5866).
	ModeRange Mode = "range"
	// ModeLabel selects on the ctrlmesh.io/sharding-hash label.
	ModeLabel Mode = "label"
)

// Scopes tells whether the API server serves a resource, and whether it is
// namespaced. It is the seam over discovery.
type Scopes interface {
	IsNamespaced(gr schema.GroupResource) (bool, error)
}

// Limit is one compiled limit: the resources it names and its own selector.
type Limit struct {
	groups    []string
	resources []string
	// Requirements of the limit's own selector, ANDed into every request.
	Requirements labels.Requirements
}

// Matches reports whether the limit names the group/resource ("*" matches all).
func (l *Limit) Matches(gr schema.GroupResource) bool {
	return (slices.Contains(l.groups, "*") || slices.Contains(l.groups, gr.Group)) &&
		(slices.Contains(l.resources, "*") || slices.Contains(l.resources, gr.Resource))
}

// Snapshot is the compiled rules for one pod. It is never modified.
type Snapshot struct {
	// Route is the rules object it was compiled from.
	Route *ctrlmeshv1alpha1.ShardRoute
	// Pod the snapshot is for.
	Pod string
	// Mode the selectors are written for.
	Mode Mode
	// Shard is the pod's shard, "" when the rules do not list the pod: such a
	// pod serves nothing.
	Shard string
	// Ownership is what the pod's shard serves now.
	Ownership sharding.Ownership
	// Limits in the order of the rules.
	Limits []Limit
	// LeaderElectionName is the lock to rename, "" for none.
	LeaderElectionName string

	space sharding.Space
	// owners of each bucket and exact namespace, for routing admission
	// requests to the shard that serves an object.
	bucketOwner    []*ctrlmeshv1alpha1.RouteShard
	namespaceOwner map[string]*ctrlmeshv1alpha1.RouteShard
}

// Hash is the rules hash the snapshot enforces.
func (s *Snapshot) Hash() string { return s.Route.Spec.RulesHash }

// Generation is the routing generation of the rules.
func (s *Snapshot) Generation() int64 { return s.Route.Spec.RoutingGeneration }

// Assigned reports whether the pod belongs to a shard: it may take the
// shard's leader-election lock.
func (s *Snapshot) Assigned() bool { return s.Shard != "" }

// Serving reports whether the pod's shard serves anything now; a shard whose
// buckets are all still pending does not.
func (s *Snapshot) Serving() bool { return s.Shard != "" && !s.Ownership.IsEmpty() }

// Owns reports whether the pod's shard serves the namespace.
func (s *Snapshot) Owns(namespace string) bool {
	return s.Assigned() && s.Ownership.Owns(namespace)
}

// Bucket is the namespace's bucket under these rules.
func (s *Snapshot) Bucket(namespace string) int { return s.space.Bucket(namespace) }

// LimitFor returns the limit that shards the resource, if any.
func (s *Snapshot) LimitFor(gr schema.GroupResource) (*Limit, bool) {
	for i := range s.Limits {
		if s.Limits[i].Matches(gr) {
			return &s.Limits[i], true
		}
	}
	return nil, false
}

// OwnerOf returns the shard that serves the namespace now, or nil while no
// shard does (its bucket is pending).
func (s *Snapshot) OwnerOf(namespace string) *ctrlmeshv1alpha1.RouteShard {
	if owner, ok := s.namespaceOwner[namespace]; ok {
		return owner
	}
	return s.bucketOwner[s.space.Bucket(namespace)]
}

// SameSelectionOf reports whether both snapshots select the same objects of
// one resource for this pod: same mode, shard and ownership, and the
// resource either unsharded in both or sharded by limits with the same
// selector. Watches of the resource opened under one stay right under the
// other, even when the limits of other resources changed.
func (s *Snapshot) SameSelectionOf(other *Snapshot, gr schema.GroupResource) bool {
	if s == nil || other == nil {
		return s == other
	}
	if !s.sameShard(other) {
		return false
	}
	a, aSharded := s.LimitFor(gr)
	b, bSharded := other.LimitFor(gr)
	if aSharded != bSharded {
		return false
	}
	return !aSharded || a.Requirements.String() == b.Requirements.String()
}

// SameSelection reports whether both snapshots select the same objects for
// this pod: same mode, shard ownership and limits. Watches opened under one
// stay right under the other.
func (s *Snapshot) SameSelection(other *Snapshot) bool {
	if s == nil || other == nil {
		return s == other
	}
	if !s.sameShard(other) || len(s.Limits) != len(other.Limits) {
		return false
	}
	for i := range s.Limits {
		a, b := s.Limits[i], other.Limits[i]
		if !slices.Equal(a.groups, b.groups) || !slices.Equal(a.resources, b.resources) || a.Requirements.String() != b.Requirements.String() {
			return false
		}
	}
	return true
}

// sameShard reports whether both (non-nil) snapshots are of one mode, one
// shard and the same bucket ownership: the part of a selection common to
// every resource.
func (s *Snapshot) sameShard(other *Snapshot) bool {
	return s.Mode == other.Mode && s.Shard == other.Shard && s.Ownership.Equal(other.Ownership)
}

// Compile checks the rules and compiles them for one pod. Errors say what is
// wrong in terms of the rules object.
func Compile(route *ctrlmeshv1alpha1.ShardRoute, pod string, mode Mode, scopes Scopes) (*Snapshot, error) {
	if route == nil {
		return nil, errors.New("no rules")
	}
	spec := &route.Spec
	if spec.RulesHash == "" {
		return nil, errors.New("rules have no rulesHash")
	}
	space, err := sharding.NewSpace(int(spec.Buckets))
	if err != nil {
		return nil, fmt.Errorf("spec.buckets: %w", err)
	}
	limits, err := CompileLimits(spec.Limits, scopes)
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{
		Route:          route.DeepCopy(),
		Pod:            pod,
		Mode:           mode,
		Limits:         limits,
		space:          space,
		bucketOwner:    make([]*ctrlmeshv1alpha1.RouteShard, space.Buckets()),
		namespaceOwner: map[string]*ctrlmeshv1alpha1.RouteShard{},
	}
	if spec.Controller != nil {
		snap.LeaderElectionName = spec.Controller.LeaderElectionName
	}

	var mine *ctrlmeshv1alpha1.RouteShard
	var mineBuckets, minePending sharding.Set
	var othersNamespaces []string
	shards := snap.Route.Spec.Shards
	for i := range shards {
		shard := &shards[i]
		served, err := space.ParseSet(shard.Buckets)
		if err != nil {
			return nil, fmt.Errorf("shard %q buckets: %w", shard.ID, err)
		}
		pending, err := space.ParseSet(shard.PendingBuckets)
		if err != nil {
			return nil, fmt.Errorf("shard %q pendingBuckets: %w", shard.ID, err)
		}
		for _, b := range served.Buckets() {
			if prev := snap.bucketOwner[b]; prev != nil {
				return nil, fmt.Errorf("bucket %d is served by both shard %q and shard %q", b, prev.ID, shard.ID)
			}
			snap.bucketOwner[b] = shard
		}
		for _, ns := range shard.Namespaces {
			if prev, ok := snap.namespaceOwner[ns]; ok {
				return nil, fmt.Errorf("namespace %q is served by both shard %q and shard %q", ns, prev.ID, shard.ID)
			}
			snap.namespaceOwner[ns] = shard
		}
		isMine := slices.ContainsFunc(shard.Pods, func(p ctrlmeshv1alpha1.RoutePod) bool { return p.Name == pod })
		if isMine {
			if mine != nil {
				return nil, fmt.Errorf("pod %q is listed in both shard %q and shard %q", pod, mine.ID, shard.ID)
			}
			mine, mineBuckets, minePending = shard, served, pending
		} else {
			othersNamespaces = append(othersNamespaces, shard.Namespaces...)
		}
	}
	if mine == nil {
		return snap, nil
	}
	snap.Shard = mine.ID
	snap.Ownership = sharding.NewOwnership(mineBuckets, mine.Namespaces, othersNamespaces)
	if snap.Ownership.IsEmpty() {
		// A new shard waits for its buckets or namespaces while their
		// previous owners let them go (revoke before grant): it leads its
		// lock but serves nothing.
		if !minePending.IsEmpty() || len(mine.PendingNamespaces) > 0 {
			return snap, nil
		}
		return nil, fmt.Errorf("shard %q of pod %q has an empty bucket set, no pending buckets and no namespaces: a listed pod must serve something", mine.ID, pod)
	}
	if mode == ModeLabel {
		if _, err := snap.Ownership.LabelRequirements(); err != nil {
			return nil, fmt.Errorf("shard %q in label mode: %w", mine.ID, err)
		}
	}
	return snap, nil
}

// ProbeResource is the first resource the rules' limits name without
// wildcards: one the operator may list, to ask the API server what it supports.
func ProbeResource(route *ctrlmeshv1alpha1.ShardRoute) (schema.GroupResource, bool) {
	for _, l := range route.Spec.Limits {
		for _, rg := range l.RelateResources {
			for _, g := range rg.APIGroups {
				for _, r := range rg.Resources {
					if g != "*" && r != "*" {
						return schema.GroupResource{Group: g, Resource: r}, true
					}
				}
			}
		}
	}
	return schema.GroupResource{}, false
}

// CompileLimits checks the limits of a rules object: each names only namespaced
// resources the API server serves (wildcards aside), has a valid selector and
// shares no resource with another limit.
func CompileLimits(in ctrlmeshv1alpha1.Limits, scopes Scopes) ([]Limit, error) {
	if len(in) == 0 {
		return nil, errors.New("rules have no limits: nothing would be sharded")
	}
	out := make([]Limit, 0, len(in))
	for i, l := range in {
		var c Limit
		for _, rg := range l.RelateResources {
			c.groups = append(c.groups, rg.APIGroups...)
			c.resources = append(c.resources, rg.Resources...)
			for _, g := range rg.APIGroups {
				for _, r := range rg.Resources {
					if g == "*" || r == "*" {
						continue
					}
					gr := schema.GroupResource{Group: g, Resource: r}
					namespaced, err := scopes.IsNamespaced(gr)
					if err != nil {
						return nil, fmt.Errorf("limit %d: resource %q: %w", i, gr.String(), err)
					}
					if !namespaced {
						return nil, fmt.Errorf("limit %d: resource %q is cluster-scoped: only namespaced resources can be sharded by namespace", i, gr.String())
					}
				}
			}
		}
		slices.Sort(c.groups)
		c.groups = slices.Compact(c.groups)
		slices.Sort(c.resources)
		c.resources = slices.Compact(c.resources)
		if l.Selector != nil {
			sel, err := metav1.LabelSelectorAsSelector(l.Selector)
			if err != nil {
				return nil, fmt.Errorf("limit %d selector: %w", i, err)
			}
			c.Requirements, _ = sel.Requirements()
		}
		for j := range out {
			if overlaps(&out[j], &c) {
				return nil, fmt.Errorf("limits %d and %d name the same resource: a resource may be listed in only one limit", j, i)
			}
		}
		out = append(out, c)
	}
	return out, nil
}

func overlaps(a, b *Limit) bool {
	shared := func(x, y []string) bool {
		return slices.Contains(x, "*") || slices.Contains(y, "*") || slices.ContainsFunc(x, func(v string) bool { return slices.Contains(y, v) })
	}
	return shared(a.groups, b.groups) && shared(a.resources, b.resources)
}
