package workapply

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

// applyLabelerRBAC applies the labeler's ClusterRole and then its binding
// from the Work (which routework.DecodeAll checked: labeler names, no
// wildcard, no subresource, the agent's ServiceAccount only), and deletes
// the labeler RBAC the Work applied before and carries no more. The role
// goes first, so that the binding never names a role with rules of another
// Work.
func (a *Applier) applyLabelerRBAC(ctx context.Context, log logr.Logger, work *workv1alpha1.Work, rbac *routework.LabelerRBAC) error {
	key := client.ObjectKeyFromObject(work)
	keep := ""
	if rbac != nil {
		keep = rbac.Role.Name
		if err := applyRBAC(ctx, a, work, "ClusterRole", rbac.Role, func(current, desired *rbacv1.ClusterRole) { current.Rules = desired.Rules }); err != nil {
			return err
		}
		if err := applyRBAC(ctx, a, work, "ClusterRoleBinding", rbac.Binding, func(current, desired *rbacv1.ClusterRoleBinding) {
			current.Subjects = desired.Subjects
		}); err != nil {
			return err
		}
	}
	return errors.Join(
		deleteAppliedRBAC(ctx, a, log, key, keep, &rbacv1.ClusterRoleBindingList{}),
		deleteAppliedRBAC(ctx, a, log, key, keep, &rbacv1.ClusterRoleList{}))
}

// applyRBAC creates desired, or updates what set copies of it onto the
// existing object, with the Work's labels and annotations. An existing
// object not applied from the Work is a conflict, as for ShardRoutes. A
// binding whose roleRef differs (immutable) is a conflict too: the checked
// Work names its own role, so only someone else's binding can differ.
func applyRBAC[T interface {
	client.Object
	*E
}, E any](ctx context.Context, a *Applier, work *workv1alpha1.Work, kind string, desired T, set func(current, desired T)) error {
	labels, annotations := routework.AppliedLabels(work), routework.AppliedAnnotations(work)
	key := client.ObjectKeyFromObject(desired)
	current := T(new(E))
	err := a.member.Get(ctx, key, current)
	if apierrors.IsNotFound(err) {
		obj := T(new(E))
		*obj = *desired
		obj.SetLabels(merged(desired.GetLabels(), labels))
		obj.SetAnnotations(merged(desired.GetAnnotations(), annotations))
		obj.SetResourceVersion("")
		if err := a.member.Create(ctx, obj, client.FieldOwner(ctrlmeshv1alpha1.WorkApplyFieldManager)); err != nil {
			return fmt.Errorf("creating %s %s: %w", kind, key.Name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s %s: %w", kind, key.Name, err)
	}
	if owner, _ := routework.AppliedFrom(current); owner != client.ObjectKeyFromObject(work) || !sameRoleRef(current, desired) {
		conflict := &conflictError{kind: kind, object: key.Name, cluster: a.ClusterName}
		if owner.Name != "" {
			conflict.owner = owner.String()
		}
		return conflict
	}
	updated := current.DeepCopyObject().(T)
	set(updated, desired)
	updated.SetLabels(merged(current.GetLabels(), desired.GetLabels(), labels))
	updated.SetAnnotations(merged(current.GetAnnotations(), desired.GetAnnotations(), annotations))
	if equality.Semantic.DeepEqual(updated, current) {
		return nil
	}
	if err := a.member.Update(ctx, updated, client.FieldOwner(ctrlmeshv1alpha1.WorkApplyFieldManager)); err != nil {
		return fmt.Errorf("updating %s %s: %w", kind, key.Name, err)
	}
	return nil
}

func sameRoleRef(current, desired client.Object) bool {
	c, ok := current.(*rbacv1.ClusterRoleBinding)
	if !ok {
		return true
	}
	return c.RoleRef == desired.(*rbacv1.ClusterRoleBinding).RoleRef
}

// deleteAppliedRBAC deletes the objects of list's kind applied from the
// Work, except the one named keep.
func deleteAppliedRBAC(ctx context.Context, a *Applier, log logr.Logger, work types.NamespacedName, keep string, list client.ObjectList) error {
	if err := a.member.List(ctx, list, client.MatchingFields{workIndex: work.String()}); err != nil {
		return fmt.Errorf("listing the %T applied from Work %s: %w", list, work, err)
	}
	objects, err := meta.ExtractList(list)
	if err != nil {
		return err
	}
	for _, o := range objects {
		obj := o.(client.Object)
		if obj.GetName() == keep {
			continue
		}
		uid, rv := obj.GetUID(), obj.GetResourceVersion()
		err := a.member.Delete(ctx, obj, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s of Work %s: %w", obj.GetName(), work, err)
		}
		log.V(1).Info("deleted labeler RBAC of a Work that is gone or carries it no more", "name", obj.GetName())
	}
	return nil
}
