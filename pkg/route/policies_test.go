package route_test

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
)

func TestBoundPolicies(t *testing.T) {
	sc := &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "demo"}}
	cb := func(ns, name, config string) ctrlmeshv1alpha1.CircuitBreaker {
		return ctrlmeshv1alpha1.CircuitBreaker{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 3},
			Spec: ctrlmeshv1alpha1.CircuitBreakerSpec{ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: config}}}
	}
	deleting := cb("ops", "going", "demo")
	deleting.DeletionTimestamp = ptrNow()
	fi := ctrlmeshv1alpha1.FaultInjection{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "chaos", Generation: 1},
		Spec: ctrlmeshv1alpha1.FaultInjectionSpec{ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: "demo"}}}
	p, err := route.BoundPolicies(sc, []ctrlmeshv1alpha1.CircuitBreaker{
		cb("ops", "zeta", "demo"), cb("other", "a", "demo"), cb("ops", "b", "another"), cb("ops", "alpha", "demo"), deleting,
	}, []ctrlmeshv1alpha1.FaultInjection{fi})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range p.CircuitBreakers {
		names = append(names, fmt.Sprintf("%s@%d", c.Name, c.Generation))
	}
	if got := strings.Join(names, ","); got != "alpha@3,zeta@3" || len(p.FaultInjections) != 1 || p.FaultInjections[0].Name != "chaos" {
		t.Fatalf("bound: %s and %d FaultInjections", got, len(p.FaultInjections))
	}
	if none, err := route.BoundPolicies(sc, nil, nil); none != nil || err != nil {
		t.Fatalf("no policies: %v %v", none, err)
	}
	var many []ctrlmeshv1alpha1.CircuitBreaker
	for i := range 65 {
		many = append(many, cb("ops", fmt.Sprintf("cb-%d", i), "demo"))
	}
	if _, err := route.BoundPolicies(sc, many, nil); err == nil || !strings.Contains(err.Error(), "carry at most 64 of each: merge some") {
		t.Fatalf("65 CircuitBreakers: %v", err)
	}
	// Policies are part of the rules: their change changes the hash.
	r := &ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{Cluster: "m", RoutingGeneration: 1}}
	route.SetPolicies(r, nil)
	before := r.Spec.RulesHash
	route.SetPolicies(r, p)
	if r.Spec.RulesHash == before || r.Spec.RulesHash != route.RulesHash(&r.Spec) {
		t.Fatal("the rules hash does not cover the policies")
	}
}

func ptrNow() *metav1.Time { t := metav1.Now(); return &t }
