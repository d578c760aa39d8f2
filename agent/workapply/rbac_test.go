package workapply_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestApplyLabelerRBAC: the labeler's ClusterRole and binding a Work carries
// are applied with it, tied to it as the ShardRoute is, and deleted when the
// Work carries them no more or is gone; a role of that name the Work did
// not apply is never taken over.
func TestApplyLabelerRBAC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := newAgent(t, ctx, "rbac")
	a.start(t)
	r := route(a.memberNS, "op", "hash-1")
	rbac, _ := routework.NewLabelerRBAC(r.Namespace, r.Name, r.Spec.Limits, "ctrlmesh")
	name := rbac.Role.Name
	work := newWork(a.execNS, "rules")
	if err := routework.SetManifests(work, r, rbac); err != nil {
		t.Fatal(err)
	}
	env.Create(t, ctx, hub.Client, work)

	applied := func() error {
		var role rbacv1.ClusterRole
		var binding rbacv1.ClusterRoleBinding
		if err := member.Client.Get(ctx, client.ObjectKey{Name: name}, &role); err != nil {
			return err
		}
		if err := member.Client.Get(ctx, client.ObjectKey{Name: name}, &binding); err != nil {
			return err
		}
		for _, obj := range []client.Object{&role, &binding} {
			if from, managed := routework.AppliedFrom(obj); !managed || from != client.ObjectKeyFromObject(work) {
				return fmt.Errorf("%s applied from %v (managed %v)", obj.GetName(), from, managed)
			}
		}
		if len(role.Rules) != 1 || strings.Join(role.Rules[0].Resources, ",") != "configmaps" || binding.Subjects[0].Namespace != "ctrlmesh" {
			return fmt.Errorf("role rules %+v, binding subjects %+v", role.Rules, binding.Subjects)
		}
		w, err := getWork(ctx, a.execNS, "rules")
		if err != nil {
			return err
		}
		return appliedIs(w, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonWorkAppliedSuccessful)
	}
	gone := func() error {
		for _, obj := range []client.Object{&rbacv1.ClusterRole{}, &rbacv1.ClusterRoleBinding{}} {
			if err := member.Client.Get(ctx, client.ObjectKey{Name: name}, obj); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%T %s: %v", obj, name, err)
			}
		}
		return nil
	}
	env.Eventually(t, 30*time.Second, "the labeler role and binding are applied from the Work", applied)

	// The Work without the rights: they go, the route stays.
	updateWork(t, ctx, a.execNS, "rules", func(w *workv1alpha1.Work) {
		if err := routework.SetManifests(w, r, nil); err != nil {
			t.Fatal(err)
		}
	})
	env.Eventually(t, 30*time.Second, "the rights the Work no longer carries are deleted", gone)
	if _, err := getRoute(ctx, a.memberNS, "op"); err != nil {
		t.Fatal(err)
	}

	// Someone else's role of that name is not taken over.
	theirs := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}}}
	env.Create(t, ctx, member.Client, theirs)
	updateWork(t, ctx, a.execNS, "rules", func(w *workv1alpha1.Work) {
		if err := routework.SetManifests(w, r, rbac); err != nil {
			t.Fatal(err)
		}
	})
	env.Eventually(t, 30*time.Second, "the Work reports the conflict", func() error {
		w, err := getWork(ctx, a.execNS, "rules")
		if err != nil {
			return err
		}
		if err := appliedIs(w, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonWorkAppliedFailed); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(w.Status.Conditions, workv1alpha1.WorkApplied); !strings.Contains(c.Message, "ClusterRole "+name+" already exists") {
			return errors.New(c.Message)
		}
		return nil
	})
	var role rbacv1.ClusterRole
	if err := member.Client.Get(ctx, client.ObjectKey{Name: name}, &role); err != nil {
		t.Fatal(err)
	}
	if _, managed := routework.AppliedFrom(&role); managed || role.Rules[0].Resources[0] != "pods" {
		t.Fatalf("someone else's role was taken over: %+v", role)
	}
	if err := member.Client.Delete(ctx, &role); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "once it is gone, the Work's rights are applied", applied)

	// The Work deleted: its rights go.
	if err := hub.Client.Delete(ctx, work); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the rights go with the Work", gone)
}
