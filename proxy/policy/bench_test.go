package policy

import (
	"fmt"
	"testing"

	"k8s.io/utils/ptr"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// TwentyPolicies is 20 CircuitBreakers (each a rate limit, a breaker and a
// count-limited deny rule on a resource of its own) and one FaultInjection
// of 20 faults at 1 %: what make bench-proxy loads into the proxy.
func TwentyPolicies() *ctrlmeshv1alpha1.RoutePolicies {
	p := &ctrlmeshv1alpha1.RoutePolicies{}
	fi := ctrlmeshv1alpha1.RouteFaultInjection{Name: "faults", Generation: 1}
	for i := range 20 {
		match := ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{"example.com"}, Resources: []string{fmt.Sprintf("things%d", i)}}}}
		p.CircuitBreakers = append(p.CircuitBreakers, ctrlmeshv1alpha1.RouteCircuitBreaker{Name: fmt.Sprintf("cb-%d", i), Generation: 1, Spec: ctrlmeshv1alpha1.CircuitBreakerSpec{
			RateLimits: []ctrlmeshv1alpha1.RateLimit{{Name: "limit", Match: match, QPS: 100, Burst: 100}},
			Breakers:   []ctrlmeshv1alpha1.Breaker{{Name: "breaker", Match: match, FailureRatioPercent: ptr.To[int32](50)}},
			Deny:       []ctrlmeshv1alpha1.DenyRule{{Name: "deletes", Match: match, Reason: "bench", Limit: &ctrlmeshv1alpha1.CountLimit{Count: 100, PeriodSeconds: 60}}},
		}})
		fi.Spec.Faults = append(fi.Spec.Faults, ctrlmeshv1alpha1.Fault{Name: fmt.Sprintf("f%d", i), Match: match, Percent: 1, Delay: &ctrlmeshv1alpha1.FaultDelay{Milliseconds: 1}})
	}
	p.FaultInjections = []ctrlmeshv1alpha1.RouteFaultInjection{fi}
	return p
}

// BenchmarkCheck is the policy check's cost per request with 20 policies
// loaded: a request no rule matches (the proxy's common case), and one that
// a rate limit, a breaker, a deny count and a fault all match.
func BenchmarkCheck(b *testing.B) {
	set, err := Compile(TwentyPolicies(), Target{Shard: "0"})
	if err != nil {
		b.Fatal(err)
	}
	for name, req := range map[string]*Request{
		"unmatched": {Resource: "configmaps", Verb: "get", Namespace: "a", Name: "x"},
		"matched":   {Group: "example.com", Resource: "things19", Verb: "get", Namespace: "a", Name: "x"},
	} {
		b.Run(name, func(b *testing.B) {
			e := NewEngine(set, nil)
			defer e.Stop()
			b.ReportAllocs()
			for b.Loop() {
				d := e.Check(req)
				e.Done(&d, 200, 0, false)
			}
		})
	}
}
