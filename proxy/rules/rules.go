// Package rules compiles a ShardRoute into the immutable Snapshot one proxy
// enforces. What the route means — the pod's shard, what it serves, which
// shard serves every other namespace, and the one ownership check — is
// pkg/route's (route.Compile); this package adds what only a proxy needs:
// the selector mode, the limits compiled against the API server's discovery
// (which resources are sharded and with which extra selector), and the
// leader-election lock to rename. Compile refuses routes that cannot be
// enforced safely; the proxy then keeps the last good snapshot.
package rules

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/policy"
)

// Mode is how the proxy narrows list and watch.
type Mode string

const (
	// ModeRange asks kube-apiserver to filter by hash range (KEP-5866).
	ModeRange Mode = "range"
	// ModeLabel selects on the ctrlmesh.io/sharding-hash label.
	ModeLabel Mode = "label"
)

// ErrDiscovery marks a compile error that discovery caused, not the rules:
// the same rules may compile once discovery answers, so callers retry them
// rather than refuse them. A resource discovery does not know is the
// rules' fault and not marked.
var ErrDiscovery = errors.New("discovery failed")

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

// Snapshot is a route compiled for one pod. It is never modified.
type Snapshot struct {
	// Assignment is the pod's shard and what it serves, and the owner of
	// every namespace; OwnerOf returns shards of Route.
	route.Assignment
	// Route is the ShardRoute it was compiled from.
	Route *ctrlmeshv1alpha1.ShardRoute
	// Mode the selectors are written for.
	Mode Mode
	// Limits in the order of the route.
	Limits []Limit
	// LeaderElectionName is the lock to rename, "" for none.
	LeaderElectionName string
	// Policies are the route's traffic policies compiled for the pod.
	Policies *policy.Set
	// Isolation is the route's namespace isolation, nil for none. The
	// proxy puts the snapshot in force Isolated over the namespaces it
	// confirmed inside; inside holds them, sorted.
	Isolation *Isolation
	inside    []string
	// base is the shard's ownership before isolation, once isolated.
	base     sharding.Ownership
	isolated bool
}

// Hash is the rules hash the snapshot enforces.
func (s *Snapshot) Hash() string { return s.Route.Spec.RulesHash }

// Generation is the routing generation of the route.
func (s *Snapshot) Generation() int64 { return s.Route.Spec.RoutingGeneration }

// Validity is how long the rules are served past the sending of the last
// granted renewal request; 0 when they do not expire.
func (s *Snapshot) Validity() time.Duration { return route.Validity(&s.Route.Spec) }

// Expires reports whether the rules are served only while renewed.
func (s *Snapshot) Expires() bool { return s.Validity() > 0 }

// LimitFor returns the limit that shards the resource, if any.
func (s *Snapshot) LimitFor(gr schema.GroupResource) (*Limit, bool) {
	for i := range s.Limits {
		if s.Limits[i].Matches(gr) {
			return &s.Limits[i], true
		}
	}
	return nil, false
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
	if !aSharded {
		// Under isolation the proxy tracks unsharded namespaced reads too:
		// they follow the namespaces inside.
		return s.sameIsolation(other)
	}
	return a.Requirements.String() == b.Requirements.String()
}

// SameSelection reports whether both snapshots select the same objects for
// this pod: same mode, shard ownership and limits. Watches opened under one
// stay right under the other.
func (s *Snapshot) SameSelection(other *Snapshot) bool {
	if s == nil || other == nil {
		return s == other
	}
	if !s.sameShard(other) || !s.sameIsolation(other) || len(s.Limits) != len(other.Limits) {
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

// Compile checks the route and compiles it for one pod. Errors say what is
// wrong in terms of the ShardRoute.
func Compile(r *ctrlmeshv1alpha1.ShardRoute, pod string, mode Mode, scopes Scopes) (*Snapshot, error) {
	if r == nil {
		return nil, errors.New("no rules")
	}
	if r.Spec.RulesHash == "" {
		return nil, errors.New("rules have no rulesHash")
	}
	limits, err := CompileLimits(r.Spec.Limits, scopes)
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{Route: r.DeepCopy(), Mode: mode, Limits: limits}
	// The assignment points into the snapshot's own copy, which nobody
	// changes.
	if snap.Assignment, err = route.Compile(&snap.Route.Spec, pod); err != nil {
		return nil, err
	}
	if r.Spec.Controller != nil {
		snap.LeaderElectionName = r.Spec.Controller.LeaderElectionName
	}
	target := policy.Target{Shard: snap.Shard}
	for _, s := range r.Spec.Shards {
		target.Canary = target.Canary || (s.ID == snap.Shard && s.Canary)
	}
	if snap.Policies, err = policy.Compile(r.Spec.Policies, target); err != nil {
		return nil, err
	}
	if snap.Isolation, err = CompileIsolation(r.Spec.Isolation); err != nil {
		return nil, err
	}
	if mode == ModeLabel && snap.Serving() {
		if _, err := snap.Ownership.LabelRequirements(); err != nil {
			return nil, fmt.Errorf("shard %q in label mode: %w", snap.Shard, err)
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
					if err != nil && !meta.IsNoMatchError(err) {
						return nil, fmt.Errorf("limit %d: resource %q: %w: %w", i, gr.String(), ErrDiscovery, err)
					}
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
