package karmadatest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	policyv1alpha1 "github.com/karmada-io/karmada/pkg/apis/policy/v1alpha1"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util/names"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/hub/clusters"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// TestKarmadaRegistration: on a Karmada control plane, a member is usable
// only when Karmada's Cluster of its name is the member and Ready. A member
// Karmada does not know, knows under another name (by the spec.id Karmada
// wrote, which the agent claims as id.k8s.io), knows as another cluster, or
// has not Ready, is reported Available False with a reason and a message
// saying what to do, and, its heartbeat fresh, is not lapsed — also for a
// restarted hub, which before took every Available False for a stale
// heartbeat.
func TestKarmadaRegistration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	first, stopFirst := startController(t)

	// A hand-made Cluster Karmada cannot reach: never Ready. It has no
	// spec.id, as a Cluster created by hand may not.
	env.Create(t, ctx, karmada.Client, &clusterv1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "unready"},
		Spec: clusterv1alpha1.ClusterSpec{SyncMode: clusterv1alpha1.Push, APIEndpoint: "https://127.0.0.1:1"}})

	// The agents join: each claims the ID of the cluster it runs in.
	join(t, ctx, "member1", member1) // Karmada's push Cluster member1
	join(t, ctx, "member2", member2) // Karmada's pull Cluster member2, registered by karmada-agent
	join(t, ctx, "ghost", karmada)   // no Cluster of that name or ID
	join(t, ctx, "alias", member2)   // member2's agent, joined under another name
	join(t, ctx, "unready", karmada) // the never Ready Cluster

	type want struct {
		status metav1.ConditionStatus
		reason string
		in     []string // in the message
	}
	check := func(c *controller, wants map[string]want) func() error {
		return func() error {
			for name, w := range wants {
				var mc clusterv1.ManagedCluster
				if err := karmada.Client.Get(ctx, client.ObjectKey{Name: name}, &mc); err != nil {
					return err
				}
				cond := meta.FindStatusCondition(mc.Status.Conditions, clusterv1.ManagedClusterConditionAvailable)
				if cond == nil || cond.Status != w.status || cond.Reason != w.reason {
					return fmt.Errorf("%s: Available %+v, want %s %s", name, cond, w.status, w.reason)
				}
				for _, s := range w.in {
					if !strings.Contains(cond.Message, s) {
						return fmt.Errorf("%s: message %q lacks %q", name, cond.Message, s)
					}
				}
				rec, ok := c.store.Snapshot().Cluster(name)
				if !ok || rec.Usable() != (w.status == metav1.ConditionTrue) || rec.HeartbeatLapsed {
					return fmt.Errorf("%s: store has %+v, want usable %t, not lapsed", name, rec, w.status == metav1.ConditionTrue)
				}
			}
			return nil
		}
	}
	available := want{metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonClusterAvailable, nil}
	member2ID := kubeSystemUID(t, ctx, member2)
	env.Eventually(t, 30*time.Second, "each member judged by Karmada's Cluster", check(first, map[string]want{
		"member1": available,
		"member2": available,
		"ghost":   {metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNotFound, []string{`Karmada has no Cluster "ghost"`, "karmadactl join ghost"}},
		"alias": {metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNameMismatch,
			[]string{`Karmada knows this member as Cluster "member2"`, member2ID, "--cluster-name=member2"}},
		"unready": {metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady, []string{`Karmada's Cluster "unready" is not ready`}},
	}))

	// member1's agent is started, by mistake, in member2: Karmada's member1
	// is another cluster. Back in member1, it is available again.
	join(t, ctx, "member1", member2)
	env.Eventually(t, 30*time.Second, "member1 claiming member2's ID", check(first, map[string]want{
		"member1": {metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterIDMismatch, []string{kubeSystemUID(t, ctx, member1), member2ID}},
	}))
	join(t, ctx, "member1", member1)
	env.Eventually(t, 30*time.Second, "member1 back", check(first, map[string]want{"member1": available}))

	// Karmada learns ghost's cluster under another name: the controller
	// sees it by the ID, with no event of the ManagedCluster.
	env.Create(t, ctx, karmada.Client, &clusterv1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "edge"},
		Spec: clusterv1alpha1.ClusterSpec{ID: kubeSystemUID(t, ctx, karmada), SyncMode: clusterv1alpha1.Push, APIEndpoint: "https://127.0.0.1:1"}})
	wants := map[string]want{
		"member1": available,
		"member2": available,
		"ghost":   {metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNameMismatch, []string{`Karmada knows this member as Cluster "edge"`}},
		"alias":   {metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNameMismatch, []string{`"member2"`}},
		// The Cluster of its name, without an ID, still speaks for it.
		"unready": {metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonKarmadaClusterNotReady, nil},
	}
	env.Eventually(t, 30*time.Second, "ghost known as edge", check(first, wants))

	// A restarted hub judges alike: the heartbeats are fresh, so no cluster
	// counts as lapsed, available or not.
	stopFirst()
	second, _ := startController(t)
	env.Eventually(t, 30*time.Second, "the restarted hub's judgement", check(second, wants))
}

// join joins name as an agent running in cluster in would: its claims (the
// cluster ID of in) and, in its cluster namespace (the hub admin's on
// Karmada, as the hub chart's target=karmada makes it: the hub creates no
// namespace there), a heartbeat fresh for the test.
func join(t *testing.T, ctx context.Context, name string, in *env.Cluster) {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(in.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := membership.Join(ctx, karmada.Client, membership.JoinOptions{ClusterName: name, Member: dc, MemberClient: in.Client}); err != nil {
		t.Fatal(err)
	}
	env.Create(t, ctx, karmada.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ctrlmeshv1alpha1.ClusterNamespace(name),
		Labels: map[string]string{policyv1alpha1.NamespaceSkipAutoPropagationLabel: "true"}}})
	hb := &membership.Heartbeat{Hub: karmada.Client, ClusterName: name, Identity: "agent-0", LeaseDuration: 10 * time.Minute}
	if err := hb.Renew(ctx); err != nil {
		t.Fatal(err)
	}
}

// controller is one running clusters controller, with its own manager and
// Store.
type controller struct{ store *state.Store }

var userOnce sync.Once

// startController runs the clusters controller, accepting every cluster,
// as a user with exactly its RBAC on Karmada (clusters.KarmadaRBACRules), on a new manager
// and Store, until the test ends or stop is called.
func startController(t *testing.T) (c *controller, stop func()) {
	t.Helper()
	ctx := context.Background()
	opts := clusters.Options{AutoAccept: true}
	const user = "ctrlmesh-hub-clusters"
	userOnce.Do(func() {
		for _, obj := range []client.Object{
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: clusters.KarmadaRBACRules(opts)},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
				Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}},
		} {
			env.Create(t, ctx, karmada.Client, obj)
		}
	})
	cfg, err := karmada.AddUser(user)
	if err != nil {
		t.Fatal(err)
	}
	userClient, err := client.New(cfg, client.Options{Scheme: fleet.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// RBAC reaches the authorizer through an informer: wait until it has.
	env.Eventually(t, 30*time.Second, "RBAC of the controller's user", func() error {
		return userClient.List(ctx, &clusterv1alpha1.ClusterList{})
	})
	store, err := state.New()
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: fleet.Scheme, Logger: logr.Discard(), Metrics: metricsserver.Options{BindAddress: "0"},
		// Tests run several managers, one after the other, in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := (&clusters.Reconciler{Store: store, Options: opts}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	_, stop = env.StartManager(t, mgr)
	return &controller{store: store}, stop
}

// TestNoWorkForUnknownMembers: the whole hub on the Karmada control plane,
// with its shipped RBAC, places a ShardingConfig selecting member1 and a
// member Karmada has no Cluster for: member1 gets its Work, which Karmada
// applies; the other gets none — a Work Karmada would never apply — and the
// ShardingConfig says why.
func TestNoWorkForUnknownMembers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	identity, err := localfleet.PrepareHub(ctx, karmada, "ctrlmesh-hub")
	if err != nil {
		t.Fatal(err)
	}
	hubCtx, stopHub := context.WithCancel(ctx)
	hubDone := make(chan error, 1)
	go func() {
		hubDone <- hub.Run(hubCtx, hub.Options{Config: identity, AutoAccept: true, KarmadaFinalizer: true,
			MetricsAddress: "0", HealthAddress: "0", Log: logr.Discard()})
	}()
	defer func() {
		stopHub()
		if err := <-hubDone; err != nil {
			t.Errorf("hub: %v", err)
		}
	}()
	join(t, ctx, "member1", member1)
	join(t, ctx, "stray", member1) // member1's ID, so Karmada knows it as member1
	env.Eventually(t, 30*time.Second, "stray unavailable", func() error {
		var mc clusterv1.ManagedCluster
		if err := karmada.Client.Get(ctx, client.ObjectKey{Name: "stray"}, &mc); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(mc.Status.Conditions, clusterv1.ManagedClusterConditionAvailable); c == nil ||
			c.Status != metav1.ConditionFalse || c.Reason != ctrlmeshv1alpha1.ReasonKarmadaClusterNameMismatch {
			return fmt.Errorf("Available %+v", c)
		}
		return nil
	})

	env.Create(t, ctx, karmada.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}})
	sc := &ctrlmeshv1alpha1.ShardingConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "op"},
		Spec: ctrlmeshv1alpha1.ShardingConfigSpec{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{
				APIGroups: []string{""}, Resources: []string{"configmaps"},
			}}}},
			Clusters: ctrlmeshv1alpha1.ClusterSelection{Names: []string{"member1", "stray"}},
			Scope:    ctrlmeshv1alpha1.ScopePerCluster,
		},
	}
	env.Create(t, ctx, karmada.Client, sc)
	env.Eventually(t, 60*time.Second, "member1's ShardRoute applied by Karmada, and the config degraded by stray", func() error {
		var route ctrlmeshv1alpha1.ShardRoute
		if err := member1.Client.Get(ctx, client.ObjectKey{Namespace: "team", Name: "op"}, &route); err != nil {
			return fmt.Errorf("member1's ShardRoute: %w", err)
		}
		var got ctrlmeshv1alpha1.ShardingConfig
		if err := karmada.Client.Get(ctx, client.ObjectKeyFromObject(sc), &got); err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, ctrlmeshv1alpha1.ConditionDegraded)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ctrlmeshv1alpha1.ReasonClusterUnavailable ||
			!strings.Contains(c.Message, "stray ("+ctrlmeshv1alpha1.ReasonKarmadaClusterNameMismatch+")") {
			return fmt.Errorf("Degraded %+v", c)
		}
		return nil
	})
	var works workv1alpha1.WorkList
	if err := karmada.Client.List(ctx, &works, client.MatchingLabels{ctrlmeshv1alpha1.WorkConfigNameLabel: sc.Name}); err != nil {
		t.Fatal(err)
	}
	var namespaces []string
	for _, w := range works.Items {
		namespaces = append(namespaces, w.Namespace)
	}
	if len(namespaces) != 1 || namespaces[0] != names.GenerateExecutionSpaceName("member1") {
		t.Errorf("Works in %v, want one, in %s", namespaces, names.GenerateExecutionSpaceName("member1"))
	}
	// Delete it while the hub runs, so that Karmada removes the ShardRoute
	// and the hub the finalizer.
	if err := karmada.Client.Delete(ctx, sc); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 60*time.Second, "the ShardingConfig gone", func() error {
		if err := karmada.Client.Get(ctx, client.ObjectKeyFromObject(sc), &ctrlmeshv1alpha1.ShardingConfig{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
}
