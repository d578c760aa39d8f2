package v1alpha1_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

var podsMatch = ctrlmeshv1alpha1.TrafficMatch{
	Resources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"pods"}}},
	Verbs:     []ctrlmeshv1alpha1.Verb{"delete"},
}

func validCircuitBreaker(name string) *ctrlmeshv1alpha1.CircuitBreaker {
	return &ctrlmeshv1alpha1.CircuitBreaker{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: ctrlmeshv1alpha1.CircuitBreakerSpec{
			ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: "op"},
			RateLimits: []ctrlmeshv1alpha1.RateLimit{{Name: "configmaps", QPS: 20, Burst: 40, Match: ctrlmeshv1alpha1.TrafficMatch{
				Resources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}},
				Verbs:     []ctrlmeshv1alpha1.Verb{"get", "list"}, Namespaces: []string{"team-a"},
			}}},
			Breakers: []ctrlmeshv1alpha1.Breaker{{Name: "payments", FailureRatioPercent: ptr.To[int32](50),
				Match: ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"payments.example.com", "*.internal.example.com"}, Methods: []string{"POST"}, PathPrefixes: []string{"/v1/"}}}},
			Deny: []ctrlmeshv1alpha1.DenyRule{
				{Name: "no-namespace-deletes", Reason: "operators must not delete namespaces: ask the platform team", Match: ctrlmeshv1alpha1.TrafficMatch{
					Resources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"namespaces"}}}, Verbs: []ctrlmeshv1alpha1.Verb{"delete"}}},
				{Name: "pod-deletes", Reason: "at most 10 pod deletes a minute", Match: podsMatch, Limit: &ctrlmeshv1alpha1.CountLimit{Count: 10, PeriodSeconds: 60}},
			},
		},
	}
}

func validFaultInjection(name string) *ctrlmeshv1alpha1.FaultInjection {
	return &ctrlmeshv1alpha1.FaultInjection{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: ctrlmeshv1alpha1.FaultInjectionSpec{
			ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: "op"},
			Faults: []ctrlmeshv1alpha1.Fault{{Name: "slow-updates", Percent: 20, CanaryOnly: true,
				Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{"apps"}, Resources: []string{"deployments"}}}, Verbs: []ctrlmeshv1alpha1.Verb{"update", "patch"}},
				Delay: &ctrlmeshv1alpha1.FaultDelay{Milliseconds: 300}, Abort: &ctrlmeshv1alpha1.FaultAbort{StatusCode: 503},
				Window: &ctrlmeshv1alpha1.FaultWindow{Start: &metav1.Time{Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}},
			}},
		},
	}
}

func TestCircuitBreakerValidation(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		mutate func(*ctrlmeshv1alpha1.CircuitBreaker)
		want   string
	}{
		{name: "valid", mutate: func(*ctrlmeshv1alpha1.CircuitBreaker) {}},
		{name: "nothing in it", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.RateLimits, cb.Spec.Breakers, cb.Spec.Deny = nil, nil, nil
		}, want: "a CircuitBreaker needs at least one of rateLimits, breakers or deny"},
		{name: "match with neither resources nor hosts", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.RateLimits[0].Match = ctrlmeshv1alpha1.TrafficMatch{Namespaces: []string{"a"}}
		}, want: "a match names either resources (the operator's API requests) or hosts (its external requests through the proxy), exactly one of them"},
		{name: "match with both", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.RateLimits[0].Match.Hosts = []string{"example.com"}
		}, want: "exactly one of them"},
		{name: "verbs on hosts", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.Breakers[0].Match.Verbs = []ctrlmeshv1alpha1.Verb{"get"}
		}, want: "verbs, namespaces and names match API requests only; for external hosts use methods and pathPrefixes"},
		{name: "methods on resources", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.RateLimits[0].Match.Methods = []string{"GET"}
		}, want: "methods and pathPrefixes match external requests only; for API requests use verbs, namespaces and names"},
		{name: "unknown verb", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.RateLimits[0].Match.Verbs = []ctrlmeshv1alpha1.Verb{"remove"}
		}, want: `spec.rateLimits[0].match.verbs[0]: Unsupported value: "remove"`},
		{name: "host with a scheme", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.Breakers[0].Match.Hosts = []string{"https://payments.example.com"}
		}, want: `spec.breakers[0].match.hosts[0]: Invalid value: "https://payments.example.com"`},
		{name: "relative path prefix", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.Breakers[0].Match.PathPrefixes = []string{"v1"}
		}, want: `spec.breakers[0].match.pathPrefixes[0]: Invalid value: "v1"`},
		{name: "zero qps", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.RateLimits[0].QPS = 0
		}, want: "spec.rateLimits[0].qps: Invalid value: 0"},
		{name: "breaker without trigger", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.Breakers[0].FailureRatioPercent = nil
		}, want: "a breaker needs a trigger: failureRatioPercent, slowCalls or rateLimited"},
		{name: "failure ratio over 100", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.Breakers[0].FailureRatioPercent = ptr.To[int32](150)
		}, want: "spec.breakers[0].failureRatioPercent: Invalid value: 150"},
		{name: "deny without reason", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.Deny[0].Reason = ""
		}, want: "spec.deny[0].reason"},
		{name: "duplicate rule names", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.Deny[1].Name = cb.Spec.Deny[0].Name
		}, want: `spec.deny[1]: Duplicate value: {"name":"no-namespace-deletes"}`},
		{name: "no sharding config", mutate: func(cb *ctrlmeshv1alpha1.CircuitBreaker) {
			cb.Spec.ShardingConfig.Name = ""
		}, want: "spec.shardingConfig.name"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cb := validCircuitBreaker(fmt.Sprintf("cb-%d", i))
			tt.mutate(cb)
			checkVerdict(t, cluster.Client.Create(ctx, cb), tt.want)
		})
	}
}

func TestCircuitBreakerDefaults(t *testing.T) {
	ctx := context.Background()
	cb := validCircuitBreaker("defaults")
	if err := cluster.Client.Create(ctx, cb); err != nil {
		t.Fatal(err)
	}
	var got ctrlmeshv1alpha1.CircuitBreaker
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(cb), &got); err != nil {
		t.Fatal(err)
	}
	b := got.Spec.Breakers[0]
	if b.WindowSeconds != 60 || b.MinRequests != 10 || b.OpenSeconds != 30 || b.HalfOpenProbes != 1 {
		t.Errorf("breaker defaults: window %d, minRequests %d, open %d, probes %d; want 60, 10, 30, 1", b.WindowSeconds, b.MinRequests, b.OpenSeconds, b.HalfOpenProbes)
	}
}

func TestFaultInjectionValidation(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		mutate func(*ctrlmeshv1alpha1.FaultInjection)
		want   string
	}{
		{name: "valid", mutate: func(*ctrlmeshv1alpha1.FaultInjection) {}},
		{name: "external host", mutate: func(fi *ctrlmeshv1alpha1.FaultInjection) {
			fi.Spec.Faults[0].Match = ctrlmeshv1alpha1.TrafficMatch{Hosts: []string{"*"}}
			fi.Spec.Faults[0].CanaryOnly = false
			fi.Spec.Faults[0].Shards = []string{"0", "canary"}
		}},
		{name: "no faults", mutate: func(fi *ctrlmeshv1alpha1.FaultInjection) {
			fi.Spec.Faults = nil
		}, want: "spec.faults"},
		{name: "neither delay nor abort", mutate: func(fi *ctrlmeshv1alpha1.FaultInjection) {
			fi.Spec.Faults[0].Delay, fi.Spec.Faults[0].Abort = nil, nil
		}, want: "a fault needs a delay, an abort or both"},
		{name: "abort not an error", mutate: func(fi *ctrlmeshv1alpha1.FaultInjection) {
			fi.Spec.Faults[0].Abort.StatusCode = 200
		}, want: "spec.faults[0].abort.statusCode: Invalid value: 200"},
		{name: "percent zero", mutate: func(fi *ctrlmeshv1alpha1.FaultInjection) {
			fi.Spec.Faults[0].Percent = 0
		}, want: "spec.faults[0].percent: Invalid value: 0"},
		{name: "window ends before it starts", mutate: func(fi *ctrlmeshv1alpha1.FaultInjection) {
			fi.Spec.Faults[0].Window.End = &metav1.Time{Time: fi.Spec.Faults[0].Window.Start.Add(-time.Hour)}
		}, want: "window.end must be after window.start"},
		{name: "empty window", mutate: func(fi *ctrlmeshv1alpha1.FaultInjection) {
			fi.Spec.Faults[0].Window = &ctrlmeshv1alpha1.FaultWindow{}
		}, want: "a window needs a start, an end or both"},
		{name: "shards and canaryOnly", mutate: func(fi *ctrlmeshv1alpha1.FaultInjection) {
			fi.Spec.Faults[0].Shards = []string{"0"}
		}, want: "set shards or canaryOnly, not both"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fi := validFaultInjection(fmt.Sprintf("fi-%d", i))
			tt.mutate(fi)
			checkVerdict(t, cluster.Client.Create(ctx, fi), tt.want)
		})
	}
}

// TestShardRouteCarriesPolicies: the ShardRoute CRD keeps the policies the
// hub carries whole (its policies field is schemaless: nothing is pruned)
// and the breakers a proxy reports. It does not validate them again: the
// hub's API server did, on the CircuitBreaker and FaultInjection, and every
// proxy compiles them, refusing the route if one does not compile
// (TestCompileRefuses in proxy/policy).
func TestShardRouteCarriesPolicies(t *testing.T) {
	ctx := context.Background()
	r := validShardRoute("policies")
	r.Spec.Policies = &ctrlmeshv1alpha1.RoutePolicies{
		CircuitBreakers: []ctrlmeshv1alpha1.RouteCircuitBreaker{{Name: "cb", Generation: 2, Spec: validCircuitBreaker("cb").Spec}},
		FaultInjections: []ctrlmeshv1alpha1.RouteFaultInjection{{Name: "fi", Generation: 1, Spec: validFaultInjection("fi").Spec}},
	}
	want := r.Spec.Policies.DeepCopy()
	if err := cluster.Client.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	r.Status.Pods = []ctrlmeshv1alpha1.PodRouteStatus{{Name: "op-0", AppliedRulesHash: "9f2c", Breakers: []ctrlmeshv1alpha1.PodBreakerStatus{
		{Policy: "cb", Name: "payments", State: ctrlmeshv1alpha1.BreakerOpen, LastTransitionTime: metav1.Now()},
	}}}
	if err := cluster.Client.Status().Update(ctx, r); err != nil {
		t.Fatal(err)
	}
	var got ctrlmeshv1alpha1.ShardRoute
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(r), &got); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got.Spec.Policies, want) {
		t.Errorf("the ShardRoute's policies came back as\n%+v\nwant\n%+v", got.Spec.Policies, want)
	}
	if len(got.Status.Pods) != 1 || len(got.Status.Pods[0].Breakers) != 1 || got.Status.Pods[0].Breakers[0].State != ctrlmeshv1alpha1.BreakerOpen {
		t.Errorf("the reported breakers came back as %+v", got.Status.Pods)
	}
}
