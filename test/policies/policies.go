// Package policies holds the traffic policies the benchmarks load.
package policies

import (
	"fmt"

	"k8s.io/utils/ptr"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// Sample is n CircuitBreakers (each a rate limit, a breaker and a
// count-limited deny rule on a resource of its own, example.com/things<i>)
// and one FaultInjection of n faults at 1 % on the same resources: policies
// no request of the benchmarks matches, and one kind (things<n-1>) that
// every rule of a CircuitBreaker and a fault match.
func Sample(n int) *ctrlmeshv1alpha1.RoutePolicies {
	if n == 0 {
		return nil
	}
	p := &ctrlmeshv1alpha1.RoutePolicies{}
	fi := ctrlmeshv1alpha1.RouteFaultInjection{Name: "faults", Generation: 1,
		Spec: ctrlmeshv1alpha1.FaultInjectionSpec{ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: "bench"}}}
	for i := range n {
		match := ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{"example.com"}, Resources: []string{fmt.Sprintf("things%d", i)}}}}
		p.CircuitBreakers = append(p.CircuitBreakers, ctrlmeshv1alpha1.RouteCircuitBreaker{Name: fmt.Sprintf("cb-%d", i), Generation: 1, Spec: ctrlmeshv1alpha1.CircuitBreakerSpec{
			ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: "bench"},
			RateLimits:     []ctrlmeshv1alpha1.RateLimit{{Name: "limit", Match: match, QPS: 100, Burst: 100}},
			Breakers:       []ctrlmeshv1alpha1.Breaker{{Name: "breaker", Match: match, FailureRatioPercent: ptr.To[int32](50)}},
			Deny:           []ctrlmeshv1alpha1.DenyRule{{Name: "deletes", Match: match, Reason: "bench", Limit: &ctrlmeshv1alpha1.CountLimit{Count: 100, PeriodSeconds: 60}}},
		}})
		fi.Spec.Faults = append(fi.Spec.Faults, ctrlmeshv1alpha1.Fault{Name: fmt.Sprintf("f%d", i), Match: match, Percent: 1, Delay: &ctrlmeshv1alpha1.FaultDelay{Milliseconds: 1}})
	}
	p.FaultInjections = []ctrlmeshv1alpha1.RouteFaultInjection{fi}
	return p
}
