package hub

import (
	"fmt"
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/clusters"
	"github.com/ctrlmesh/ctrlmesh/hub/policystatus"
	"github.com/ctrlmesh/ctrlmesh/hub/propagation"
	"github.com/ctrlmesh/ctrlmesh/pkg/rbacutil"
)

// Names of the hub's RBAC.
const (
	// ServiceAccount is the hub's ServiceAccount in its namespace.
	ServiceAccount = "ctrlmesh-hub"
	// ClusterRole holds the hub's rights; AutoAcceptClusterRole the extra
	// rights of --auto-accept.
	ClusterRole           = "ctrlmesh-hub"
	AutoAcceptClusterRole = "ctrlmesh-hub-auto-accept"
	// LeaderElectionRole lets the hub's replicas elect their leader.
	LeaderElectionRole = "ctrlmesh-hub-leader-election"
)

// RBACRules are the hub's rights without --auto-accept: those of the
// clusters controller and the Work writer, plus ShardingConfigs (read,
// finalizer, status) and Events.
func RBACRules() []rbacv1.PolicyRule { return rbacRules(clusters.RBACRules(clusters.Options{})) }

// KarmadaRBACRules are RBACRules for a hub on Karmada: without the right to
// create namespaces (clusters.KarmadaRBACRules), which there are Karmada's.
func KarmadaRBACRules() []rbacv1.PolicyRule {
	return rbacRules(clusters.KarmadaRBACRules(clusters.Options{}))
}

func rbacRules(clusterRules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	group := ctrlmeshv1alpha1.GroupVersion.Group
	return rbacutil.Merge(clusterRules, propagation.RBACRules(), policystatus.RBACRules(), []rbacv1.PolicyRule{
		{APIGroups: []string{group}, Resources: []string{"shardingconfigs"}, Verbs: []string{"get", "list", "watch", "update"}},
		{APIGroups: []string{group}, Resources: []string{"shardingconfigs/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	})
}

// AutoAcceptRBACRules are the rights --auto-accept adds.
func AutoAcceptRBACRules() []rbacv1.PolicyRule {
	base := clusters.RBACRules(clusters.Options{})
	var extra []rbacv1.PolicyRule
	for _, r := range clusters.RBACRules(clusters.Options{AutoAccept: true}) {
		if slices.ContainsFunc(base, func(b rbacv1.PolicyRule) bool { return equality.Semantic.DeepEqual(b, r) }) {
			continue
		}
		extra = append(extra, r)
	}
	return extra
}

// RBAC is the hub's RBAC for its ServiceAccount in namespace: the
// ClusterRoles ClusterRole and, with autoAccept, AutoAcceptClusterRole, their
// bindings, and the leader election's Role, binding and FlowSchema (rbacutil.LeaderElection).
func RBAC(namespace string, autoAccept bool) []client.Object {
	return rbac(namespace, autoAccept, RBACRules())
}

// KarmadaRBAC is RBAC for a hub on Karmada, with KarmadaRBACRules: what the
// ctrlmesh-hub chart installs on the Karmada API server (target=karmada).
func KarmadaRBAC(namespace string, autoAccept bool) []client.Object {
	return rbac(namespace, autoAccept, KarmadaRBACRules())
}

func rbac(namespace string, autoAccept bool, rules []rbacv1.PolicyRule) []client.Object {
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: ServiceAccount}}
	labels := map[string]string{"app.kubernetes.io/part-of": "ctrlmesh"}
	out := rbacutil.BoundClusterRole(ClusterRole, labels, rules, subjects)
	if autoAccept {
		out = append(out, rbacutil.BoundClusterRole(AutoAcceptClusterRole, labels, AutoAcceptRBACRules(), subjects)...)
	}
	return append(out, rbacutil.LeaderElection(namespace, LeaderElectionRole, LeaderElectionID, labels, subjects)...)
}

const rbacHeader = `# The RBAC of ctrlmesh-hub on the hub cluster, for its ServiceAccount
# %[1]s/ctrlmesh-hub, with --auto-accept (ClusterRole
# ctrlmesh-hub-auto-accept: drop it and its binding when an admin accepts
# member clusters), and the FlowSchema that puts its leader election's
# Lease requests at the leader-election priority level. Generated from
# hub.RBAC("%[1]s", true) by
#   go test ./hub -run TestRBACFile -update
# (a test fails when this file and the function differ); do not edit.
`

// RenderRBAC renders RBAC(namespace, true) as multi-document YAML.
func RenderRBAC(namespace string) ([]byte, error) {
	return rbacutil.Render(fmt.Sprintf(rbacHeader, namespace), RBAC(namespace, true))
}
