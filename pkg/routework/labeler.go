package routework

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// LabelerVerbs are the verbs the agent's labeler needs on the objects of a
// sharded resource: list and watch to find them, patch to label them.
var LabelerVerbs = []string{"list", "patch", "watch"}

var (
	clusterRoleGVK        = rbacv1.SchemeGroupVersion.WithKind("ClusterRole")
	clusterRoleBindingGVK = rbacv1.SchemeGroupVersion.WithKind("ClusterRoleBinding")
)

// LabelerRBAC is what a Work carries besides its ShardRoute: the ClusterRole
// that gives the member agent's labeler LabelerVerbs on exactly the
// resources the limits name, and its binding to the agent's ServiceAccount.
type LabelerRBAC struct {
	Role    *rbacv1.ClusterRole
	Binding *rbacv1.ClusterRoleBinding
}

// NewLabelerRBAC renders the labeler's rights for the limits of
// ShardingConfig namespace/name in a member whose agent runs in
// agentNamespace. A limit entry with "*" for a group or a resource, or a
// resource with a "/" (a subresource), cannot be granted without a wildcard
// or a subresource: it gets no rights, and unexpressed names each such entry
// ("group/resource") for the caller to report. The result is nil when no
// resource can be granted or agentNamespace is empty (the agent has not
// claimed it): the labeler then lacks the rights and says so.
func NewLabelerRBAC(namespace, name string, limits ctrlmeshv1alpha1.Limits, agentNamespace string) (rbac *LabelerRBAC, unexpressed []string) {
	byGroup := map[string][]string{}
	for _, limit := range limits {
		for _, rg := range limit.RelateResources {
			for _, group := range rg.APIGroups {
				for _, resource := range rg.Resources {
					if group == rbacv1.APIGroupAll || resource == rbacv1.ResourceAll || strings.Contains(resource, "/") {
						unexpressed = append(unexpressed, group+"/"+resource)
						continue
					}
					if !slices.Contains(byGroup[group], resource) {
						byGroup[group] = append(byGroup[group], resource)
					}
				}
			}
		}
	}
	slices.Sort(unexpressed)
	unexpressed = slices.Compact(unexpressed)
	if len(byGroup) == 0 || agentNamespace == "" {
		return nil, unexpressed
	}
	rules := make([]rbacv1.PolicyRule, 0, len(byGroup))
	for group, resources := range byGroup {
		slices.Sort(resources)
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{group}, Resources: resources, Verbs: slices.Clone(LabelerVerbs)})
	}
	slices.SortFunc(rules, func(a, b rbacv1.PolicyRule) int { return cmp.Compare(a.APIGroups[0], b.APIGroups[0]) })

	objectName := ctrlmeshv1alpha1.LabelerRBACName(namespace, name)
	labels := map[string]string{"app.kubernetes.io/part-of": "ctrlmesh"}
	return &LabelerRBAC{
		Role: &rbacv1.ClusterRole{
			TypeMeta:   metav1.TypeMeta{APIVersion: clusterRoleGVK.GroupVersion().String(), Kind: clusterRoleGVK.Kind},
			ObjectMeta: metav1.ObjectMeta{Name: objectName, Labels: labels},
			Rules:      rules,
		},
		Binding: &rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: clusterRoleBindingGVK.GroupVersion().String(), Kind: clusterRoleBindingGVK.Kind},
			ObjectMeta: metav1.ObjectMeta{Name: objectName, Labels: labels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: clusterRoleGVK.Kind, Name: objectName},
			Subjects: []rbacv1.Subject{{
				Kind: rbacv1.ServiceAccountKind, Namespace: agentNamespace, Name: ctrlmeshv1alpha1.AgentServiceAccount,
			}},
		},
	}, unexpressed
}

// Check refuses labeler RBAC that grants more than a labeler ClusterRole
// may: a name without ctrlmeshv1alpha1.LabelerRBACPrefix, a binding not of
// its own role to exactly the agent's ServiceAccount, and any rule that is
// not LabelerVerbs on named resources of named groups — no wildcard, no
// subresource, no resourceNames, no non-resource URL, no aggregation. It is
// what the Work decoder, and so the agent's standalone applier, holds every
// Work to: however the hub was made to write it, the applier grants no
// more.
func (r *LabelerRBAC) Check() error {
	role, binding := r.Role, r.Binding
	if role == nil || binding == nil {
		return errors.New("labeler RBAC needs both its ClusterRole and its ClusterRoleBinding")
	}
	if !strings.HasPrefix(role.Name, ctrlmeshv1alpha1.LabelerRBACPrefix) || len(role.Name) == len(ctrlmeshv1alpha1.LabelerRBACPrefix) {
		return fmt.Errorf("ClusterRole %q: a labeler ClusterRole's name starts with %q", role.Name, ctrlmeshv1alpha1.LabelerRBACPrefix)
	}
	if role.AggregationRule != nil {
		return fmt.Errorf("ClusterRole %q: a labeler ClusterRole has no aggregationRule", role.Name)
	}
	if len(role.Rules) == 0 {
		return fmt.Errorf("ClusterRole %q: a labeler ClusterRole has rules", role.Name)
	}
	for i, rule := range role.Rules {
		if err := checkLabelerRule(rule); err != nil {
			return fmt.Errorf("ClusterRole %q, rule %d: %w", role.Name, i, err)
		}
	}
	if binding.Name != role.Name || binding.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: clusterRoleGVK.Kind, Name: role.Name}) {
		return fmt.Errorf("ClusterRoleBinding %q: a labeler binding has the name of its ClusterRole %q and binds it, not %s %q",
			binding.Name, role.Name, binding.RoleRef.Kind, binding.RoleRef.Name)
	}
	if len(binding.Subjects) != 1 || binding.Subjects[0].Kind != rbacv1.ServiceAccountKind ||
		binding.Subjects[0].Name != ctrlmeshv1alpha1.AgentServiceAccount || binding.Subjects[0].Namespace == "" {
		return fmt.Errorf("ClusterRoleBinding %q: a labeler binding's one subject is the ServiceAccount %s of the agent's namespace, not %+v",
			binding.Name, ctrlmeshv1alpha1.AgentServiceAccount, binding.Subjects)
	}
	return nil
}

func checkLabelerRule(rule rbacv1.PolicyRule) error {
	switch {
	case len(rule.NonResourceURLs) > 0:
		return errors.New("non-resource URLs are not the labeler's")
	case len(rule.ResourceNames) > 0:
		return errors.New("the labeler's rules name no objects")
	case len(rule.APIGroups) == 0 || len(rule.Resources) == 0:
		return errors.New("a rule names its API groups and resources")
	case !slices.Equal(slices.Sorted(slices.Values(rule.Verbs)), LabelerVerbs):
		return fmt.Errorf("verbs %v, not the labeler's %v", rule.Verbs, LabelerVerbs)
	}
	for _, group := range rule.APIGroups {
		if group == rbacv1.APIGroupAll {
			return errors.New(`API group "*": the labeler gets named groups only`)
		}
	}
	for _, resource := range rule.Resources {
		if resource == "" || resource == rbacv1.ResourceAll || strings.Contains(resource, "/") {
			return fmt.Errorf("resource %q: the labeler gets named resources only, no wildcard and no subresource", resource)
		}
	}
	return nil
}
