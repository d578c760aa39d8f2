package membership

import (
	"fmt"

	"github.com/karmada-io/karmada/pkg/util/names"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/rbacutil"
)

// The agent's identity on the hub: the ServiceAccount
// AgentNamespace/agent-<cluster>, whose token the member's agent uses.
const (
	// AgentNamespace holds the agents' ServiceAccounts on the hub.
	AgentNamespace = "ctrlmesh"
	// ExecutionClusterRole (its Works) is shared by all members and bound
	// per member by a RoleBinding in the member's execution namespace.
	ExecutionClusterRole = "ctrlmesh-agent-execution"
	// HeartbeatClusterRole (its heartbeat Lease) is shared by all members
	// and bound per member by a RoleBinding in the member's cluster
	// namespace.
	HeartbeatClusterRole = "ctrlmesh-agent-heartbeat"
	// ExecutionRoleBinding is the name of both RoleBindings.
	ExecutionRoleBinding = "ctrlmesh-agent"
	// partOfLabel marks every object AgentHubRBAC returns.
	partOfLabel = "app.kubernetes.io/part-of"
	// AcceptPolicy is the ValidatingAdmissionPolicy, and its binding, that
	// guards spec.hubAcceptsClient as OCM's webhook does.
	AcceptPolicy = "ctrlmesh-managedcluster-accept"
)

// acceptExpression admits a ManagedCluster whose spec.hubAcceptsClient is
// false, or was already true, or whose writer may update the virtual
// subresource managedclusters/accept of it: OCM's own rule.
const acceptExpression = `!has(object.spec) || !has(object.spec.hubAcceptsClient) || !object.spec.hubAcceptsClient ||
(request.operation == 'UPDATE' && has(oldObject.spec) && has(oldObject.spec.hubAcceptsClient) && oldObject.spec.hubAcceptsClient) ||
authorizer.group('cluster.open-cluster-management.io').resource('managedclusters').subresource('accept').name(object.metadata.name).check('update').allowed()`

// ownNameExpression admits a ManagedCluster written by anyone but an agent,
// or by the agent of the cluster of the same name: RBAC cannot restrict
// create to a name, so without it one member's agent could register (and,
// with auto-accept, have accepted) a cluster of any name.
var ownNameExpression = fmt.Sprintf("!request.userInfo.username.startsWith('%[1]s') || request.userInfo.username == '%[1]s' + object.metadata.name", AgentUserName(""))

// AgentServiceAccount is the name of the agent's ServiceAccount on the hub,
// in AgentNamespace.
func AgentServiceAccount(cluster string) string { return "agent-" + cluster }

// AgentUserName is the user name of the agent's ServiceAccount, as the hub's
// API server authenticates it.
func AgentUserName(cluster string) string {
	return "system:serviceaccount:" + AgentNamespace + ":" + AgentServiceAccount(cluster)
}

// HubClusterRole is the name of the per-member ClusterRole for the member's
// own ManagedCluster.
func HubClusterRole(cluster string) string { return "ctrlmesh-agent-hub:" + cluster }

// AgentHubRBAC returns the hub RBAC for the agent of one member, exactly what
// Join, Heartbeat, IsAccepted and reading the member's Works need:
//
//   - ClusterRole HeartbeatClusterRole (shared by all members): create
//     Leases and get/update/patch the Lease
//     ctrlmeshv1alpha1.HeartbeatLeaseName;
//   - ClusterRole ExecutionClusterRole (shared by all members): get/list/watch
//     Works and update/patch their status (not their spec);
//   - ClusterRole HubClusterRole(cluster) and its ClusterRoleBinding: get the
//     member's own ManagedCluster and get/update/patch its status;
//     create ManagedClusters;
//   - RoleBinding ExecutionRoleBinding in the cluster namespace <cluster>,
//     binding HeartbeatClusterRole there only, and one in
//     karmada-es-<cluster>, binding ExecutionClusterRole there only;
//   - the ValidatingAdmissionPolicy AcceptPolicy and its binding (shared by
//     all members): only a user who may update managedclusters/accept of a
//     ManagedCluster may set its spec.hubAcceptsClient to true, as OCM's
//     webhook enforces where OCM runs. Without it, the create grant below
//     would let an agent create its ManagedCluster already accepted. The
//     same policy lets an agent write only the ManagedCluster of its own
//     cluster name.
//
// All bind the ServiceAccount AgentNamespace/AgentServiceAccount(cluster).
// The namespaces (AgentNamespace, <cluster> and karmada-es-<cluster>) and
// the ServiceAccount are the hub's to create — but on Karmada,
// karmada-es-<cluster> is Karmada's, made when the member joins it.
//
// RBAC cannot restrict create to resource names, so AcceptPolicy limits the
// create grant on managedclusters to the agent's own cluster name, not
// accepted; it is needed only for the first Join. A hub that creates the member's ManagedCluster itself
// should delete that rule: Join then only reads the object and writes its
// status. The agent gets no update or patch on the ManagedCluster itself, so
// it cannot set spec.hubAcceptsClient of an existing one.
func AgentHubRBAC(cluster string) []client.Object {
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: AgentNamespace, Name: AgentServiceAccount(cluster)}}
	shared := map[string]string{partOfLabel: "ctrlmesh"}
	member := map[string]string{partOfLabel: "ctrlmesh", ctrlmeshv1alpha1.MemberClusterLabel: cluster}
	return []client.Object{
		&rbacv1.ClusterRole{
			TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole"},
			ObjectMeta: metav1.ObjectMeta{Name: HeartbeatClusterRole, Labels: shared},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{ctrlmeshv1alpha1.HeartbeatLeaseName}, Verbs: []string{"get", "update", "patch"}},
			},
		},
		&rbacv1.ClusterRole{
			TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole"},
			ObjectMeta: metav1.ObjectMeta{Name: ExecutionClusterRole, Labels: shared},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{"work.karmada.io"}, Resources: []string{"works"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{"work.karmada.io"}, Resources: []string{"works/status"}, Verbs: []string{"update", "patch"}},
			},
		},
		&rbacv1.ClusterRole{
			TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole"},
			ObjectMeta: metav1.ObjectMeta{Name: HubClusterRole(cluster), Labels: member},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{"cluster.open-cluster-management.io"}, Resources: []string{"managedclusters"}, Verbs: []string{"create"}},
				{APIGroups: []string{"cluster.open-cluster-management.io"}, Resources: []string{"managedclusters"}, ResourceNames: []string{cluster}, Verbs: []string{"get"}},
				{APIGroups: []string{"cluster.open-cluster-management.io"}, Resources: []string{"managedclusters/status"}, ResourceNames: []string{cluster}, Verbs: []string{"get", "update", "patch"}},
			},
		},
		&rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: HubClusterRole(cluster), Labels: member},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: HubClusterRole(cluster)},
			Subjects:   subjects,
		},
		&rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "RoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ctrlmeshv1alpha1.ClusterNamespace(cluster), Name: ExecutionRoleBinding, Labels: member},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: HeartbeatClusterRole},
			Subjects:   subjects,
		},
		&rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "RoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Namespace: names.GenerateExecutionSpaceName(cluster), Name: ExecutionRoleBinding, Labels: member},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ExecutionClusterRole},
			Subjects:   subjects,
		},
		&admissionregistrationv1.ValidatingAdmissionPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: AcceptPolicy, Labels: shared},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: ptr.To(admissionregistrationv1.Fail),
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
						Rule: admissionregistrationv1.Rule{
							APIGroups: []string{"cluster.open-cluster-management.io"}, APIVersions: []string{"*"}, Resources: []string{"managedclusters"},
						},
					},
				}}},
				Validations: []admissionregistrationv1.Validation{{
					Expression: acceptExpression,
					Message:    "setting spec.hubAcceptsClient to true needs the right to update managedclusters/accept",
					Reason:     ptr.To(metav1.StatusReasonForbidden),
				}, {
					Expression: ownNameExpression,
					Message:    "an agent registers only its own cluster: the ServiceAccount " + AgentNamespace + "/" + AgentServiceAccount("<cluster>") + " may write only the ManagedCluster <cluster>",
					Reason:     ptr.To(metav1.StatusReasonForbidden),
				}},
			},
		},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: AcceptPolicy, Labels: shared},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        AcceptPolicy,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			},
		},
	}
}

// agentHubRBACHeader heads the rendering; %[1]s is the cluster.
const agentHubRBACHeader = `# The hub RBAC for the ctrlmesh agent of one member cluster, here "%[1]s".
# Generated from membership.AgentHubRBAC("%[1]s") by
#   go test ./pkg/membership -run TestAgentHubRBACFile -update
# (a test fails when this file and the function differ); do not edit.
#
# For a new member <cluster>, the hub admin:
#   1. creates the namespaces <cluster> (the member's cluster namespace,
#      where its heartbeat Lease managed-cluster-lease lives, as in OCM; on
#      Karmada labeled namespace.karmada.io/skip-auto-propagation=true, or
#      Karmada propagates it to every member) and karmada-es-<cluster> (its
#      execution namespace, for its Works; on Karmada do not: it is
#      Karmada's, made when the member joins Karmada, so join it first) and,
#      once, the namespace ctrlmesh;
#   2. creates the ServiceAccount ctrlmesh/agent-<cluster> and gives the
#      member's agent a token of it in its hub kubeconfig;
#   3. applies this file with "%[1]s" replaced by <cluster>: the ClusterRoles
#      ctrlmesh-agent-heartbeat and ctrlmesh-agent-execution and the
#      ValidatingAdmissionPolicy (and binding)
#      ctrlmesh-managedcluster-accept, shared by all members and the same
#      every time; the ClusterRole and ClusterRoleBinding
#      ctrlmesh-agent-hub:<cluster>, and the RoleBindings ctrlmesh-agent in
#      <cluster> and in karmada-es-<cluster>;
#   4. accepts the member by setting spec.hubAcceptsClient of its
#      ManagedCluster to true; the agent applies no rules before that.
#
# The agent may get only its own ManagedCluster and write only its status.
# RBAC cannot restrict "create" to a name, so the admission policy limits
# the agent's create to the ManagedCluster of its own name; only the first
# join needs it. A hub that creates the ManagedCluster <cluster> itself
# should drop that rule. The policy also lets only users who may "update"
# managedclusters/accept (as in OCM: system:masters, or a grant of that
# virtual subresource to the admin or an auto-accept controller) set
# spec.hubAcceptsClient to true, so an agent cannot create its
# ManagedCluster already accepted.
`

// RenderAgentHubRBAC renders AgentHubRBAC(cluster) as multi-document YAML
// for kubectl apply, headed by the instructions for the hub admin.
func RenderAgentHubRBAC(cluster string) ([]byte, error) {
	return rbacutil.Render(fmt.Sprintf(agentHubRBACHeader, cluster), AgentHubRBAC(cluster))
}
