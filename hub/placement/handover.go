package placement

import (
	"fmt"
	"maps"
	"slices"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// Rules are the rules the hub has published for a placement domain, at one
// generation; the zero Rules is nothing published. Each RuleShard becomes a
// RouteShard, except one with no buckets, pending buckets or namespaces (a
// canary shard whose namespaces are all pending): RouteShard validation
// refuses it, and its pods serve nothing either way.
type Rules struct {
	// Generation increases with every change; 0 means nothing published yet.
	Generation int64
	// Shards, sorted by ID.
	Shards []RuleShard
}

// RuleShard is one shard of the published rules.
type RuleShard struct {
	ID      string
	Cluster string
	Canary  bool
	Pods    []PodID
	// Buckets the shard's pods may serve now.
	Buckets sharding.Set
	// PendingBuckets are the shard's in the desired placement but served by
	// no shard yet, while the pods of their previous owner may still serve
	// them. A bucket is also held back from its own shard while one of its
	// namespaces moves to or from the canary.
	PendingBuckets sharding.Set
	// Namespaces the shard serves exactly; every other shard excludes them.
	Namespaces []string
	// PendingNamespaces are granted but served by no shard yet. While a
	// namespace is pending its bucket is pending too, so no proxy serves it.
	// The hub keeps this for status; RouteShard has no such field.
	PendingNamespaces []string
}

// HasPending reports whether some bucket or namespace waits for its previous
// owner to let go.
func (r Rules) HasPending() bool {
	return slices.ContainsFunc(r.Shards, func(s RuleShard) bool {
		return !s.PendingBuckets.IsEmpty() || len(s.PendingNamespaces) > 0
	})
}

// PodAck is what the hub knows of one pod's proxy.
type PodAck struct {
	Pod PodID
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
	// Rules to publish. Equal to the published rules, generation included,
	// when Changed is false.
	Rules   Rules
	Changed bool
	// Revoked lists, per shard, what it stops serving in this step.
	Revoked []Change
	// Granted lists, per shard, what it starts serving in this step: the
	// buckets and namespaces that moved (or came back after being held
	// back).
	Granted []Change
	// WaitingFor are the live pods whose acknowledgement of Rules.Generation
	// the pending grants wait for; empty when nothing is pending.
	WaitingFor []PodID
}

// Handover computes the next rules that move the published rules towards the
// desired placement without two owners. A bucket or namespace changes owner
// in two steps: first it is revoked (served by no shard, and pending for its
// new owner), then granted. A grant waits until every live pod enforces the
// latest published generation, in which nobody serves what is granted; pods
// that are gone do not count. When every pod of the previous owner is gone,
// and every live pod enforces the latest generation, the two steps are one.
//
// Waiting for every live pod, not only the previous owner's, is deliberate:
// pods move between shards (a spare from a dissolved shard refills another)
// and a pod that never acknowledged may still load an older generation, so
// "the pods of the previous owner" is not known from the latest rules alone.
//
// A pod that the published rules list but acks does not report is taken as
// live and never acknowledged. Calling Handover again without new
// acknowledgements changes nothing.
func Handover(desired Placement, published Rules, acks []PodAck) (Step, error) {
	space := desired.Space
	want, err := ownersOfPlacement(desired)
	if err != nil {
		return Step{}, err
	}
	current, err := ownersOfRules(space, published)
	if err != nil {
		return Step{}, err
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

	rules := Rules{Generation: published.Generation, Shards: next.ruleShards(space, desired)}
	step := Step{Rules: rules}
	if !slices.EqualFunc(rules.Shards, published.Shards, RuleShard.equal) {
		step.Rules.Generation++
		step.Changed = true
	}
	step.Revoked, step.Granted = changes(space, current, next, tracked)
	if step.Rules.HasPending() {
		// The next call reads the rules published now.
		for pod, acked := range livePods(step.Rules, acks) {
			if acked < step.Rules.Generation {
				step.WaitingFor = append(step.WaitingFor, pod)
			}
		}
		slices.SortFunc(step.WaitingFor, ComparePodIDs)
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
func (h handoff) nextOwners(space sharding.Space, current, want owners) (next owners, tracked []string) {
	tracked = sortedUnique(slices.Concat(slices.Collect(maps.Keys(want.exact)), slices.Collect(maps.Keys(current.exact))))
	next = owners{bucket: make([]string, space.Buckets()), exact: map[string]string{}}
	for b := range next.bucket {
		next.bucket[b] = h.advance(current.bucket[b], want.bucket[b])
	}
	nsOwner := map[string]string{}
	for _, ns := range tracked {
		nsOwner[ns] = h.advance(current.namespace(space, ns), want.namespace(space, ns))
		if nsOwner[ns] == "" {
			// A proxy serves a namespace no shard lists with its bucket: the
			// only way to have nobody serve it is to hold the bucket back.
			next.bucket[space.Bucket(ns)] = ""
		}
	}
	for _, ns := range tracked {
		_, wantedExact := want.exact[ns]
		if owner := nsOwner[ns]; owner != "" && (wantedExact || owner != next.bucket[space.Bucket(ns)]) {
			next.exact[ns] = owner
		}
	}
	return next, tracked
}

func checkAcks(published Rules, acks []PodAck) error {
	for _, a := range acks {
		if a.Acked > published.Generation || a.Acked < 0 {
			return fmt.Errorf("pod %s acknowledged generation %d, but generation %d is the latest published", a.Pod, a.Acked, published.Generation)
		}
	}
	return nil
}

// livePods maps every pod that may still enforce rules to the generation it
// acknowledged.
func livePods(published Rules, acks []PodAck) map[PodID]int64 {
	live := map[PodID]int64{}
	reported := map[PodID]bool{}
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

// owners is who serves what under some rules, read the way a proxy reads
// them: a namespace that a shard lists goes to that shard, any other
// namespace to the owner of its bucket. "" is nobody.
type owners struct {
	bucket []string
	exact  map[string]string
}

func (o owners) namespace(space sharding.Space, ns string) string {
	if owner, ok := o.exact[ns]; ok {
		return owner
	}
	return o.bucket[space.Bucket(ns)]
}

// claim records that shard serves buckets and namespaces, refusing a second
// owner.
func (o owners) claim(shard string, buckets sharding.Set, namespaces []string) error {
	for _, b := range buckets.Buckets() {
		if o.bucket[b] != "" {
			return fmt.Errorf("bucket %d is given to both shard %q and shard %q", b, o.bucket[b], shard)
		}
		o.bucket[b] = shard
	}
	for _, ns := range namespaces {
		if prev, ok := o.exact[ns]; ok {
			return fmt.Errorf("namespace %q is given to both shard %q and shard %q", ns, prev, shard)
		}
		o.exact[ns] = shard
	}
	return nil
}

func ownersOfPlacement(p Placement) (owners, error) {
	if p.Space.Buckets() == 0 {
		return owners{}, fmt.Errorf("desired placement has no bucket space")
	}
	o := owners{bucket: make([]string, p.Space.Buckets()), exact: map[string]string{}}
	for _, s := range p.Shards {
		if err := checkSpace(p.Space, s.Buckets, fmt.Sprintf("desired shard %q buckets", s.ID)); err != nil {
			return owners{}, err
		}
		if err := o.claim(s.ID, s.Buckets, s.Namespaces); err != nil {
			return owners{}, fmt.Errorf("desired placement: %w", err)
		}
	}
	return o, nil
}

func ownersOfRules(space sharding.Space, r Rules) (owners, error) {
	o := owners{bucket: make([]string, space.Buckets()), exact: map[string]string{}}
	for _, s := range r.Shards {
		if err := checkSpace(space, s.Buckets, fmt.Sprintf("published shard %q buckets", s.ID)); err != nil {
			return owners{}, err
		}
		if err := checkSpace(space, s.PendingBuckets, fmt.Sprintf("published shard %q pending buckets", s.ID)); err != nil {
			return owners{}, err
		}
		if err := o.claim(s.ID, s.Buckets, s.Namespaces); err != nil {
			return owners{}, fmt.Errorf("published rules at generation %d: %w", r.Generation, err)
		}
	}
	return o, nil
}

// ruleShards lays the owners out as the desired shards' rules: what each
// serves, and what it is granted but does not serve yet.
func (o owners) ruleShards(space sharding.Space, desired Placement) []RuleShard {
	out := make([]RuleShard, 0, len(desired.Shards))
	for _, s := range desired.Shards {
		var served []int
		for b, owner := range o.bucket {
			if owner == s.ID {
				served = append(served, b)
			}
		}
		var namespaces, pendingNamespaces []string
		for ns, owner := range o.exact {
			if owner == s.ID {
				namespaces = append(namespaces, ns)
			}
		}
		for _, ns := range s.Namespaces {
			if o.namespace(space, ns) != s.ID {
				pendingNamespaces = append(pendingNamespaces, ns)
			}
		}
		buckets := setOf(space, served)
		out = append(out, RuleShard{
			ID:                s.ID,
			Cluster:           s.Cluster,
			Canary:            s.Canary,
			Pods:              s.Pods,
			Buckets:           buckets,
			PendingBuckets:    s.Buckets.Difference(buckets),
			Namespaces:        sortedUnique(namespaces),
			PendingNamespaces: sortedUnique(pendingNamespaces),
		})
	}
	return out
}

func (s RuleShard) equal(o RuleShard) bool {
	return s.ID == o.ID && s.Cluster == o.Cluster && s.Canary == o.Canary && slices.Equal(s.Pods, o.Pods) &&
		s.Buckets.Equal(o.Buckets) && s.PendingBuckets.Equal(o.PendingBuckets) &&
		slices.Equal(s.Namespaces, o.Namespaces) && slices.Equal(s.PendingNamespaces, o.PendingNamespaces)
}

// changes lists, per shard, the buckets and tracked namespaces whose owner
// changed between two sets of owners.
func changes(space sharding.Space, before, after owners, tracked []string) (revoked, granted []Change) {
	lost := map[string]*delta{}
	gained := map[string]*delta{}
	for b := range before.bucket {
		if from, to := before.bucket[b], after.bucket[b]; from != to {
			deltaOf(lost, from).buckets = append(deltaOf(lost, from).buckets, b)
			deltaOf(gained, to).buckets = append(deltaOf(gained, to).buckets, b)
		}
	}
	for _, ns := range tracked {
		if from, to := before.namespace(space, ns), after.namespace(space, ns); from != to {
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
	for _, shard := range slices.SortedFunc(maps.Keys(m), CompareShardIDs) {
		if shard == "" {
			continue
		}
		out = append(out, Change{Shard: shard, Buckets: setOf(space, m[shard].buckets), Namespaces: m[shard].namespaces})
	}
	return out
}
