package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/go-logr/logr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/agent"
	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/test/certs"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/golden"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

var update = flag.Bool("update", false, "rewrite deploy/rbac/agent-member.yaml from agent.MemberRBAC")

// The static file is the rendering of MemberRBAC for the namespace
// "ctrlmesh", so the two never drift apart.
func TestMemberRBACFile(t *testing.T) {
	want, err := agent.RenderMemberRBAC("ctrlmesh")
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("..", "deploy", "rbac", "agent-member.yaml"), want, *update,
		`RenderMemberRBAC("ctrlmesh")`, "go test ./agent -run TestMemberRBACFile -update")
}

const (
	cluster        = "member1"
	agentNamespace = "ctrlmesh"
	opsNamespace   = "ops"
	// proxyImage is what the test agent injects; no kubelet runs it.
	proxyImage = "example.com/ctrlmesh-proxy:test"
)

// testFleet is a hub and a member prepared for one agent: the hub admin's
// namespaces and RBAC for the agent on the hub, the agent's RBAC in the
// member, and configs with exactly those rights.
type testFleet struct {
	hub, member           *env.Cluster
	agentHub, agentMember *rest.Config
	execNS                string
}

func startFleet(t *testing.T, ctx context.Context) *testFleet {
	t.Helper()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}, {Name: cluster}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	})
	f := &testFleet{hub: fleet.Cluster("hub"), member: fleet.Cluster(cluster), execNS: names.GenerateExecutionSpaceName(cluster)}
	env.Create(t, ctx, f.hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: membership.AgentNamespace}})
	env.Create(t, ctx, f.member.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opsNamespace}})
	if f.agentHub, f.agentMember, err = localfleet.PrepareAgent(ctx, f.hub, f.member, cluster, agentNamespace); err != nil {
		t.Fatal(err)
	}
	return f
}

// startAgent runs the agent with only its shipped RBAC, serving its webhooks
// on loopback, until the returned stop is called.
func (f *testFleet) startAgent(t *testing.T, ctx context.Context, applyWorks bool) (stop func()) {
	t.Helper()
	certDir := t.TempDir()
	caPEM, err := certs.WriteServing(certDir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	port := env.FreePort(t)
	agentCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(agentCtx, agent.Options{
			Member: f.agentMember, Hub: f.agentHub, ClusterName: cluster, Identity: "agent-0",
			LeaseDuration: 2 * time.Second, RenewInterval: 200 * time.Millisecond,
			ApplyWorks: applyWorks, Namespace: agentNamespace, LeaderElection: true,
			MetricsAddress: "0", HealthAddress: "0",
			Webhook: agent.WebhookOptions{
				Host: "127.0.0.1", Port: port, CertDir: certDir,
				ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d", port)), CABundle: caPEM},
			},
			Proxy: inject.Options{Image: proxyImage},
			// The manager's goroutines may outlive the test's log.
			Log: logr.Discard(),
		})
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("the agent did not stop within a minute")
		}
	}
	t.Cleanup(stop)
	return stop
}

// TestStandaloneAgent runs the agent in standalone mode against a hub and a
// member with only its shipped RBAC, through the whole path: join and
// heartbeat; no rules before acceptance; the Work's ShardRoute applied after;
// a labeled pod injected with the proxy; the route's status, driven by a
// proxy's report, flowing back into the Work; objects of the sharded resource
// labeled by the webhook; the Work's deletion; the heartbeat stopping with
// the agent.
func TestStandaloneAgent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	f := startFleet(t, ctx)
	stopAgent := f.startAgent(t, ctx, true)

	// Join and heartbeat.
	env.Eventually(t, 30*time.Second, "the heartbeat Lease is renewed", func() error {
		first := f.renewTime(ctx)
		if first.IsZero() {
			return errors.New("no heartbeat Lease yet")
		}
		time.Sleep(500 * time.Millisecond)
		if !f.renewTime(ctx).After(first) {
			return errors.New("the Lease was not renewed")
		}
		return nil
	})
	var mc clusterv1.ManagedCluster
	if err := f.hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
		t.Fatalf("no ManagedCluster after the agent started: %v", err)
	}
	if mc.Spec.HubAcceptsClient {
		t.Fatal("the agent accepted its own cluster")
	}
	if meta.FindStatusCondition(mc.Status.Conditions, clusterv1.ManagedClusterConditionJoined) != nil {
		t.Fatal("the agent marked its cluster joined before the hub accepted it")
	}

	// A Work for an unaccepted cluster is not applied.
	work := &workv1alpha1.Work{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.execNS, Name: "demo-op"},
		Spec: workv1alpha1.WorkSpec{Workload: workv1alpha1.WorkloadTemplate{Manifests: []workv1alpha1.Manifest{{
			RawExtension: runtime.RawExtension{Raw: mustJSON(t, route())},
		}}}},
	}
	env.Create(t, ctx, f.hub.Client, work)
	time.Sleep(3 * time.Second)
	if err := f.member.Client.Get(ctx, client.ObjectKey{Namespace: opsNamespace, Name: "demo-op"}, &ctrlmeshv1alpha1.ShardRoute{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the rules reached the member before the hub accepted it: %v", err)
	}

	// Accepted, the cluster gets its rules.
	mc.Spec.HubAcceptsClient = true
	if err := f.hub.Client.Update(ctx, &mc); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the Work's ShardRoute is applied in the member", func() error {
		var r ctrlmeshv1alpha1.ShardRoute
		return f.member.Client.Get(ctx, client.ObjectKey{Namespace: opsNamespace, Name: "demo-op"}, &r)
	})
	// As OCM's agent, it marks the accepted cluster joined.
	env.Eventually(t, 30*time.Second, "the cluster is marked joined", func() error {
		if err := f.hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(mc.Status.Conditions, clusterv1.ManagedClusterConditionJoined); c == nil ||
			c.Status != metav1.ConditionTrue || c.Reason != ctrlmeshv1alpha1.ReasonClusterJoined {
			return fmt.Errorf("Joined condition %+v", c)
		}
		return nil
	})

	// A pod asking for the proxy gets it.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: opsNamespace, Name: "demo-op-0", Labels: map[string]string{
			"app": "demo-op", ctrlmeshv1alpha1.EnableProxyLabel: "true",
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "operator", Image: "example.com/demo-op"}}},
	}
	env.Eventually(t, 30*time.Second, "a labeled pod is created with the proxy injected", func() error {
		p := pod.DeepCopy()
		if err := f.member.Client.Create(ctx, p); err != nil {
			return err
		}
		if !slices.ContainsFunc(p.Spec.InitContainers, func(c corev1.Container) bool {
			return c.Name == ctrlmeshv1alpha1.ProxyContainerName && c.Image == proxyImage
		}) {
			_ = f.member.Client.Delete(ctx, p, client.GracePeriodSeconds(0))
			return fmt.Errorf("no proxy injected: %s", p.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation])
		}
		pod = p
		return nil
	})
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := f.member.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}

	// The status shows the pod, and flows into the Work: unhealthy until
	// the pod's proxy reports the rules hash, healthy after.
	env.Eventually(t, 30*time.Second, "the Work reports the pod, its proxy pending", func() error {
		return f.workHealth(ctx, workv1alpha1.ResourceUnhealthy, "demo-op-0")
	})
	reportHash(t, ctx, f.member.Client, "demo-op-0", "hash-1")
	env.Eventually(t, 30*time.Second, "the Work reports the route healthy", func() error {
		return f.workHealth(ctx, workv1alpha1.ResourceHealthy, "demo-op-0")
	})

	// The agent restores its webhook configurations: deleted, or with the
	// caBundle changed by hand.
	restored := func(what string, change func(*admissionregistrationv1.MutatingWebhookConfiguration) error) {
		t.Helper()
		var before admissionregistrationv1.MutatingWebhookConfiguration
		if err := f.member.Client.Get(ctx, client.ObjectKey{Name: agent.InjectWebhookConfigurationName}, &before); err != nil {
			t.Fatal(err)
		}
		if err := change(before.DeepCopy()); err != nil {
			t.Fatal(err)
		}
		env.Eventually(t, 30*time.Second, "the injection webhook configuration is restored after "+what, func() error {
			var now admissionregistrationv1.MutatingWebhookConfiguration
			if err := f.member.Client.Get(ctx, client.ObjectKey{Name: agent.InjectWebhookConfigurationName}, &now); err != nil {
				return err
			}
			if !equality.Semantic.DeepEqual(now.Webhooks, before.Webhooks) {
				return errors.New("the webhooks differ from what the agent wrote")
			}
			return nil
		})
	}
	restored("a delete", func(c *admissionregistrationv1.MutatingWebhookConfiguration) error {
		return f.member.Client.Delete(ctx, c)
	})
	restored("a caBundle edit", func(c *admissionregistrationv1.MutatingWebhookConfiguration) error {
		c.Webhooks[0].ClientConfig.CABundle = []byte("not a CA")
		return f.member.Client.Update(ctx, c)
	})

	// Label mode (the member has no KEP-5866): the labeling webhook labels
	// new ConfigMaps.
	env.Create(t, ctx, f.member.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}})
	env.Eventually(t, 30*time.Second, "a new ConfigMap is labeled by the webhook", func() error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", GenerateName: "cm-"}}
		if err := f.member.Client.Create(ctx, cm); err != nil {
			return err
		}
		space, err := sharding.NewSpace(32)
		if err != nil {
			return err
		}
		if got, want := cm.Labels[ctrlmeshv1alpha1.ShardingHashLabel], fmt.Sprint(space.Bucket("team-a")); got != want {
			return fmt.Errorf("created with sharding-hash %q, want %q", got, want)
		}
		return nil
	})

	// Deleting the Work deletes the rules.
	if err := f.hub.Client.Delete(ctx, work); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the ShardRoute is deleted with its Work", func() error {
		err := f.member.Client.Get(ctx, client.ObjectKey{Namespace: opsNamespace, Name: "demo-op"}, &ctrlmeshv1alpha1.ShardRoute{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})

	// Stopped, the agent renews no more.
	stopAgent()
	stopped := f.renewTime(ctx)
	time.Sleep(time.Second) // five renewal intervals
	if after := f.renewTime(ctx); !after.Equal(stopped) {
		t.Fatalf("the Lease was renewed after the agent stopped: %v -> %v", stopped, after)
	}
}

// TestKarmadaModeAgent: with Karmada applying the Works, the agent leaves
// them alone and keeps the status of the ShardRoutes Karmada applied.
func TestKarmadaModeAgent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := startFleet(t, ctx)
	env.Create(t, ctx, f.hub.Client, &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: cluster}, Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: true},
	})
	env.Create(t, ctx, f.hub.Client, &workv1alpha1.Work{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.execNS, Name: "other-op"},
		Spec: workv1alpha1.WorkSpec{Workload: workv1alpha1.WorkloadTemplate{Manifests: []workv1alpha1.Manifest{{
			RawExtension: runtime.RawExtension{Raw: mustJSON(t, func() *ctrlmeshv1alpha1.ShardRoute { r := route(); r.Name = "other-op"; return r }())},
		}}}},
	})
	f.startAgent(t, ctx, false)
	// Karmada's execution controller applied this one.
	env.Create(t, ctx, f.member.Client, route())
	env.Eventually(t, 30*time.Second, "the agent reports the route's status", func() error {
		var r ctrlmeshv1alpha1.ShardRoute
		if err := f.member.Client.Get(ctx, client.ObjectKey{Namespace: opsNamespace, Name: "demo-op"}, &r); err != nil {
			return err
		}
		c := meta.FindStatusCondition(r.Status.Conditions, ctrlmeshv1alpha1.ConditionProxiesReady)
		if r.Status.ObservedRoutingGeneration != 1 || c == nil || c.Reason != ctrlmeshv1alpha1.ReasonNoCandidatePods {
			return fmt.Errorf("status %+v", r.Status)
		}
		return nil
	})
	if err := f.member.Client.Get(ctx, client.ObjectKey{Namespace: opsNamespace, Name: "other-op"}, &ctrlmeshv1alpha1.ShardRoute{}); !apierrors.IsNotFound(err) {
		t.Fatalf("in Karmada mode the agent applied a Work itself: %v", err)
	}
}

// route is the rules object of the tests: the demo operator's pods share
// one shard of all 32 buckets.
func route() *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: ctrlmeshv1alpha1.GroupVersion.String(), Kind: "ShardRoute"},
		ObjectMeta: metav1.ObjectMeta{Namespace: opsNamespace, Name: "demo-op"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: cluster, RoutingGeneration: 1, RulesHash: "hash-1", Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "demo-op"}},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{
				APIGroups: []string{""}, Resources: []string{"configmaps"},
			}}}},
			Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: "0-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "demo-op-0"}}}},
		},
	}
}

// reportHash reports hash for pod as its proxy does: a server-side apply of
// its own entry of the route's status.
func reportHash(t *testing.T, ctx context.Context, c client.Client, pod, hash string) {
	t.Helper()
	patch := map[string]any{
		"apiVersion": ctrlmeshv1alpha1.GroupVersion.String(), "kind": "ShardRoute",
		"metadata": map[string]any{"namespace": opsNamespace, "name": "demo-op"},
		"status":   map[string]any{"pods": []any{map[string]any{"name": pod, "appliedRulesHash": hash}}},
	}
	obj := &ctrlmeshv1alpha1.ShardRoute{ObjectMeta: metav1.ObjectMeta{Namespace: opsNamespace, Name: "demo-op"}}
	err := c.Status().Patch(ctx, obj, client.RawPatch("application/apply-patch+yaml", mustJSON(t, patch)),
		client.FieldOwner(ctrlmeshv1alpha1.ProxyFieldManager(pod)), client.ForceOwnership)
	if err != nil {
		t.Fatal(err)
	}
}

// workHealth checks the Work's manifest status: the health, and the route's
// status reflected with pod in it.
func (f *testFleet) workHealth(ctx context.Context, health workv1alpha1.ResourceHealth, pod string) error {
	var w workv1alpha1.Work
	if err := f.hub.Client.Get(ctx, client.ObjectKey{Namespace: f.execNS, Name: "demo-op"}, &w); err != nil {
		return err
	}
	if !meta.IsStatusConditionTrue(w.Status.Conditions, workv1alpha1.WorkApplied) || len(w.Status.ManifestStatuses) != 1 {
		return fmt.Errorf("work status %+v", w.Status)
	}
	ms := w.Status.ManifestStatuses[0]
	if ms.Health != health || ms.Status == nil {
		return fmt.Errorf("health %q, want %q", ms.Health, health)
	}
	var status ctrlmeshv1alpha1.ShardRouteStatus
	if err := json.Unmarshal(ms.Status.Raw, &status); err != nil {
		return err
	}
	if !slices.ContainsFunc(status.Pods, func(p ctrlmeshv1alpha1.PodRouteStatus) bool { return p.Name == pod && p.Ready }) {
		return fmt.Errorf("the reflected status lacks ready pod %s: %+v", pod, status.Pods)
	}
	return nil
}

func (f *testFleet) renewTime(ctx context.Context) time.Time {
	var lease coordinationv1.Lease
	err := f.hub.Client.Get(ctx, client.ObjectKey{Namespace: ctrlmeshv1alpha1.ClusterNamespace(f.member.Name), Name: ctrlmeshv1alpha1.HeartbeatLeaseName}, &lease)
	if err != nil || lease.Spec.RenewTime == nil {
		return time.Time{}
	}
	return lease.Spec.RenewTime.Time
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
