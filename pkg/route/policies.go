package route

import (
	"cmp"
	"fmt"
	"slices"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// maxPolicies bounds the CircuitBreakers and the FaultInjections a
// ShardRoute carries (the CRD's bound on spec.policies' lists).
const maxPolicies = 64

// BoundPolicies returns the traffic policies among cbs and fis bound to the
// ShardingConfig config (same namespace, spec.shardingConfig.name), sorted
// by name, as a ShardRoute carries them; nil for none. More than a route
// can carry is an error that says what to do, rather than some dropped.
func BoundPolicies(config *ctrlmeshv1alpha1.ShardingConfig, cbs []ctrlmeshv1alpha1.CircuitBreaker, fis []ctrlmeshv1alpha1.FaultInjection) (*ctrlmeshv1alpha1.RoutePolicies, error) {
	p := &ctrlmeshv1alpha1.RoutePolicies{}
	for i := range cbs {
		cb := &cbs[i]
		if cb.Namespace == config.Namespace && cb.Spec.ShardingConfig.Name == config.Name && cb.DeletionTimestamp.IsZero() {
			p.CircuitBreakers = append(p.CircuitBreakers, ctrlmeshv1alpha1.RouteCircuitBreaker{Name: cb.Name, Generation: max(cb.Generation, 1), Spec: *cb.Spec.DeepCopy()})
		}
	}
	for i := range fis {
		fi := &fis[i]
		if fi.Namespace == config.Namespace && fi.Spec.ShardingConfig.Name == config.Name && fi.DeletionTimestamp.IsZero() {
			p.FaultInjections = append(p.FaultInjections, ctrlmeshv1alpha1.RouteFaultInjection{Name: fi.Name, Generation: max(fi.Generation, 1), Spec: *fi.Spec.DeepCopy()})
		}
	}
	if len(p.CircuitBreakers) > maxPolicies || len(p.FaultInjections) > maxPolicies {
		return nil, fmt.Errorf("%d CircuitBreakers and %d FaultInjections name ShardingConfig %s/%s; its rules carry at most %d of each: merge some",
			len(p.CircuitBreakers), len(p.FaultInjections), config.Namespace, config.Name, maxPolicies)
	}
	if len(p.CircuitBreakers)+len(p.FaultInjections) == 0 {
		return nil, nil
	}
	slices.SortFunc(p.CircuitBreakers, func(a, b ctrlmeshv1alpha1.RouteCircuitBreaker) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(p.FaultInjections, func(a, b ctrlmeshv1alpha1.RouteFaultInjection) int { return cmp.Compare(a.Name, b.Name) })
	return p, nil
}

// SetPolicies makes p the traffic policies route carries and hashes its
// rules anew: a change of policies is a change of the rules, which the
// proxies report applying as any other.
func SetPolicies(route *ctrlmeshv1alpha1.ShardRoute, p *ctrlmeshv1alpha1.RoutePolicies) {
	route.Spec.Policies = p
	route.Spec.RulesHash = RulesHash(&route.Spec)
}
