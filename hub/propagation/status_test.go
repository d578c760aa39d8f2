package propagation

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ctrlmesh/ctrlmesh/agent/workapply"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// startAgent runs member1's agent in standalone mode for cluster, as the
// hub's admin sets it up (membership.AgentHubRBAC) and with the applier's member
// RBAC, until the test ends.
func startAgent(t *testing.T, ctx context.Context, cluster string) {
	t.Helper()
	createNamespace(t, ctx, hub.Client, membership.AgentNamespace)
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
// status controller would, and reads it back from the Work.
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

	report := func() (Report, error) {
		return ReadStatus(getWork(t, ctx, config, cluster))
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

func TestReadStatusRefusesMalformed(t *testing.T) {
	status := func(health workv1alpha1.ResourceHealth, raw string, mutate ...func(*workv1alpha1.ManifestStatus)) []workv1alpha1.ManifestStatus {
		ms := workv1alpha1.ManifestStatus{
			Identifier: workv1alpha1.ResourceIdentifier{Group: "ctrlmesh.io", Version: "v1alpha1", Kind: "ShardRoute", Resource: "shardroutes", Namespace: "team-a", Name: "op"},
			Health:     health,
		}
		if raw != "" {
			ms.Status = &runtime.RawExtension{Raw: []byte(raw)}
		}
		for _, m := range mutate {
			m(&ms)
		}
		return []workv1alpha1.ManifestStatus{ms}
	}
	for _, tc := range []struct {
		name      string
		namespace string
		statuses  []workv1alpha1.ManifestStatus
		want      string
	}{{
		name: "not in an execution namespace", namespace: "default",
		want: "is not in an execution namespace",
	}, {
		name: "two manifests", statuses: append(status(workv1alpha1.ResourceHealthy, ""), status(workv1alpha1.ResourceHealthy, "")...),
		want: "reports 2 manifests",
	}, {
		name: "another kind", statuses: status(workv1alpha1.ResourceHealthy, "", func(ms *workv1alpha1.ManifestStatus) { ms.Identifier.Kind = "ConfigMap"; ms.Identifier.Group = "" }),
		want: `a "ConfigMap" of group ""`,
	}, {
		name: "an unknown health", statuses: status("Fine", ""),
		want: `reports health "Fine"`,
	}, {
		name: "a status that is no JSON", statuses: status(workv1alpha1.ResourceHealthy, "{"),
		want: "is not a ShardRoute status",
	}, {
		name: "a status of the wrong shape", statuses: status(workv1alpha1.ResourceHealthy, `{"pods":"op-0"}`),
		want: "is not a ShardRoute status",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			work := &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: names.GenerateExecutionSpaceName("m1"), Name: "w"}}
			if tc.namespace != "" {
				work.Namespace = tc.namespace
			}
			work.Status.ManifestStatuses = tc.statuses
			if r, err := ReadStatus(work); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadStatus = %+v, %v; want an error containing %q", r, err, tc.want)
			}
		})
	}
}

func TestReadStatusBeforeReports(t *testing.T) {
	work := &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: names.GenerateExecutionSpaceName("m1"), Name: "w", Generation: 2}}
	r, err := ReadStatus(work)
	if err != nil {
		t.Fatal(err)
	}
	if r.Cluster != "m1" || r.Applied != nil || r.Current || r.Health != workv1alpha1.ResourceUnknown || !equality.Semantic.DeepEqual(r.Route, ctrlmeshv1alpha1.ShardRouteStatus{}) {
		t.Errorf("report of an unreported Work: %+v", r)
	}

	// Applied for the previous generation, with a newer agent's unknown field.
	work.Status.Conditions = []metav1.Condition{{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: "AppliedSuccessful", ObservedGeneration: 1}}
	work.Status.ManifestStatuses = []workv1alpha1.ManifestStatus{{
		Identifier: workv1alpha1.ResourceIdentifier{Group: "ctrlmesh.io", Version: "v1alpha1", Kind: "ShardRoute", Namespace: "team-a", Name: "op"},
		Health:     workv1alpha1.ResourceHealthy,
		Status:     &runtime.RawExtension{Raw: []byte(`{"observedRoutingGeneration":1,"leaders":[{"shard":"0","pod":"op-0"}],"future":true}`)},
	}}
	r, err = ReadStatus(work)
	if err != nil {
		t.Fatal(err)
	}
	want := ctrlmeshv1alpha1.ShardRouteStatus{ObservedRoutingGeneration: 1, Leaders: []ctrlmeshv1alpha1.ShardLeader{{Shard: "0", Pod: "op-0"}}}
	if r.Applied == nil || r.Current || r.Health != workv1alpha1.ResourceHealthy || !equality.Semantic.DeepEqual(r.Route, want) {
		t.Errorf("report of a Work applied at an older generation: %+v", r)
	}
}
