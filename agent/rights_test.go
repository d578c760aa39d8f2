package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestLabelerRights runs the agent in standalone mode with only its shipped
// RBAC, which names no resource the labeler labels, and follows the
// labeler's rights as the hub's Works bring them: without them the labeler
// labels nothing and says so in the route's status; with the labeler
// ClusterRole of a Work it labels the ConfigMaps its limits name, and still
// may not read Secrets; a limit naming Secrets brings those rights too;
// a Work asking for more than a labeler role may hold is refused; the
// Work's deletion takes the rights away. Beside the Applier's own check,
// the agent's admission policy refuses the same RBAC writes the agent's
// credentials would make directly.
func TestLabelerRights(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	f := startFleet(t, ctx)
	env.Create(t, ctx, f.hub.Client, &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: cluster}, Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: true},
	})
	asAgent, err := kubernetes.NewForConfig(f.agentMember)
	if err != nil {
		t.Fatal(err)
	}
	// What the labeler will find: an unlabeled ConfigMap and a Secret.
	env.Create(t, ctx, f.member.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}})
	env.Create(t, ctx, f.member.Client, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "old"}})
	env.Create(t, ctx, f.member.Client, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "old"}})
	mayList := func(resource string) error {
		var err error
		switch resource {
		case "configmaps":
			_, err = asAgent.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
		case "secrets":
			_, err = asAgent.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
		}
		return err
	}
	for _, resource := range []string{"configmaps", "secrets"} {
		if err := mayList(resource); !apierrors.IsForbidden(err) {
			t.Fatalf("with only its shipped RBAC the agent lists %s: %v", resource, err)
		}
	}
	f.startAgent(t, ctx, true)

	// The Work of a hub that does not know the agent's namespace yet: the
	// route alone.
	work := f.writeWork(t, ctx, route(), "")
	env.Eventually(t, 60*time.Second, "the route says the labeler lacks the rights on ConfigMaps", func() error {
		return f.labeled(ctx, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonLabelerForbidden)
	})
	if cm := f.configMap(t, ctx, "old"); cm.Labels[ctrlmeshv1alpha1.ShardingHashLabel] != "" {
		t.Fatalf("labeled without the rights: %v", cm.Labels)
	}

	// With the labeler's rights in the Work, the sweep labels the ConfigMap.
	f.writeWork(t, ctx, route(), agentNamespace)
	env.Eventually(t, 60*time.Second, "the existing ConfigMap is labeled with the Work's rights", func() error {
		if hash := f.configMap(t, ctx, "old").Labels[ctrlmeshv1alpha1.ShardingHashLabel]; hash == "" {
			return errors.New("not labeled yet")
		}
		return f.labeled(ctx, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonObjectsLabeled)
	})
	if err := mayList("secrets"); !apierrors.IsForbidden(err) {
		t.Fatalf("the labeler's rights on ConfigMaps let the agent list Secrets: %v", err)
	}

	// A limit that names Secrets brings the rights on them.
	withSecrets := route()
	withSecrets.Spec.RoutingGeneration, withSecrets.Spec.RulesHash = 2, "hash-2"
	withSecrets.Spec.Limits[0].RelateResources[0].Resources = []string{"configmaps", "secrets"}
	f.writeWork(t, ctx, withSecrets, agentNamespace)
	env.Eventually(t, 60*time.Second, "the agent may list Secrets and labels the Secret", func() error {
		if err := mayList("secrets"); err != nil {
			return err
		}
		var s corev1.Secret
		if err := f.member.Client.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "old"}, &s); err != nil {
			return err
		}
		if s.Labels[ctrlmeshv1alpha1.ShardingHashLabel] == "" {
			return errors.New("the Secret is not labeled yet")
		}
		return nil
	})

	// A Work that asks for more than a labeler role holds is refused whole.
	roleName := ctrlmeshv1alpha1.LabelerRBACName(opsNamespace, "demo-op")
	updateWorkManifest(t, ctx, f, 1, func(raw []byte) []byte {
		var role rbacv1.ClusterRole
		mustUnmarshal(t, raw, &role)
		role.Rules[0].Resources = []string{"*"}
		return mustJSON(t, &role)
	})
	env.Eventually(t, 30*time.Second, "the Work with a wildcard role is refused", func() error {
		var w workv1alpha1.Work
		if err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(work), &w); err != nil {
			return err
		}
		c := meta.FindStatusCondition(w.Status.Conditions, workv1alpha1.WorkApplied)
		if c == nil || c.ObservedGeneration != w.Generation || c.Reason != ctrlmeshv1alpha1.ReasonWorkAppliedFailed {
			return fmt.Errorf("applied %+v", c)
		}
		return nil
	})
	var role rbacv1.ClusterRole
	if err := f.member.Client.Get(ctx, client.ObjectKey{Name: roleName}, &role); err != nil {
		t.Fatal(err)
	}
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			if res == "*" {
				t.Fatalf("the refused role reached the member: %+v", role.Rules)
			}
		}
	}

	// The API server holds the agent's own RBAC writes to the same rules.
	for _, tc := range []struct {
		name string
		obj  client.Object
	}{
		{"a role of another name", &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "not-the-labeler"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}}}},
		{"a labeler role with get", &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ctrlmeshv1alpha1.LabelerRBACPrefix + "x"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}}}},
		{"a labeler role with a subresource", &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ctrlmeshv1alpha1.LabelerRBACPrefix + "x"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"patch"}}}}},
		{"a binding of cluster-admin", &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ctrlmeshv1alpha1.LabelerRBACPrefix + "x"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: agentNamespace, Name: ctrlmeshv1alpha1.AgentServiceAccount}}}},
		{"a binding to another subject", &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: roleName + "2"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: roleName},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: "default"}}}},
	} {
		asAgentClient, err := client.New(f.agentMember, client.Options{Scheme: f.member.Client.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		if err := asAgentClient.Create(ctx, tc.obj); !apierrors.IsForbidden(err) {
			t.Errorf("%s: the agent's create = %v, want Forbidden", tc.name, err)
		}
	}

	// Deleting the Work takes the rights with it.
	if err := f.hub.Client.Delete(ctx, work); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the labeler role and binding go with the Work", func() error {
		for _, obj := range []client.Object{&rbacv1.ClusterRole{}, &rbacv1.ClusterRoleBinding{}} {
			if err := f.member.Client.Get(ctx, client.ObjectKey{Name: roleName}, obj); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%T %s: %v", obj, roleName, err)
			}
		}
		for _, resource := range []string{"configmaps", "secrets"} {
			if err := mayList(resource); !apierrors.IsForbidden(err) {
				return fmt.Errorf("the agent still lists %s: %v", resource, err)
			}
		}
		return nil
	})
}

// writeWork writes the Work demo-op as the hub's Writer would: the route
// and, when agentNS is set, the labeler's rights on what its limits name.
func (f *testFleet) writeWork(t *testing.T, ctx context.Context, r *ctrlmeshv1alpha1.ShardRoute, agentNS string) *workv1alpha1.Work {
	t.Helper()
	rbac, _ := routework.NewLabelerRBAC(r.Namespace, r.Name, r.Spec.Limits, agentNS)
	work := &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: f.execNS, Name: "demo-op"}}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		err := f.hub.Client.Get(ctx, client.ObjectKeyFromObject(work), work)
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if err := routework.SetManifests(work, r, rbac); err != nil {
			return err
		}
		if apierrors.IsNotFound(err) {
			return f.hub.Client.Create(ctx, work)
		}
		return f.hub.Client.Update(ctx, work)
	})
	if err != nil {
		t.Fatal(err)
	}
	return work
}

// updateWorkManifest rewrites manifest i of the Work demo-op, as a hub
// made to write something else would.
func updateWorkManifest(t *testing.T, ctx context.Context, f *testFleet, i int, edit func([]byte) []byte) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var w workv1alpha1.Work
		if err := f.hub.Client.Get(ctx, client.ObjectKey{Namespace: f.execNS, Name: "demo-op"}, &w); err != nil {
			return err
		}
		w.Spec.Workload.Manifests[i].Raw = edit(w.Spec.Workload.Manifests[i].Raw)
		return f.hub.Client.Update(ctx, &w)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// labeled checks the route's Labeled condition.
func (f *testFleet) labeled(ctx context.Context, status metav1.ConditionStatus, reason string) error {
	var r ctrlmeshv1alpha1.ShardRoute
	if err := f.member.Client.Get(ctx, client.ObjectKey{Namespace: opsNamespace, Name: "demo-op"}, &r); err != nil {
		return err
	}
	c := meta.FindStatusCondition(r.Status.Conditions, ctrlmeshv1alpha1.ConditionLabeled)
	if c == nil || c.Status != status || c.Reason != reason {
		return fmt.Errorf("Labeled %+v, want %s %s", c, status, reason)
	}
	return nil
}

func (f *testFleet) configMap(t *testing.T, ctx context.Context, name string) *corev1.ConfigMap {
	t.Helper()
	var cm corev1.ConfigMap
	if err := f.member.Client.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: name}, &cm); err != nil {
		t.Fatal(err)
	}
	return &cm
}

func mustUnmarshal(t *testing.T, data []byte, into any) {
	t.Helper()
	if err := json.Unmarshal(data, into); err != nil {
		t.Fatal(err)
	}
}
