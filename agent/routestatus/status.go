package routestatus

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// maxNamedPods bounds the pods a ProxiesPending message names.
const maxNamedPods = 5

// podStatuses returns the entries of the candidate pods — the live pods the
// route's selector matches — and the entries of other live pods whose proxy
// reported a hash or asks for renewals. The latter keep only those:
// dropping them would only make the proxy write them again, and again.
// Entries of gone pods are dropped. Every proxy's report, and every grant,
// is kept as written. Both come in
// the order of pod names; pods is sorted by name in place.
func podStatuses(route *ctrlmeshv1alpha1.ShardRoute, pods []corev1.Pod) (candidates, others []ctrlmeshv1alpha1.PodRouteStatus) {
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	// Selectors that do not parse select nothing; RulesApplied reports why.
	selector, err := metav1.LabelSelectorAsSelector(&route.Spec.Selector)
	if err != nil {
		selector = labels.Nothing()
	}
	canary, err := metav1.LabelSelectorAsSelector(route.Spec.CanarySelector)
	if err != nil || route.Spec.CanarySelector == nil {
		canary = labels.Nothing()
	}
	// Subsets' selectors that do not parse select nothing either.
	type subset struct {
		name     string
		selector labels.Selector
	}
	var subsets []subset
	for _, s := range route.Spec.Subsets {
		if sel, err := metav1.LabelSelectorAsSelector(&s.Selector); err == nil {
			subsets = append(subsets, subset{name: s.Name, selector: sel})
		}
	}
	subsetOf := func(podLabels map[string]string) string {
		for _, s := range subsets {
			if s.selector.Matches(labels.Set(podLabels)) {
				return s.name
			}
		}
		return ""
	}
	shardOf := map[string]string{}
	for _, shard := range route.Spec.Shards {
		for _, p := range shard.Pods {
			shardOf[p.Name] = shard.ID
		}
	}
	// What others wrote into the entries is kept as read: each proxy's
	// hash, renewal request and breakers, and the grants (see
	// ValidityGrants).
	reported := map[string]ctrlmeshv1alpha1.PodRouteStatus{}
	for _, p := range route.Status.Pods {
		reported[p.Name] = p
	}
	keep := func(entry ctrlmeshv1alpha1.PodRouteStatus) ctrlmeshv1alpha1.PodRouteStatus {
		r := reported[entry.Name]
		entry.AppliedRulesHash, entry.RenewalRequest, entry.RenewalGranted = r.AppliedRulesHash, r.RenewalRequest, r.RenewalGranted
		entry.Breakers = r.Breakers
		return entry
	}
	for i := range pods {
		pod := &pods[i]
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if !selector.Matches(labels.Set(pod.Labels)) {
			if r := reported[pod.Name]; r.AppliedRulesHash != "" || r.RenewalRequest != 0 {
				others = append(others, keep(ctrlmeshv1alpha1.PodRouteStatus{Name: pod.Name}))
			}
			continue
		}
		entry := ctrlmeshv1alpha1.PodRouteStatus{
			Name:    pod.Name,
			Address: pod.Status.PodIP,
			Ready:   isReady(pod),
			Canary:  canary.Matches(labels.Set(pod.Labels)),
			Shard:   shardOf[pod.Name],
		}
		// A canary pod is the canary's; any other belongs to the first
		// subset that selects it.
		if !entry.Canary {
			entry.Subset = subsetOf(pod.Labels)
		}
		candidates = append(candidates, keep(entry))
	}
	return candidates, others
}

func mergeByName(a, b []ctrlmeshv1alpha1.PodRouteStatus) []ctrlmeshv1alpha1.PodRouteStatus {
	merged := slices.Concat(a, b)
	slices.SortFunc(merged, func(x, y ctrlmeshv1alpha1.PodRouteStatus) int { return strings.Compare(x.Name, y.Name) })
	return merged
}

func isReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func shardLockName(route *ctrlmeshv1alpha1.ShardRoute, shard string) string {
	return ctrlmeshv1alpha1.ShardLockName(route.Spec.Controller.LeaderElectionName, shard)
}

// leaders returns the holder of every shard's unexpired lease — the
// shards of the spec and any other whose renamed lock exists — sorted by
// shard, and the earliest time one of those leases expires unless renewed
// (zero when none will). expiry says when a lease expires, false for
// never.
func leaders(leases map[string]*coordinationv1.Lease, candidates []ctrlmeshv1alpha1.PodRouteStatus, now time.Time,
	expiry func(*coordinationv1.Lease) (time.Time, bool)) ([]ctrlmeshv1alpha1.ShardLeader, time.Time) {
	var out []ctrlmeshv1alpha1.ShardLeader
	var nextExpiry time.Time
	for _, shard := range slices.Sorted(maps.Keys(leases)) {
		lease := leases[shard]
		if lease == nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			continue
		}
		if at, ok := expiry(lease); ok {
			if !at.After(now) {
				continue
			}
			if nextExpiry.IsZero() || at.Before(nextExpiry) {
				nextExpiry = at
			}
		}
		out = append(out, ctrlmeshv1alpha1.ShardLeader{Shard: shard, Pod: holderPod(*lease.Spec.HolderIdentity, candidates)})
	}
	return out, nextExpiry
}

// holderPod maps a lease holder identity to a candidate pod: the identity is
// the pod's name, or controller-runtime's "<hostname>_<uuid>" with the pod's
// name as hostname. Pod names cannot contain "_". Other identities are
// reported as they are.
func holderPod(identity string, candidates []ctrlmeshv1alpha1.PodRouteStatus) string {
	host, _, _ := strings.Cut(identity, "_")
	if slices.ContainsFunc(candidates, func(p ctrlmeshv1alpha1.PodRouteStatus) bool { return p.Name == host }) {
		return host
	}
	return identity
}

// proxiesReady is the ProxiesReady condition: every candidate pod's proxy
// reports spec.rulesHash.
func proxiesReady(route *ctrlmeshv1alpha1.ShardRoute, candidates []ctrlmeshv1alpha1.PodRouteStatus) metav1.Condition {
	cond := metav1.Condition{Type: ctrlmeshv1alpha1.ConditionProxiesReady, ObservedGeneration: route.Generation}
	if len(candidates) == 0 {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonNoCandidatePods, "no pod matches spec.selector"
		return cond
	}
	var lagging []string
	for _, p := range candidates {
		if p.AppliedRulesHash == route.Spec.RulesHash {
			continue
		}
		reports := p.AppliedRulesHash
		if reports == "" {
			reports = "nothing"
		}
		lagging = append(lagging, fmt.Sprintf("%s (reports %s)", p.Name, reports))
	}
	if len(lagging) == 0 {
		cond.Status, cond.Reason = metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonProxiesApplied
		cond.Message = fmt.Sprintf("all %d candidate pods report rules %s", len(candidates), route.Spec.RulesHash)
		return cond
	}
	named := strings.Join(lagging[:min(len(lagging), maxNamedPods)], ", ")
	if more := len(lagging) - maxNamedPods; more > 0 {
		named += fmt.Sprintf(" and %d more", more)
	}
	cond.Status, cond.Reason = metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonProxiesPending
	cond.Message = fmt.Sprintf("%d of %d candidate pods do not report rules %s: %s", len(lagging), len(candidates), route.Spec.RulesHash, named)
	return cond
}
