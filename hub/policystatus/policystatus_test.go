package policystatus_test

import (
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/policystatus"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

// published is the route the hub published to cluster: it carries the
// CircuitBreaker "cb" at generation 2.
func published(cluster string) *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "demo"}, Spec: ctrlmeshv1alpha1.ShardRouteSpec{
		Cluster: cluster, RoutingGeneration: 1, RulesHash: "h2", Buckets: 1,
		Policies: &ctrlmeshv1alpha1.RoutePolicies{CircuitBreakers: []ctrlmeshv1alpha1.RouteCircuitBreaker{{Name: "cb", Generation: 2}}},
	}}
}

// work is the Work of cluster carrying its published route, with the pods'
// reports as status.
func work(t *testing.T, cluster string, pods ...ctrlmeshv1alpha1.PodRouteStatus) workv1alpha1.Work {
	t.Helper()
	route := published(cluster)
	w := routework.NewWork(routework.WorkKey(cluster, "ops", "demo"))
	if err := routework.SetManifests(w, route, nil); err != nil {
		t.Fatal(err)
	}
	route.Status.Pods = pods
	w.Status.ManifestStatuses = []workv1alpha1.ManifestStatus{routework.ManifestStatus(route)}
	return *w
}

func TestClusters(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	open := func(at metav1.Time) []ctrlmeshv1alpha1.PodBreakerStatus {
		return []ctrlmeshv1alpha1.PodBreakerStatus{{Policy: "cb", Name: "api", State: ctrlmeshv1alpha1.BreakerOpen, LastTransitionTime: at},
			{Policy: "other", Name: "api", State: ctrlmeshv1alpha1.BreakerOpen, LastTransitionTime: at}}
	}
	works := []workv1alpha1.Work{
		work(t, "member2",
			ctrlmeshv1alpha1.PodRouteStatus{Name: "op-c", Ready: true, Shard: "0", AppliedRulesHash: "h1"}),
		work(t, "member1",
			ctrlmeshv1alpha1.PodRouteStatus{Name: "op-a", Ready: true, Shard: "0", AppliedRulesHash: "h2", Breakers: open(t0)},
			ctrlmeshv1alpha1.PodRouteStatus{Name: "op-b", Ready: true, Shard: "1", AppliedRulesHash: "h2", Breakers: open(t1)},
			ctrlmeshv1alpha1.PodRouteStatus{Name: "op-d", Ready: true, Shard: "1", AppliedRulesHash: "h2", Breakers: []ctrlmeshv1alpha1.PodBreakerStatus{
				{Policy: "cb", Name: "api", State: ctrlmeshv1alpha1.BreakerHalfOpen, LastTransitionTime: t1}}}),
	}
	routes := map[string]*ctrlmeshv1alpha1.ShardRoute{"member1": published("member1"), "member2": published("member2")}
	got := policystatus.Clusters("CircuitBreaker", "cb", 2, works, routes)
	if len(got) != 2 || got[0].Cluster != "member1" || got[1].Cluster != "member2" {
		t.Fatalf("clusters: %+v", got)
	}
	m1, m2 := got[0], got[1]
	if m1.Proxies != 3 || m1.Enforcing != 3 || m2.Proxies != 1 || m2.Enforcing != 0 {
		t.Errorf("proxies/enforcing: member1 %d/%d, member2 %d/%d; want 3/3, 1/0", m1.Proxies, m1.Enforcing, m2.Proxies, m2.Enforcing)
	}
	if len(m1.Breakers) != 1 {
		t.Fatalf("member1 breakers: %+v", m1.Breakers)
	}
	b := m1.Breakers[0]
	if b.Name != "api" || b.State != ctrlmeshv1alpha1.BreakerOpen || len(b.Pods) != 2 || b.Pods[0] != "op-a" || b.Pods[1] != "op-b" || !b.LastTransitionTime.Equal(&t1) {
		t.Errorf("member1's breaker api: %+v; want Open in op-a and op-b since %v", b, t1)
	}
	// Another generation of the policy is enforced by nobody.
	if got := policystatus.Clusters("CircuitBreaker", "cb", 3, works, routes); got[0].Enforcing != 0 {
		t.Errorf("generation 3 enforced by %d proxies", got[0].Enforcing)
	}
	// Nor is it by a member the hub holds no published route of.
	if got := policystatus.Clusters("CircuitBreaker", "cb", 2, works, map[string]*ctrlmeshv1alpha1.ShardRoute{"member2": published("member2")}); got[0].Proxies != 3 || got[0].Enforcing != 0 {
		t.Errorf("member1 without a published route: %d of %d proxies enforcing", got[0].Enforcing, got[0].Proxies)
	}
}
