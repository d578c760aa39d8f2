package placement

import (
	"fmt"
	"maps"
	"slices"

	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// PodAck is what the hub knows of one pod's proxy.
type PodAck struct {
	Pod route.PodID
	// Acked is the last generation the pod's proxy reports enforcing; 0 if
	// it never reported.
	Acked int64
	// Gone is true once the pod can enforce nothing any more: its shard lease
	// and its cluster's heartbeat have expired. Only the caller can say so.
	Gone bool
}

// Change is what one shard started or stopped serving in a step.
type Change struct {
	Shard      string
	Buckets    sharding.Set
	Namespaces []string
}

// Step is the result of Handover.
type Step struct {
	// Table to publish. Equal to the published table, generation included,
	// when Changed is false.
	Table   route.Table
	Changed bool
	// Revoked lists, per shard, what it stops serving in this step.
	Revoked []Change
	// Granted lists, per shard, what it starts serving in this step: the
	// buckets and namespaces that moved (or came back after being held
	// back).
	Granted []Change
	// WaitingFor are the live pods whose acknowledgement of Table.Generation
	// the pending grants wait for; empty when nothing is pending.
	WaitingFor []route.PodID
}

// Handover computes the next route table that moves the published table
// towards the desired placement without two owners. A bucket or namespace
// changes owner in two steps: first it is revoked (served by no shard, and
// pending for its new owner), then granted. A grant waits until every live
// pod enforces the latest published generation, in which nobody serves what
// is granted; pods that are gone do not count. When every pod of the
// previous owner is gone, and every live pod enforces the latest generation,
// the two steps are one.
//
// Waiting for every live pod, not only the previous owner's, is deliberate:
// pods move between shards (a spare from a dissolved shard refills another)
// and a pod that never acknowledged may still load an older generation, so
// "the pods of the previous owner" is not known from the latest table alone.
//
// A pod that the published table lists but acks does not report is taken as
// live and never acknowledged. Calling Handover again without new
// acknowledgements changes nothing.
func Handover(desired Placement, published route.Table, acks []PodAck) (Step, error) {
	space := desired.Space
	want, err := ownersOfPlacement(desired)
	if err != nil {
		return Step{}, err
	}
	current, err := route.Validate(space, published.Shards)
	if err != nil {
		return Step{}, fmt.Errorf("the table published at generation %d: %w", published.Generation, err)
	}
	if err := checkAcks(published, acks); err != nil {
		return Step{}, err
	}
	live := livePods(published, acks)
	h := handoff{allEnforceLatest: true, hasLivePods: map[string]bool{}}
	for _, acked := range live {
		h.allEnforceLatest = h.allEnforceLatest && acked == published.Generation
	}
	for _, s := range published.Shards {
		for _, p := range s.Pods {
			if _, ok := live[p]; ok {
				h.hasLivePods[s.ID] = true
			}
		}
	}
	next, tracked := h.nextOwners(space, current, want)

	table := route.Table{Generation: published.Generation, Shards: tableShards(next, desired)}
	step := Step{Table: table}
	if !slices.EqualFunc(table.Shards, published.Shards, route.Shard.Equal) {
		step.Table.Generation++
		step.Changed = true
	}
	step.Revoked, step.Granted = changes(space, current, next, tracked)
	if step.Table.HasPending() {
		// The next call reads the table published now.
		for pod, acked := range livePods(step.Table, acks) {
			if acked < step.Table.Generation {
				step.WaitingFor = append(step.WaitingFor, pod)
			}
		}
		slices.SortFunc(step.WaitingFor, route.ComparePodIDs)
	}
	return step, nil
}

// handoff is what decides whether a bucket or namespace may be granted.
type handoff struct {
	// allEnforceLatest: every live pod enforces the latest published
	// generation, so none can serve under older rules.
	allEnforceLatest bool
	// hasLivePods lists the published shards that have a live pod.
	hasLivePods map[string]bool
}

// advance is the next owner of a bucket or namespace. It keeps its owner or
// loses it; it goes to the owner it should have only when nobody can still
// serve it: no live pod enforces older rules, and the current owner, if any,
// has no live pod. So it never passes from one shard's live pods to
// another's.
func (h handoff) advance(current, want string) string {
	switch {
	case current == want:
		return want
	case h.allEnforceLatest && !h.hasLivePods[current]:
		return want
	}
	return ""
}

// nextOwners advances every bucket and every tracked namespace: those some
// shard lists now or should list. Every other namespace goes with its
// bucket.
func (h handoff) nextOwners(space sharding.Space, current, want route.Owners) (next route.Owners, tracked []string) {
	tracked = sortedUnique(slices.Concat(slices.Collect(maps.Keys(want.Exact)), slices.Collect(maps.Keys(current.Exact))))
	next = route.NewOwners(space)
	for b := range next.Bucket {
		next.Bucket[b] = h.advance(current.Bucket[b], want.Bucket[b])
	}
	nsOwner := map[string]string{}
	for _, ns := range tracked {
		nsOwner[ns] = h.advance(current.Namespace(ns), want.Namespace(ns))
		if nsOwner[ns] == "" {
			// A proxy serves a namespace no shard lists with its bucket: the
			// only way to have nobody serve it is to hold the bucket back.
			next.Bucket[space.Bucket(ns)] = ""
		}
	}
	for _, ns := range tracked {
		_, wantedExact := want.Exact[ns]
		if owner := nsOwner[ns]; owner != "" && (wantedExact || owner != next.Bucket[space.Bucket(ns)]) {
			next.Exact[ns] = owner
		}
	}
	return next, tracked
}

func checkAcks(published route.Table, acks []PodAck) error {
	for _, a := range acks {
		if a.Acked > published.Generation || a.Acked < 0 {
			return fmt.Errorf("pod %s acknowledged generation %d, but generation %d is the latest published", a.Pod, a.Acked, published.Generation)
		}
	}
	return nil
}

// livePods maps every pod that may still enforce a route to the generation
// it acknowledged.
func livePods(published route.Table, acks []PodAck) map[route.PodID]int64 {
	live := map[route.PodID]int64{}
	reported := map[route.PodID]bool{}
	for _, a := range acks {
		reported[a.Pod] = true
		if !a.Gone {
			live[a.Pod] = a.Acked
		}
	}
	for _, s := range published.Shards {
		for _, p := range s.Pods {
			if !reported[p] {
				live[p] = 0
			}
		}
	}
	return live
}

// ownersOfPlacement is who serves what in the desired placement, which must
// keep the ownership rule of a route table.
func ownersOfPlacement(p Placement) (route.Owners, error) {
	shards := make([]route.Shard, 0, len(p.Shards))
	for _, s := range p.Shards {
		shards = append(shards, route.Shard{
			ID: s.ID, Cluster: s.Cluster, Canary: s.Canary, Subset: s.Subset, Pods: s.Pods,
			Buckets: s.Buckets, PendingBuckets: setOf(p.Space, nil), Namespaces: s.Namespaces,
		})
	}
	owners, err := route.Validate(p.Space, shards)
	if err != nil {
		return route.Owners{}, fmt.Errorf("desired placement: %w", err)
	}
	return owners, nil
}

// tableShards lays the owners out as the desired shards' table: what each
// serves, and what it is granted but does not serve yet.
func tableShards(o route.Owners, desired Placement) []route.Shard {
	space := desired.Space
	out := make([]route.Shard, 0, len(desired.Shards))
	for _, s := range desired.Shards {
		var served []int
		for b, owner := range o.Bucket {
			if owner == s.ID {
				served = append(served, b)
			}
		}
		var namespaces, pendingNamespaces []string
		for ns, owner := range o.Exact {
			if owner == s.ID {
				namespaces = append(namespaces, ns)
			}
		}
		for _, ns := range s.Namespaces {
			if o.Namespace(ns) != s.ID {
				pendingNamespaces = append(pendingNamespaces, ns)
			}
		}
		buckets := setOf(space, served)
		out = append(out, route.Shard{
			ID:                s.ID,
			Cluster:           s.Cluster,
			Canary:            s.Canary,
			Subset:            s.Subset,
			Pods:              s.Pods,
			Buckets:           buckets,
			PendingBuckets:    s.Buckets.Difference(buckets),
			Namespaces:        sortedUnique(namespaces),
			PendingNamespaces: sortedUnique(pendingNamespaces),
		})
	}
	return out
}

// changes lists, per shard, the buckets and tracked namespaces whose owner
// changed between two sets of owners.
func changes(space sharding.Space, before, after route.Owners, tracked []string) (revoked, granted []Change) {
	lost := map[string]*delta{}
	gained := map[string]*delta{}
	for b := range before.Bucket {
		if from, to := before.Bucket[b], after.Bucket[b]; from != to {
			deltaOf(lost, from).buckets = append(deltaOf(lost, from).buckets, b)
			deltaOf(gained, to).buckets = append(deltaOf(gained, to).buckets, b)
		}
	}
	for _, ns := range tracked {
		if from, to := before.Namespace(ns), after.Namespace(ns); from != to {
			deltaOf(lost, from).namespaces = append(deltaOf(lost, from).namespaces, ns)
			deltaOf(gained, to).namespaces = append(deltaOf(gained, to).namespaces, ns)
		}
	}
	return changeList(space, lost), changeList(space, gained)
}

type delta struct {
	buckets    []int
	namespaces []string
}

func deltaOf(m map[string]*delta, shard string) *delta {
	if m[shard] == nil {
		m[shard] = &delta{}
	}
	return m[shard]
}

// changeList turns per-shard deltas into Changes sorted by shard; the
// nobody-owner "" is left out.
func changeList(space sharding.Space, m map[string]*delta) []Change {
	var out []Change
	for _, shard := range slices.SortedFunc(maps.Keys(m), route.CompareShardIDs) {
		if shard == "" {
			continue
		}
		out = append(out, Change{Shard: shard, Buckets: setOf(space, m[shard].buckets), Namespaces: m[shard].namespaces})
	}
	return out
}
