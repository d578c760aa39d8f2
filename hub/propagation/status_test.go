package propagation

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ctrlmesh/ctrlmesh/agent/workapply"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// startAgent runs member1's agent in standalone mode for cluster, as the
// hub's admin sets it up (membership.AgentHubRBAC) and with the applier's member
// RBAC, until the test ends.
func startAgent(t *testing.T, ctx context.Context, cluster string) {
	t.Helper()
	createNamespace(t, ctx, hub.Client, membership.AgentNamespace)
	createNamespace(t, ctx, hub.Client, ctrlmeshv1alpha1.ClusterNamespace(cluster))
	env.Create(t, ctx, hub.Client, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: membership.AgentNamespace, Name: membership.AgentServiceAccount(cluster)}})
	for _, obj := range membership.AgentHubRBAC(cluster) {
		env.Create(t, ctx, hub.Client, obj)
	}
	hubConfig, err := hub.AddUser(membership.AgentUserName(cluster), "system:serviceaccounts", "system:serviceaccounts:"+membership.AgentNamespace)
	if err != nil {
		t.Fatal(err)
	}
	memberUser := "ctrlmesh-agent-" + cluster
	env.Create(t, ctx, member.Client, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: memberUser}, Rules: workapply.MemberRBACRules()})
	env.Create(t, ctx, member.Client, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: memberUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: memberUser},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: memberUser}},
	})
	memberConfig, err := member.AddUser(memberUser)
	if err != nil {
		t.Fatal(err)
	}

	mgr, err := ctrl.NewManager(memberConfig, ctrl.Options{
		Scheme:     fleet.Scheme,
		Logger:     logr.Discard(),
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	applier := &workapply.Applier{HubConfig: hubConfig, ClusterName: cluster, Recorder: mgr.GetEventRecorderFor(ctrlmeshv1alpha1.AgentComponent), Log: logr.Discard()}
	if err := applier.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mgrCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("member manager: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the member manager did not stop within 30 s")
		}
	})
}

// TestReadStatusOfAppliedWork writes a Work, lets the standalone agent apply
// it to member1, writes the member ShardRoute's status as the agent's route
// status controller would, and reads it back from the Work with
// routework.ReadStatus.
func TestReadStatusOfAppliedWork(t *testing.T) {
	ctx := context.Background()
	cluster := newCluster(t, ctx, "status")
	startAgent(t, ctx, cluster)
	config := testConfig(unique("team-status"), ctrlmeshv1alpha1.ScopePerCluster)
	createNamespace(t, ctx, member.Client, config.Namespace)
	writer := &Writer{Client: writerClient(t)}
	route := singleShardRoute(t, config, cluster, 1)
	if err := writer.Sync(ctx, config, cluster, route); err != nil {
		t.Fatal(err)
	}

	report := func() (routework.Report, error) {
		return routework.ReadStatus(getWork(t, ctx, config, cluster))
	}
	env.Eventually(t, 30*time.Second, "the Work is applied", func() error {
		r, err := report()
		if err != nil {
			return err
		}
		if !r.Current || r.Health != workv1alpha1.ResourceUnknown || r.Cluster != cluster {
			return fmt.Errorf("report %+v, want current, health Unknown, cluster %s", r, cluster)
		}
		return nil
	})

	var applied ctrlmeshv1alpha1.ShardRoute
	if err := member.Client.Get(ctx, client.ObjectKeyFromObject(route), &applied); err != nil {
		t.Fatal(err)
	}
	since := metav1.NewTime(time.Now().Truncate(time.Second))
	applied.Status = ctrlmeshv1alpha1.ShardRouteStatus{
		ObservedGeneration:        applied.Generation,
		ObservedRoutingGeneration: 1,
		Pods: []ctrlmeshv1alpha1.PodRouteStatus{
			{Name: "op-0", Address: "10.0.0.1", Ready: true, Shard: "0", AppliedRulesHash: route.Spec.RulesHash},
			{Name: "op-c", Address: "10.0.0.2", Ready: true, Canary: true},
		},
		Leaders: []ctrlmeshv1alpha1.ShardLeader{{Shard: "0", Pod: "op-0"}},
		Conditions: []metav1.Condition{
			{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonRulesValid, Message: "valid", ObservedGeneration: applied.Generation, LastTransitionTime: since},
			{Type: ctrlmeshv1alpha1.ConditionProxiesReady, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonProxiesApplied, Message: "all", ObservedGeneration: applied.Generation, LastTransitionTime: since},
		},
	}
	if err := member.Client.Status().Update(ctx, &applied); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the Work reports the member's status", func() error {
		r, err := report()
		if err != nil {
			return err
		}
		if r.Health != workv1alpha1.ResourceHealthy || !equality.Semantic.DeepEqual(r.Route, applied.Status) {
			return fmt.Errorf("health %s and route status %+v, want Healthy and %+v", r.Health, r.Route, applied.Status)
		}
		return nil
	})

	// New rules: the report is current again once the member applied the
	// Work's new generation; its health is Unknown until the agent's status
	// describes the new spec.
	if err := writer.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 2)); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the new rules are applied and reported", func() error {
		r, err := report()
		if err != nil {
			return err
		}
		if !r.Current || r.Health != workv1alpha1.ResourceUnknown {
			return fmt.Errorf("report %+v, want current, with health Unknown until the agent describes the new spec", r)
		}
		return nil
	})
}
