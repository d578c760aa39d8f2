package policystatus_test

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/policystatus"
	"github.com/ctrlmesh/ctrlmesh/hub/propagation"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

var hub *env.Cluster

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}}}, func(ctx context.Context, f *env.Fleet) (func(), error) {
		hub = f.Cluster("hub")
		return func() {}, nil
	}))
}

// TestReconcileWritesStatus: on a real API server, a CircuitBreaker whose
// ShardingConfig is missing says so; with the ShardingConfig and a Work
// whose proxies all enforce it, Enforced is True and the member's open
// breaker shows in the status.
func TestReconcileWritesStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := hub.Client
	for _, ns := range []string{"ops", "karmada-es-member1"} {
		env.Create(t, ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	cb := &ctrlmeshv1alpha1.CircuitBreaker{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "cb"}, Spec: ctrlmeshv1alpha1.CircuitBreakerSpec{
		ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: "demo"},
		Breakers: []ctrlmeshv1alpha1.Breaker{{Name: "api", FailureRatioPercent: ptr.To[int32](50),
			Match: ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"pods"}}}}}},
	}}
	env.Create(t, ctx, c, cb)
	store, err := state.New()
	if err != nil {
		t.Fatal(err)
	}
	r := &policystatus.Reconciler[*ctrlmeshv1alpha1.CircuitBreaker]{Client: c, Store: store, Works: &propagation.Writer{Client: c}, Kind: "CircuitBreaker",
		New: func() *ctrlmeshv1alpha1.CircuitBreaker { return &ctrlmeshv1alpha1.CircuitBreaker{} }}
	reconcileAndGet := func() *metav1.Condition {
		t.Helper()
		if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(cb)}); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(cb), cb); err != nil {
			t.Fatal(err)
		}
		return meta.FindStatusCondition(cb.Status.Conditions, ctrlmeshv1alpha1.ConditionEnforced)
	}
	if cond := reconcileAndGet(); cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != ctrlmeshv1alpha1.ReasonShardingConfigNotFound {
		t.Fatalf("without its ShardingConfig: %+v", cond)
	}
	sc := &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "demo"}, Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
		Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
		Limits:   ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}}}},
		Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"member1"}},
	}}
	env.Create(t, ctx, c, sc)
	w := work(t, "member1", ctrlmeshv1alpha1.PodRouteStatus{Name: "op-a", Ready: true, Shard: "0", AppliedRulesHash: "h2",
		Breakers: []ctrlmeshv1alpha1.PodBreakerStatus{{Policy: "cb", Name: "api", State: ctrlmeshv1alpha1.BreakerOpen, LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second))}}})
	// The Work carries generation 2 of the CircuitBreaker (work): update it
	// once; labeled as the hub labels the Works of ShardingConfig demo.
	cb.Spec.Breakers[0].OpenSeconds = 45
	if err := c.Update(ctx, cb); err != nil {
		t.Fatal(err)
	}
	w.Labels[ctrlmeshv1alpha1.WorkConfigNamespaceLabel], w.Labels[ctrlmeshv1alpha1.WorkConfigNameLabel] = "ops", "demo"
	status := w.Status
	env.Create(t, ctx, c, &w)
	w.Status = status
	if err := c.Status().Update(ctx, &w); err != nil {
		t.Fatal(err)
	}
	// The hub's model does not hold the route the Work carries (as before
	// the hub published it, or read it back): nobody enforces the policy.
	if cond := reconcileAndGet(); cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != ctrlmeshv1alpha1.ReasonPolicyPending {
		t.Fatalf("without the published route in the model: %+v", cond)
	}
	if err := store.RecordPublish(client.ObjectKeyFromObject(sc), "member1", published("member1"), time.Now()); err != nil {
		t.Fatal(err)
	}
	cond := reconcileAndGet()
	if cb.Generation != 2 {
		t.Fatalf("generation %d; the test's Work carries generation 2", cb.Generation)
	}
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != ctrlmeshv1alpha1.ReasonPolicyEnforced {
		t.Fatalf("with every proxy enforcing it: %+v", cond)
	}
	if got := cb.Status.Clusters; len(got) != 1 || got[0].Proxies != 1 || got[0].Enforcing != 1 || len(got[0].Breakers) != 1 ||
		got[0].Breakers[0].State != ctrlmeshv1alpha1.BreakerOpen {
		t.Fatalf("clusters: %+v", got)
	}
}
