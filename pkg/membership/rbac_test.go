package membership_test

import (
	"context"
	"flag"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/test/golden"
)

var update = flag.Bool("update", false, "rewrite deploy/rbac/agent-hub.yaml from AgentHubRBAC")

// The static file is the rendering of AgentHubRBAC for "example", so the two
// never drift apart.
func TestAgentHubRBACFile(t *testing.T) {
	want, err := membership.RenderAgentHubRBAC("example")
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("..", "..", "deploy", "rbac", "agent-hub.yaml"), want, *update,
		`RenderAgentHubRBAC("example")`, "go test ./pkg/membership -run TestAgentHubRBACFile -update")
}

func work(ns, name string) *workv1alpha1.Work {
	return &workv1alpha1.Work{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: workv1alpha1.WorkSpec{Workload: workv1alpha1.WorkloadTemplate{Manifests: []workv1alpha1.Manifest{{
			RawExtension: runtime.RawExtension{Raw: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"default"}}`)},
		}}}},
	}
}

// The agent of member1, with exactly the RBAC of AgentHubRBAC("member1"),
// can join, beat and read its Works, and can do nothing to other members or
// beyond.
func TestAgentHubRBACIsExactlyEnough(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, other := unique("member1"), unique("member2")
	// Execution namespaces (Works) and cluster namespaces (Leases).
	ownNS, otherNS := "karmada-es-"+cluster, "karmada-es-"+other
	ownLeaseNS, otherLeaseNS := ctrlmeshv1alpha1.ClusterNamespace(cluster), ctrlmeshv1alpha1.ClusterNamespace(other)

	// The hub admin prepares both members and binds member1's agent.
	for _, ns := range []string{ownNS, otherNS, ownLeaseNS, otherLeaseNS} {
		createNamespace(t, ctx, ns)
	}
	for _, obj := range []client.Object{
		&clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: other}},
		work(ownNS, "own-work"),
		work(otherNS, "other-work"),
		work(ownLeaseNS, "work-in-cluster-namespace"),
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: otherLeaseNS, Name: ctrlmeshv1alpha1.HeartbeatLeaseName}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ownNS, Name: "hub-secret"}},
	} {
		if err := hub.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	applyAgentHubRBAC(t, ctx, cluster, nil)
	user := membership.AgentUserName(cluster)
	if user != "system:serviceaccount:ctrlmesh:agent-"+cluster {
		t.Fatalf("agent user %q", user)
	}
	agent := newUserClient(t, user)
	// RBAC reaches the authorizer through an informer: wait until it has.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := agent.Get(ctx, client.ObjectKey{Namespace: ownNS, Name: "own-work"}, &workv1alpha1.Work{})
		if err == nil {
			break
		}
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			t.Fatalf("the agent cannot read its Work: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitForAcceptPolicy(t, ctx, agent)

	// Everything the agent does succeeds.
	if err := membership.Join(ctx, agent, membership.JoinOptions{ClusterName: cluster, Member: memberDiscovery, MemberClient: memberClient}); err != nil {
		t.Fatalf("Join as the agent: %v", err)
	}
	if err := membership.Join(ctx, agent, membership.JoinOptions{ClusterName: cluster, Member: memberDiscovery, MemberClient: memberClient, AgentVersion: "v2"}); err != nil {
		t.Fatalf("re-Join as the agent: %v", err)
	}
	if accepted, err := membership.IsAccepted(ctx, agent, cluster); err != nil || accepted {
		t.Fatalf("IsAccepted as the agent = %v, %v; want false", accepted, err)
	}
	hb := &membership.Heartbeat{Hub: agent, ClusterName: cluster, Identity: "agent-0",
		LeaseDuration: 2 * time.Second, RenewInterval: 200 * time.Millisecond, Log: testr.New(t)}
	for i := range 2 { // create, then update
		if err := hb.Renew(ctx); err != nil {
			t.Fatalf("heartbeat renewal %d as the agent: %v", i, err)
		}
	}
	_, first := leaseRenewTime(t, ctx, ownLeaseNS)
	runCtx, stop := context.WithCancel(ctx)
	time.AfterFunc(700*time.Millisecond, stop)
	if err := hb.Run(runCtx); err != nil {
		t.Fatal(err)
	}
	if _, last := leaseRenewTime(t, ctx, ownLeaseNS); !last.After(first) {
		t.Errorf("Run as the agent did not renew the lease: %s, then %s", first, last)
	}

	var works workv1alpha1.WorkList
	if err := agent.List(ctx, &works, client.InNamespace(ownNS)); err != nil || len(works.Items) != 1 {
		t.Fatalf("list Works as the agent: %d, %v", len(works.Items), err)
	}
	w, err := agent.Watch(ctx, &workv1alpha1.WorkList{}, client.InNamespace(ownNS))
	if err != nil {
		t.Fatalf("watch Works as the agent: %v", err)
	}
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Added || ev.Object.(*workv1alpha1.Work).Name != "own-work" {
			t.Errorf("first watch event %s %T", ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Error("no watch event for the agent's Work")
	}
	w.Stop()
	own := &works.Items[0]
	meta.SetStatusCondition(&own.Status.Conditions, metav1.Condition{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: "Applied", Message: "by the agent"})
	if err := agent.Status().Update(ctx, own); err != nil {
		t.Fatalf("update Work status as the agent: %v", err)
	}

	// Everything else is forbidden.
	adminGet := func(obj client.Object, key client.ObjectKey) client.Object {
		t.Helper()
		if err := hub.Client.Get(ctx, key, obj); err != nil {
			t.Fatal(err)
		}
		return obj
	}
	for _, tc := range []struct {
		name string
		do   func() error
	}{
		{"get another cluster's ManagedCluster", func() error {
			return agent.Get(ctx, client.ObjectKey{Name: other}, &clusterv1.ManagedCluster{})
		}},
		{"update another cluster's ManagedCluster", func() error {
			mc := adminGet(&clusterv1.ManagedCluster{}, client.ObjectKey{Name: other}).(*clusterv1.ManagedCluster)
			mc.Spec.HubAcceptsClient = true
			return agent.Update(ctx, mc)
		}},
		{"update another cluster's ManagedCluster status", func() error {
			mc := adminGet(&clusterv1.ManagedCluster{}, client.ObjectKey{Name: other}).(*clusterv1.ManagedCluster)
			mc.Status.ClusterClaims = []clusterv1.ManagedClusterClaim{{Name: "x", Value: "y"}}
			return agent.Status().Update(ctx, mc)
		}},
		{"accept itself", func() error {
			mc := adminGet(&clusterv1.ManagedCluster{}, client.ObjectKey{Name: cluster}).(*clusterv1.ManagedCluster)
			mc.Spec.HubAcceptsClient = true
			return agent.Update(ctx, mc)
		}},
		{"delete its ManagedCluster", func() error {
			return agent.Delete(ctx, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster}})
		}},
		{"list ManagedClusters", func() error { return agent.List(ctx, &clusterv1.ManagedClusterList{}) }},
		{"create a ManagedCluster already accepted", func() error {
			return agent.Create(ctx, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: "forged"},
				Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: true}})
		}},
		{"register another cluster", func() error {
			return agent.Create(ctx, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: other + "-forged"}})
		}},
		{"get another member's Lease", func() error {
			return agent.Get(ctx, client.ObjectKey{Namespace: otherLeaseNS, Name: ctrlmeshv1alpha1.HeartbeatLeaseName}, &coordinationv1.Lease{})
		}},
		{"renew another member's Lease", func() error {
			return (&membership.Heartbeat{Hub: agent, ClusterName: other, Identity: "agent-0"}).Renew(ctx)
		}},
		{"update another member's Lease", func() error {
			l := adminGet(&coordinationv1.Lease{}, client.ObjectKey{Namespace: otherLeaseNS, Name: ctrlmeshv1alpha1.HeartbeatLeaseName}).(*coordinationv1.Lease)
			l.Spec.HolderIdentity = ptr.To("agent-0")
			return agent.Update(ctx, l)
		}},
		{"create a Lease in another member's namespace", func() error {
			return agent.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: otherLeaseNS, Name: "x"}})
		}},
		{"create a Lease in its execution namespace", func() error {
			return agent.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ownNS, Name: ctrlmeshv1alpha1.HeartbeatLeaseName}})
		}},
		{"get a Work in its cluster namespace", func() error {
			return agent.Get(ctx, client.ObjectKey{Namespace: ownLeaseNS, Name: "work-in-cluster-namespace"}, &workv1alpha1.Work{})
		}},
		{"get another member's Work", func() error {
			return agent.Get(ctx, client.ObjectKey{Namespace: otherNS, Name: "other-work"}, &workv1alpha1.Work{})
		}},
		{"list another member's Works", func() error {
			return agent.List(ctx, &workv1alpha1.WorkList{}, client.InNamespace(otherNS))
		}},
		{"list Works of all namespaces", func() error { return agent.List(ctx, &workv1alpha1.WorkList{}) }},
		{"update another member's Work status", func() error {
			wk := adminGet(&workv1alpha1.Work{}, client.ObjectKey{Namespace: otherNS, Name: "other-work"}).(*workv1alpha1.Work)
			meta.SetStatusCondition(&wk.Status.Conditions, metav1.Condition{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: "Applied"})
			return agent.Status().Update(ctx, wk)
		}},
		{"update its Work's spec", func() error {
			wk := adminGet(&workv1alpha1.Work{}, client.ObjectKey{Namespace: ownNS, Name: "own-work"}).(*workv1alpha1.Work)
			wk.Spec.SuspendDispatching = ptr.To(true)
			return agent.Update(ctx, wk)
		}},
		{"create a Work in its namespace", func() error { return agent.Create(ctx, work(ownNS, "forged")) }},
		{"delete its Work", func() error { return agent.Delete(ctx, work(ownNS, "own-work")) }},
		{"get a secret in its namespace", func() error {
			return agent.Get(ctx, client.ObjectKey{Namespace: ownNS, Name: "hub-secret"}, &corev1.Secret{})
		}},
		{"list secrets in its namespace", func() error {
			return agent.List(ctx, &corev1.SecretList{}, client.InNamespace(ownNS))
		}},
		{"delete its Lease", func() error {
			return agent.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ownLeaseNS, Name: ctrlmeshv1alpha1.HeartbeatLeaseName}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(); !apierrors.IsForbidden(err) {
				t.Errorf("err = %v, want Forbidden", err)
			}
		})
	}

	// The admin accepts member1; the agent sees it and its re-join keeps it.
	mc := &clusterv1.ManagedCluster{}
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, mc); err != nil {
		t.Fatal(err)
	}
	mc.Spec.HubAcceptsClient = true
	if err := hub.Client.Update(ctx, mc); err != nil {
		t.Fatalf("the admin accepting member1: %v", err)
	}
	if err := membership.Join(ctx, agent, membership.JoinOptions{ClusterName: cluster, Member: memberDiscovery, MemberClient: memberClient, AgentVersion: "v3"}); err != nil {
		t.Fatal(err)
	}
	if accepted, err := membership.IsAccepted(ctx, agent, cluster); err != nil || !accepted {
		t.Fatalf("IsAccepted as the agent after acceptance = %v, %v; want true", accepted, err)
	}
	if err := membership.MarkJoined(ctx, agent, cluster); err != nil {
		t.Fatalf("MarkJoined as the agent: %v", err)
	}
}

// applyAgentHubRBAC creates AgentHubRBAC(cluster) as the hub admin, after
// edit; the shared objects may exist already.
func applyAgentHubRBAC(t *testing.T, ctx context.Context, cluster string, edit func(client.Object)) {
	t.Helper()
	for _, obj := range membership.AgentHubRBAC(cluster) {
		if edit != nil {
			edit(obj)
		}
		if err := hub.Client.Create(ctx, obj); err != nil && !(apierrors.IsAlreadyExists(err) && obj.GetLabels()[ctrlmeshv1alpha1.MemberClusterLabel] == "") {
			t.Fatal(err)
		}
	}
}

func newUserClient(t *testing.T, user string) client.WithWatch {
	t.Helper()
	cfg, err := hub.AddUser(user)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: fleet.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitForAcceptPolicy waits until the API server enforces AcceptPolicy on
// the user of c, who may create ManagedClusters but not accept them.
func waitForAcceptPolicy(t *testing.T, ctx context.Context, c client.Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.Create(ctx, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: "policy-probe"},
			Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: true}}, client.DryRunAll)
		if apierrors.IsForbidden(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the accept policy is not enforced after 30 s: dry-run create of an accepted ManagedCluster: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A hub that creates the ManagedCluster itself can drop the create grant:
// Join then only reads it and writes its status.
func TestJoinWithoutCreateGrant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster := unique("precreated")
	createNamespace(t, ctx, "karmada-es-"+cluster)
	createNamespace(t, ctx, ctrlmeshv1alpha1.ClusterNamespace(cluster))
	if err := hub.Client.Create(ctx, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster}}); err != nil {
		t.Fatal(err)
	}
	applyAgentHubRBAC(t, ctx, cluster, func(obj client.Object) {
		if cr, ok := obj.(*rbacv1.ClusterRole); ok && cr.Name == membership.HubClusterRole(cluster) {
			rules := cr.Rules[:0]
			for _, r := range cr.Rules {
				if !slices.Contains(r.Verbs, "create") {
					rules = append(rules, r)
				}
			}
			cr.Rules = rules
		}
	})
	agent := newUserClient(t, membership.AgentUserName(cluster))
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := membership.IsAccepted(ctx, agent, cluster)
		if err == nil {
			break
		}
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			t.Fatalf("IsAccepted as the agent: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := membership.Join(ctx, agent, membership.JoinOptions{ClusterName: cluster, Member: memberDiscovery, MemberClient: memberClient}); err != nil {
		t.Fatalf("Join without a create grant: %v", err)
	}
	var mc clusterv1.ManagedCluster
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
		t.Fatal(err)
	}
	if len(mc.Status.ClusterClaims) != 3 {
		t.Errorf("claims %+v, want Join's 3", mc.Status.ClusterClaims)
	}
	err := agent.Create(ctx, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: "precreated-other"}})
	if !apierrors.IsForbidden(err) {
		t.Errorf("create without the grant: err = %v, want Forbidden", err)
	}
}

// Only a user who may update managedclusters/accept sets hubAcceptsClient,
// on create or update; everyone may write the other fields.
func TestAcceptPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster := unique("accept-policy")
	createNamespace(t, ctx, "karmada-es-"+cluster)
	createNamespace(t, ctx, ctrlmeshv1alpha1.ClusterNamespace(cluster))
	applyAgentHubRBAC(t, ctx, cluster, nil) // installs the policy
	writeRules := []rbacv1.PolicyRule{{APIGroups: []string{"cluster.open-cluster-management.io"}, Resources: []string{"managedclusters"},
		Verbs: []string{"get", "create", "update"}}}
	acceptRule := rbacv1.PolicyRule{APIGroups: []string{"cluster.open-cluster-management.io"}, Resources: []string{"managedclusters/accept"},
		Verbs: []string{"update"}}
	users := map[string][]rbacv1.PolicyRule{
		"writer":   writeRules,
		"accepter": append(slices.Clone(writeRules), acceptRule),
	}
	clients := map[string]client.Client{}
	for role, rules := range users {
		user := unique(role)
		for _, obj := range []client.Object{
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-" + user}, Rules: rules},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test-" + user},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "test-" + user},
				Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}},
		} {
			if err := hub.Client.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
		}
		clients[role] = newUserClient(t, user)
	}
	waitForAcceptPolicy(t, ctx, clients["writer"])

	created := map[string]string{} // test case to ManagedCluster
	for _, tc := range []struct {
		user, name string
		create     bool // else update an unaccepted one
		accept     bool
		allowed    bool
	}{
		{"writer", "writer-create", true, false, true},
		{"writer", "writer-create-accepted", true, true, false},
		{"writer", "writer-accept", false, true, false},
		{"accepter", "accepter-create-accepted", true, true, true},
		{"accepter", "accepter-accept", false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := clients[tc.user]
			name := unique(tc.name)
			created[tc.name] = name
			mc := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: tc.accept}}
			var err error
			if tc.create {
				err = c.Create(ctx, mc)
			} else {
				if err := hub.Client.Create(ctx, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
					t.Fatal(err)
				}
				if err := hub.Client.Get(ctx, client.ObjectKey{Name: name}, mc); err != nil {
					t.Fatal(err)
				}
				mc.Spec.HubAcceptsClient = tc.accept
				err = c.Update(ctx, mc)
			}
			if tc.allowed && err != nil {
				t.Fatalf("denied: %v", err)
			}
			if !tc.allowed && !apierrors.IsForbidden(err) {
				t.Fatalf("err = %v, want Forbidden", err)
			}
			got := &clusterv1.ManagedCluster{}
			err = hub.Client.Get(ctx, client.ObjectKey{Name: name}, got)
			if tc.allowed || !tc.create {
				if err != nil {
					t.Fatal(err)
				}
				if want := tc.accept && tc.allowed; got.Spec.HubAcceptsClient != want {
					t.Errorf("hubAcceptsClient = %v, want %v", got.Spec.HubAcceptsClient, want)
				}
			} else if !apierrors.IsNotFound(err) {
				t.Errorf("a denied create left ManagedCluster %s: %v", name, err)
			}
		})
	}

	// Once accepted, other updates by the writer pass.
	mc := &clusterv1.ManagedCluster{}
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: created["accepter-accept"]}, mc); err != nil {
		t.Fatal(err)
	}
	mc.Labels = map[string]string{"env": "test"}
	if err := clients["writer"].Update(ctx, mc); err != nil {
		t.Errorf("updating the labels of an accepted ManagedCluster: %v", err)
	}
}
