package routestatus

import (
	rbacv1 "k8s.io/api/rbac/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// MemberRBACRules are the member-cluster rights of the controller, for the
// agent's ClusterRole (cluster-wide: ShardRoutes may be in any namespace).
// The status is written by Update only, so shardroutes/status needs no patch;
// Events are created, and patched when the recorder aggregates repeats.
// Discovery, which the rules check uses, is open to every authenticated user.
func MemberRBACRules() []rbacv1.PolicyRule {
	read := []string{"get", "list", "watch"}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{ctrlmeshv1alpha1.GroupVersion.Group}, Resources: []string{"shardroutes"}, Verbs: read},
		{APIGroups: []string{ctrlmeshv1alpha1.GroupVersion.Group}, Resources: []string{"shardroutes/status"}, Verbs: []string{"update"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: read},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: read},
		// The subsets' namespace rules are resolved against the member's
		// Namespaces (subsets.go).
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: read},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}
