package agent

import (
	"fmt"
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	"github.com/ctrlmesh/ctrlmesh/agent/labeler"
	"github.com/ctrlmesh/ctrlmesh/agent/routestatus"
	"github.com/ctrlmesh/ctrlmesh/agent/workapply"
	"github.com/ctrlmesh/ctrlmesh/pkg/rbacutil"
)

// Names of the agent's member RBAC.
const (
	// ServiceAccount is the agent's ServiceAccount in its namespace.
	ServiceAccount = "ctrlmesh-agent"
	// MemberClusterRole is the agent's ClusterRole in the member cluster.
	MemberClusterRole = "ctrlmesh-agent"
	// LeaderElectionRole lets the agent's replicas elect their leader in the
	// agent's namespace.
	LeaderElectionRole = "ctrlmesh-agent-leader-election"
)

// MemberRBACRules are the agent's rights in its member cluster, cluster-wide:
// those of the status controller, the injection webhook and the Work applier,
// plus
//   - the labeler's: list, watch and patch objects of every resource, since
//     the ShardRoutes, not this role, say which resources are sharded (an
//     admin who knows them may narrow "*" to them), and list namespaces;
//   - the webhook configurations the elected agent writes for labeling (from
//     the ShardRoutes) and injection, and watches to restore them. RBAC
//     cannot restrict create to names.
func MemberRBACRules() []rbacv1.PolicyRule {
	return rbacutil.Merge(routestatus.MemberRBACRules(), inject.MemberRBACRules(), workapply.MemberRBACRules(), []rbacv1.PolicyRule{
		{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"list", "watch", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"}, Verbs: []string{"create"}},
		{
			APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"},
			ResourceNames: []string{labeler.WebhookConfigurationName, InjectWebhookConfigurationName},
			// list and watch by a field selector on the name: the agent
			// restores its configurations when someone changes them.
			Verbs: []string{"get", "list", "watch", "update", "delete"},
		},
	})
}

// MemberRBAC is the agent's RBAC in its member cluster, for the agent's
// ServiceAccount in namespace: the ClusterRole MemberClusterRole and its
// binding, and the Role and RoleBinding LeaderElectionRole in namespace.
func MemberRBAC(namespace string) []client.Object {
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: ServiceAccount}}
	labels := map[string]string{"app.kubernetes.io/part-of": "ctrlmesh"}
	return slices.Concat(
		rbacutil.BoundClusterRole(MemberClusterRole, labels, MemberRBACRules(), subjects),
		rbacutil.LeaderElection(namespace, LeaderElectionRole, LeaderElectionID, labels, subjects),
	)
}

// memberRBACHeader heads the rendering; %[1]s is the namespace.
const memberRBACHeader = `# The member-cluster RBAC of the ctrlmesh agent, for its ServiceAccount
# %[1]s/ctrlmesh-agent. Generated from agent.MemberRBAC("%[1]s") by
#   go test ./agent -run TestMemberRBACFile -update
# (a test fails when this file and the function differ); do not edit.
# Its hub credentials are in agent-hub.yaml.
`

// RenderMemberRBAC renders MemberRBAC(namespace) as multi-document YAML.
func RenderMemberRBAC(namespace string) ([]byte, error) {
	return rbacutil.Render(fmt.Sprintf(memberRBACHeader, namespace), MemberRBAC(namespace))
}
