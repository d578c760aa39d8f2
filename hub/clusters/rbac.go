package clusters

import (
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// RBACRules returns the hub RBAC the controller needs with opts, for one
// ClusterRole bound to the hub's identity:
//
//   - ManagedClusters: get, list and watch; update of their status, for the
//     conditions;
//   - with AutoAccept, patch of ManagedClusters and update of the virtual
//     subresource managedclusters/accept: membership.AcceptPolicy (and OCM's
//     webhook, where OCM runs) lets only holders of the latter set
//     spec.hubAcceptsClient;
//   - the heartbeat Leases: get, list and watch of ctrlmeshv1alpha1.HeartbeatLeaseName only, which
//     the controller lists and watches by that name in every namespace;
//   - namespaces: create, for the execution and cluster namespaces, only
//     where Karmada does not run (KarmadaRBACRules lacks it: see
//     Reconciler.ensureNamespaces);
//   - Karmada Clusters: get, list and watch, used only where the API is
//     served.
func RBACRules(opts Options) []rbacv1.PolicyRule {
	managedClusterVerbs := []string{"get", "list", "watch"}
	if opts.AutoAccept {
		managedClusterVerbs = append(managedClusterVerbs, "patch")
	}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"cluster.open-cluster-management.io"}, Resources: []string{"managedclusters"}, Verbs: managedClusterVerbs},
		{APIGroups: []string{"cluster.open-cluster-management.io"}, Resources: []string{"managedclusters/status"}, Verbs: []string{"update"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{ctrlmeshv1alpha1.HeartbeatLeaseName}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"create"}},
		{APIGroups: []string{karmadaClusterGVK.Group}, Resources: []string{"clusters"}, Verbs: []string{"get", "list", "watch"}},
	}
	if opts.AutoAccept {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{"cluster.open-cluster-management.io"}, Resources: []string{"managedclusters/accept"}, Verbs: []string{"update"}})
	}
	return rules
}

// KarmadaRBACRules are RBACRules(opts) for a hub on Karmada, without the
// right to create namespaces: there the execution namespaces are Karmada's,
// the cluster namespaces the hub admin's, and the controller creates none
// (Reconciler.ensureNamespaces).
func KarmadaRBACRules(opts Options) []rbacv1.PolicyRule {
	return slices.DeleteFunc(RBACRules(opts), func(r rbacv1.PolicyRule) bool {
		return slices.Equal(r.APIGroups, []string{""}) && slices.Equal(r.Resources, []string{"namespaces"})
	})
}
