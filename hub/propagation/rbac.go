package propagation

import (
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	rbacv1 "k8s.io/api/rbac/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
)

// RBACRules are the hub rights a Writer needs, and routework.ReadStatus's
// caller to read and watch Works: Works live in one execution namespace per member
// (karmada-es-<cluster>), so the rules are for a ClusterRole bound
// cluster-wide. Status is read from the Works themselves; the Writer never
// writes it. It reads ManagedClusters for the namespace each agent claims.
func RBACRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{{
		APIGroups: []string{workv1alpha1.GroupName},
		Resources: []string{"works"},
		Verbs:     []string{"get", "list", "watch", "create", "patch", "delete"},
	}, {
		APIGroups: []string{clusterv1.GroupName},
		Resources: []string{"managedclusters"},
		Verbs:     []string{"get", "list", "watch"},
	}}
}
