package workapply_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
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

// The fleet every test of the package uses: a hub and one member. Each test
// uses its own cluster name, so its own execution namespace on the hub and
// its own namespace in the member.
var (
	fleet       *env.Fleet
	hub, member *env.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}, {Name: "member1"}}}, func(_ context.Context, f *env.Fleet) (func(), error) {
		fleet = f
		hub, member = f.Cluster("hub"), f.Cluster("member1")
		return nil, nil
	}))
}

// testNames keeps the names the tests use unique (see env.Names).
var testNames env.Names

func unique(base string) string { return testNames.Unique(base) }

// agent is one member's agent as the hub and the member know it.
type agent struct {
	cluster string
	// execNS is the execution namespace on the hub, karmada-es-<cluster>.
	execNS string
	// memberNS is the test's namespace in the member.
	memberNS string
	// hubConfig has only the agent's shipped hub RBAC, membership.AgentHubRBAC.
	hubConfig *rest.Config
	// memberConfig has only workapply.MemberRBACRules.
	memberConfig *rest.Config
}

// newAgent sets up the hub as its admin does for a new member (namespaces,
// ServiceAccount, AgentHubRBAC) and a member identity with the applier's
// member RBAC.
func newAgent(t *testing.T, ctx context.Context, base string) *agent {
	t.Helper()
	a := &agent{cluster: unique(base)}
	a.execNS, a.memberNS = names.GenerateExecutionSpaceName(a.cluster), a.cluster

	for _, ns := range []string{a.execNS, ctrlmeshv1alpha1.ClusterNamespace(a.cluster), membership.AgentNamespace} {
		env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	env.Create(t, ctx, hub.Client, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: membership.AgentNamespace, Name: membership.AgentServiceAccount(a.cluster)}})
	for _, obj := range membership.AgentHubRBAC(a.cluster) {
		env.Create(t, ctx, hub.Client, obj)
	}
	var err error
	if a.hubConfig, err = hub.AddUser(membership.AgentUserName(a.cluster), "system:serviceaccounts", "system:serviceaccounts:"+membership.AgentNamespace); err != nil {
		t.Fatal(err)
	}

	memberUser := "ctrlmesh-agent-" + a.cluster
	env.Create(t, ctx, member.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: a.memberNS}})
	env.Create(t, ctx, member.Client, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: memberUser}, Rules: workapply.MemberRBACRules()})
	env.Create(t, ctx, member.Client, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: memberUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: memberUser},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: memberUser}},
	})
	if a.memberConfig, err = member.AddUser(memberUser); err != nil {
		t.Fatal(err)
	}
	return a
}

// start runs an Applier in a new member manager; stop (also run at cleanup)
// stops it and waits for it.
func (a *agent) start(t *testing.T) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(a.memberConfig, ctrl.Options{
		Scheme:     fleet.Scheme,
		Logger:     logr.Discard(),
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}, // one controller per test
	})
	if err != nil {
		t.Fatal(err)
	}
	applier := &workapply.Applier{
		HubConfig: a.hubConfig, ClusterName: a.cluster,
		Recorder: mgr.GetEventRecorderFor(ctrlmeshv1alpha1.AgentComponent), Log: logr.Discard(),
	}
	if err := applier.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	_, stop = env.StartManager(t, mgr)
	return stop
}

// route is a valid ShardRoute manifest; rulesHash tells versions apart.
func route(ns, name, rulesHash string) *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: ctrlmeshv1alpha1.GroupVersion.String(), Kind: "ShardRoute"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: "member1", RoutingGeneration: 1, RulesHash: rulesHash,
			Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}},
			}}},
			Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: "0-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-0"}}}},
		},
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func newWork(ns, name string, manifests ...[]byte) *workv1alpha1.Work {
	w := &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, m := range manifests {
		w.Spec.Workload.Manifests = append(w.Spec.Workload.Manifests, workv1alpha1.Manifest{RawExtension: runtime.RawExtension{Raw: m}})
	}
	return w
}

func getRoute(ctx context.Context, ns, name string) (*ctrlmeshv1alpha1.ShardRoute, error) {
	var r ctrlmeshv1alpha1.ShardRoute
	if err := member.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func getWork(ctx context.Context, ns, name string) (*workv1alpha1.Work, error) {
	var w workv1alpha1.Work
	if err := hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// updateWork edits the Work as the hub does, retrying when the applier's
// status write came in between.
func updateWork(t *testing.T, ctx context.Context, ns, name string, edit func(*workv1alpha1.Work)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		w, err := getWork(ctx, ns, name)
		if err != nil {
			return err
		}
		edit(w)
		return hub.Client.Update(ctx, w)
	})
	if err != nil {
		t.Fatalf("updating Work %s/%s: %v", ns, name, err)
	}
}

// appliedIs checks the Work's Applied condition.
func appliedIs(w *workv1alpha1.Work, status metav1.ConditionStatus, reason string) error {
	c := meta.FindStatusCondition(w.Status.Conditions, workv1alpha1.WorkApplied)
	if c == nil || c.Status != status || c.Reason != reason || c.ObservedGeneration != w.Generation {
		return fmt.Errorf("Applied condition %+v, want %s %s for generation %d", c, status, reason, w.Generation)
	}
	return nil
}

// notFound checks that the member has no such ShardRoute.
func notFound(ctx context.Context, ns, name string) error {
	r, err := getRoute(ctx, ns, name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("ShardRoute %s/%s exists (annotations %v)", ns, name, r.Annotations)
}
