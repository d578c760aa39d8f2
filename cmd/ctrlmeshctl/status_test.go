package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestStatusCommand prints the placement and the subsets the hub reported,
// and the traffic policies bound to the ShardingConfig with their status
// (not those naming another ShardingConfig), read from a real API server.
func TestStatusCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	hub := fleet.Cluster("hub")
	if err := hub.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ops"}}); err != nil {
		t.Fatal(err)
	}
	sc := &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "demo-op"},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "demo-op"}},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{
				APIGroups: []string{""}, Resources: []string{"configmaps"},
			}}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"member1", "member2"}},
			Subsets: []ctrlmeshv1alpha1.Subset{{Name: "v2", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"version": "v2"}},
				Namespaces: []string{"team-a"}}},
		},
	}
	if err := hub.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	sc.Status = ctrlmeshv1alpha1.ShardingConfigStatus{
		ObservedGeneration: 1, Clusters: 2, Shards: 2, ReadyShards: 1,
		Conditions: []metav1.Condition{{
			Type: ctrlmeshv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonHandoverPending,
			Message: "buckets 24-31 wait for shard 0 to let them go", LastTransitionTime: metav1.Now(),
		}},
		Placement: []ctrlmeshv1alpha1.ShardPlacement{
			{Shard: "0", Cluster: "member1", Pods: []string{"demo-op-0", "demo-op-1"}, Leader: "demo-op-0", Buckets: "0-23",
				State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
			{Shard: "1", Cluster: "member2", Pods: []string{"demo-op-2"},
				State: ctrlmeshv1alpha1.ShardPending, Health: ctrlmeshv1alpha1.ShardHealthUnknown},
			{Shard: "v2", Cluster: "member1", Subset: "v2", Pods: []string{"demo-op-v2"}, Leader: "demo-op-v2", Namespaces: []string{"team-a"},
				State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
		},
	}
	if err := hub.Client.Status().Update(ctx, sc); err != nil {
		t.Fatal(err)
	}
	openSince := metav1.NewTime(time.Date(2026, 11, 27, 5, 30, 12, 0, time.UTC))
	writes := ctrlmeshv1alpha1.TrafficMatch{Resources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}},
		Verbs: []ctrlmeshv1alpha1.Verb{"patch"}}
	guard := &ctrlmeshv1alpha1.CircuitBreaker{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "guard"},
		Spec: ctrlmeshv1alpha1.CircuitBreakerSpec{ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: "demo-op"},
			Breakers: []ctrlmeshv1alpha1.Breaker{{Name: "writes", Match: writes, FailureRatioPercent: ptr.To[int32](50)}}},
	}
	chaos := &ctrlmeshv1alpha1.FaultInjection{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "chaos"},
		Spec: ctrlmeshv1alpha1.FaultInjectionSpec{ShardingConfig: ctrlmeshv1alpha1.ShardingConfigReference{Name: "demo-op"},
			Faults: []ctrlmeshv1alpha1.Fault{{Name: "errors", Match: writes, Percent: 100, Abort: &ctrlmeshv1alpha1.FaultAbort{StatusCode: 503}}}},
	}
	// A policy of another ShardingConfig in the namespace.
	other := guard.DeepCopy()
	other.Name, other.Spec.ShardingConfig.Name = "other-guard", "other-op"
	for _, obj := range []client.Object{guard, chaos, other} {
		if err := hub.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	guard.Status = ctrlmeshv1alpha1.PolicyStatus{ObservedGeneration: 1,
		Conditions: []metav1.Condition{{Type: ctrlmeshv1alpha1.ConditionEnforced, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonPolicyPending,
			Message: "not every proxy enforces generation 1 yet in: member2 (0 of 1 proxies)", LastTransitionTime: metav1.Now()}},
		Clusters: []ctrlmeshv1alpha1.PolicyClusterStatus{
			{Cluster: "member1", Proxies: 3, Enforcing: 3, Breakers: []ctrlmeshv1alpha1.ClusterBreakerStatus{
				{Name: "writes", State: ctrlmeshv1alpha1.BreakerOpen, Pods: []string{"demo-op-0", "demo-op-v2"}, LastTransitionTime: openSince}}},
			{Cluster: "member2", Proxies: 1, Enforcing: 0},
		}}
	chaos.Status = ctrlmeshv1alpha1.PolicyStatus{ObservedGeneration: 1,
		Conditions: []metav1.Condition{{Type: ctrlmeshv1alpha1.ConditionEnforced, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonPolicyEnforced,
			Message: "every proxy in 2 member clusters enforces generation 1", LastTransitionTime: metav1.Now()}},
		Clusters: []ctrlmeshv1alpha1.PolicyClusterStatus{{Cluster: "member1", Proxies: 3, Enforcing: 3}, {Cluster: "member2", Proxies: 1, Enforcing: 1}}}
	for _, obj := range []client.Object{guard, chaos} {
		if err := hub.Client.Status().Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}

	run := func(args ...string) (string, error) {
		cmd := newRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}
	out, err := run("status", "demo-op", "-n", "ops", "--kubeconfig", hub.KubeconfigPath)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	want := `ShardingConfig ops/demo-op: generation 1, observed 1; 2 clusters, 2 shards, 1 ready
Ready=False (HandoverPending) buckets 24-31 wait for shard 0 to let them go
SHARD  CLUSTER  PODS                 LEADER      BUCKETS  NAMESPACES  CANARY  STATE    HEALTH
0      member1  demo-op-0,demo-op-1  demo-op-0   0-23     -           -       Serving  Healthy
1      member2  demo-op-2            -           -        -           -       Pending  Unknown
v2     member1  demo-op-v2           demo-op-v2  -        team-a      -       Serving  Healthy
SUBSET  SELECTOR    RULES              CLUSTER  PODS        BUCKETS  NAMESPACES  STATE
v2      version=v2  namespaces team-a  member1  demo-op-v2  -        team-a      Serving
CircuitBreaker ops/guard: generation 1, observed 1
Enforced=False (PolicyPending) not every proxy enforces generation 1 yet in: member2 (0 of 1 proxies)
CLUSTER  ENFORCING  BREAKER  STATE   PODS                  SINCE
member1  3/3        writes   Open    demo-op-0,demo-op-v2  2026-11-27T05:30:12Z
member2  0/1        all      Closed  -                     -
FaultInjection ops/chaos: generation 1, observed 1
Enforced=True (PolicyEnforced) every proxy in 2 member clusters enforces generation 1
CLUSTER  ENFORCING
member1  3/3
member2  1/1
`
	if out != want {
		t.Errorf("status printed\n%s\nwant\n%s", out, want)
	}
	if _, err := run("status", "missing", "-n", "ops", "--kubeconfig", hub.KubeconfigPath); err == nil || !strings.Contains(err.Error(), "reading ShardingConfig ops/missing") {
		t.Errorf("status of a missing ShardingConfig: %v", err)
	}
}
