package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestStatusCommand prints the placement the hub reported, read from a real
// API server.
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
		},
	}
	if err := hub.Client.Status().Update(ctx, sc); err != nil {
		t.Fatal(err)
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
SHARD  CLUSTER  PODS                 LEADER     BUCKETS  NAMESPACES  CANARY  STATE    HEALTH
0      member1  demo-op-0,demo-op-1  demo-op-0  0-23     -           -       Serving  Healthy
1      member2  demo-op-2            -          -        -           -       Pending  Unknown
`
	if out != want {
		t.Errorf("status printed\n%s\nwant\n%s", out, want)
	}
	if _, err := run("status", "missing", "-n", "ops", "--kubeconfig", hub.KubeconfigPath); err == nil || !strings.Contains(err.Error(), "reading ShardingConfig ops/missing") {
		t.Errorf("status of a missing ShardingConfig: %v", err)
	}
}
