package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestExplainCommand asks who serves a namespace and an object of a hub (a
// real API server) whose ShardingConfig has a placement in its status.
func TestExplainCommand(t *testing.T) {
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
	for _, ns := range []string{"ops", "team-a"} {
		if err := hub.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	// team-a's bucket of 32, by pkg/sharding: member1's shard 1 serves the
	// buckets from it on (and is handing them over), shard 0 those below.
	bucket := sharding.MustSpace(32).Bucket("team-a")
	low, high := "0-"+fmt.Sprint(bucket-1), fmt.Sprintf("%d-31", bucket)
	if bucket == 0 {
		low, high = "", "0-31"
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
		ObservedGeneration: 1, Clusters: 2, Shards: 3, ReadyShards: 2,
		Conditions: []metav1.Condition{{
			Type: ctrlmeshv1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonHandoverPending,
			Message: "buckets move in member1 once these proxies enforce generation 3: member1/demo-op-0", LastTransitionTime: metav1.Now(),
		}},
		Placement: []ctrlmeshv1alpha1.ShardPlacement{
			{Shard: "0", Cluster: "member1", Pods: []string{"demo-op-0"}, Leader: "demo-op-0", Buckets: low,
				State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
			{Shard: "1", Cluster: "member1", Pods: []string{"demo-op-1", "demo-op-2"}, Leader: "demo-op-2", Buckets: high,
				State: ctrlmeshv1alpha1.ShardPending, Health: ctrlmeshv1alpha1.ShardHealthy},
			{Shard: "0", Cluster: "member2", Pods: []string{"demo-op-7"}, Leader: "demo-op-7", Buckets: "0-31",
				State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy},
		},
	}
	if err := hub.Client.Status().Update(ctx, sc); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	for i, e := range []corev1.Event{{
		ObjectMeta:     metav1.ObjectMeta{Namespace: "ops", Name: "demo-op.1"},
		InvolvedObject: corev1.ObjectReference{Kind: "ShardingConfig", Namespace: "ops", Name: "demo-op"},
		Type:           corev1.EventTypeNormal, Reason: "BucketsMoved", Message: "buckets moved to shard 1", LastTimestamp: now,
	}, {
		// The member's event about the object (the test's hub serves as
		// the member too).
		ObjectMeta:     metav1.ObjectMeta{Namespace: "team-a", Name: "settings.1"},
		InvolvedObject: corev1.ObjectReference{Kind: "ConfigMap", Namespace: "team-a", Name: "settings"},
		Type:           corev1.EventTypeWarning, Reason: "Refused", Message: "write fenced", LastTimestamp: now,
	}} {
		if err := hub.Client.Create(ctx, &e); err != nil {
			t.Fatalf("event %d: %v", i, err)
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
	out, err := run("explain", "team-a", "--kubeconfig", hub.KubeconfigPath)
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	t.Logf("explain team-a:\n%s", out)
	for _, want := range []string{
		fmt.Sprintf("ShardingConfig ops/demo-op (PerCluster, 32 buckets): bucket %d\n", bucket),
		"Degraded=True (HandoverPending) buckets move in member1",
		"member1  1      demo-op-1,demo-op-2  demo-op-2  Pending  Healthy  yes: shard waits for its buckets",
		"member2  0      demo-op-7            demo-op-7  Serving  Healthy  elsewhere in the config",
		"BucketsMoved  buckets moved to shard 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain team-a: no %q in\n%s", want, out)
		}
	}

	out, err = run("explain", "configmaps/settings", "-n", "team-a", "--kubeconfig", hub.KubeconfigPath, "--member-kubeconfig", hub.KubeconfigPath)
	if err != nil {
		t.Fatalf("explain object: %v\n%s", err, out)
	}
	for _, want := range []string{"configmaps/settings in namespace team-a", "member1  1 ", "last events of configmaps/settings in the member:", "Refused  write fenced"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain configmaps/settings: no %q in\n%s", want, out)
		}
	}
	// A resource the limits do not name is not sharded.
	out, err = run("explain", "secrets/token", "-n", "team-a", "--kubeconfig", hub.KubeconfigPath)
	if err != nil || !strings.Contains(out, "no ShardingConfig's limits name secrets") {
		t.Errorf("explain secrets/token: %v\n%s", err, out)
	}
	// System namespaces are never sharded.
	out, err = run("explain", "kube-system", "--kubeconfig", hub.KubeconfigPath)
	if err != nil || !strings.Contains(out, "kube-system is a system namespace") {
		t.Errorf("explain kube-system: %v\n%s", err, out)
	}
	// Bad arguments say what to type.
	for args, want := range map[string]string{
		"configmaps/settings": "needs the object's namespace: -n <namespace>",
		"Team_A":              "is not a namespace name",
	} {
		if out, err := run("explain", args, "--kubeconfig", hub.KubeconfigPath); err == nil || !strings.Contains(out, want) {
			t.Errorf("explain %s: %v, want an error saying %q\n%s", args, err, want, out)
		}
	}
}

// TestKubectlPluginName: run as kubectl-ctrlmesh (kubectl's plugin naming,
// the link make build makes), help speaks of "kubectl ctrlmesh".
func TestKubectlPluginName(t *testing.T) {
	argv0 := os.Args[0]
	defer func() { os.Args[0] = argv0 }()
	for name, want := range map[string]string{"/usr/local/bin/kubectl-ctrlmesh": "kubectl ctrlmesh explain", "ctrlmeshctl": "ctrlmeshctl explain"} {
		os.Args[0] = name
		cmd := newRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"explain", "--help"})
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "Usage:\n  "+want) {
			t.Errorf("run as %s, the usage does not read %q:\n%s", name, want, out.String())
		}
	}
}
