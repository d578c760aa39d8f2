package agent

import (
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	"github.com/ctrlmesh/ctrlmesh/agent/labeler"
	"github.com/ctrlmesh/ctrlmesh/agent/routestatus"
	"github.com/ctrlmesh/ctrlmesh/agent/workapply"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/rbacutil"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

// Names of the agent's member RBAC.
const (
	// ServiceAccount is the agent's ServiceAccount in its namespace.
	ServiceAccount = ctrlmeshv1alpha1.AgentServiceAccount
	// MemberClusterRole is the agent's ClusterRole in the member cluster.
	MemberClusterRole = "ctrlmesh-agent"
	// LeaderElectionRole lets the agent's replicas elect their leader in the
	// agent's namespace.
	LeaderElectionRole = "ctrlmesh-agent-leader-election"
	// LabelerRBACPolicy is the ValidatingAdmissionPolicy, and its binding,
	// that keeps the agent's writes of ClusterRoles and ClusterRoleBindings
	// to labeler RBAC (see labelerRBACValidations).
	LabelerRBACPolicy = "ctrlmesh-agent-labeler-rbac"
)

// MemberRBACRules are the agent's standing rights in its member cluster,
// cluster-wide: those of the status controller, the injection webhook and the
// Work applier, plus
//   - the labeler's list of namespaces. Its rights on the objects it labels
//     are not here: they come per ShardingConfig, with its Work, on exactly
//     the resources its limits name (routework.NewLabelerRBAC), and the
//     labeler reports the resources it lacks them for;
//   - the webhook configurations the elected agent writes for labeling (from
//     the ShardRoutes) and injection, and watches to restore them. RBAC
//     cannot restrict create to names.
//
// No rule has a wildcard (a test checks every rendered ctrlmesh RBAC).
func MemberRBACRules() []rbacv1.PolicyRule {
	return rbacutil.Merge(routestatus.MemberRBACRules(), inject.MemberRBACRules(), workapply.MemberRBACRules(), []rbacv1.PolicyRule{
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

// labelerRBACValidations are the rules LabelerRBACPolicy holds the agent's
// writes of ClusterRoles and ClusterRoleBindings to, in the API server: the
// Work applier's escalate and bind cannot be limited to names by RBAC, so
// that a stolen agent token could otherwise grant anything. They repeat, in
// CEL, what routework.LabelerRBAC.Check holds every Work to: a labeler name;
// a role of list, watch and patch on named resources of named groups (no
// wildcard, subresource, resourceNames, non-resource URL or aggregation); a
// binding of the role of its own name to the agent's ServiceAccount only.
// Deletes are limited to labeler names.
func labelerRBACValidations(namespace string) []admissionregistrationv1.Validation {
	forbidden := ptr.To(metav1.StatusReasonForbidden)
	verbs := "['" + strings.Join(routework.LabelerVerbs, "', '") + "']"
	return []admissionregistrationv1.Validation{{
		Expression: fmt.Sprintf("(request.operation == 'DELETE' ? oldObject : object).metadata.name.startsWith('%s')", ctrlmeshv1alpha1.LabelerRBACPrefix),
		Message:    "the ctrlmesh agent writes only ClusterRoles and ClusterRoleBindings named " + ctrlmeshv1alpha1.LabelerRBACPrefix + "*",
		Reason:     forbidden,
	}, {
		Expression: `request.operation == 'DELETE' || request.kind.kind != 'ClusterRole' || (!has(object.aggregationRule) && has(object.rules) && size(object.rules) > 0 &&
object.rules.all(r, (!has(r.nonResourceURLs) || size(r.nonResourceURLs) == 0) && (!has(r.resourceNames) || size(r.resourceNames) == 0) &&
  has(r.apiGroups) && size(r.apiGroups) > 0 && r.apiGroups.all(g, g != '*') &&
  has(r.resources) && size(r.resources) > 0 && r.resources.all(x, x != '*' && !x.contains('/')) &&
  r.verbs.all(v, v in ` + verbs + `)))`,
		Message: "a labeler ClusterRole grants only " + strings.Join(routework.LabelerVerbs, ", ") +
			" on named resources of named API groups: no wildcard, subresource, resourceNames, non-resource URL or aggregationRule",
		Reason: forbidden,
	}, {
		Expression: fmt.Sprintf(`request.operation == 'DELETE' || request.kind.kind != 'ClusterRoleBinding' || (object.roleRef.kind == 'ClusterRole' && object.roleRef.name == object.metadata.name &&
has(object.subjects) && size(object.subjects) == 1 && object.subjects[0].kind == 'ServiceAccount' &&
object.subjects[0].name == '%s' && has(object.subjects[0].namespace) && object.subjects[0].namespace == '%s')`, ServiceAccount, namespace),
		Message: fmt.Sprintf("a labeler ClusterRoleBinding binds the ClusterRole of its own name to the ServiceAccount %s/%s only", namespace, ServiceAccount),
		Reason:  forbidden,
	}}
}

// labelerRBACPolicy is LabelerRBACPolicy and its binding for the agent's
// ServiceAccount in namespace. failurePolicy Fail: a policy the API server
// cannot evaluate refuses the write.
func labelerRBACPolicy(namespace string, labels map[string]string) []client.Object {
	user := serviceaccount.MakeUsername(namespace, ServiceAccount)
	return []client.Object{
		&admissionregistrationv1.ValidatingAdmissionPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: LabelerRBACPolicy, Labels: labels},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: ptr.To(admissionregistrationv1.Fail),
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
						Rule: admissionregistrationv1.Rule{
							APIGroups: []string{rbacv1.GroupName}, APIVersions: []string{"v1"}, Resources: []string{"clusterroles", "clusterrolebindings"},
						},
					},
				}}},
				MatchConditions: []admissionregistrationv1.MatchCondition{{
					Name: "agent", Expression: fmt.Sprintf("request.userInfo.username == '%s'", user),
				}},
				Validations: labelerRBACValidations(namespace),
			},
		},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: LabelerRBACPolicy, Labels: labels},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        LabelerRBACPolicy,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			},
		},
	}
}

// MemberRBAC is the agent's RBAC in its member cluster, for the agent's
// ServiceAccount in namespace: the ClusterRole MemberClusterRole and its
// binding, the Role, RoleBinding and FlowSchema LeaderElectionRole of its leader election (rbacutil.LeaderElection), and
// the ValidatingAdmissionPolicy LabelerRBACPolicy and its binding.
func MemberRBAC(namespace string) []client.Object {
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: ServiceAccount}}
	labels := map[string]string{"app.kubernetes.io/part-of": "ctrlmesh"}
	return slices.Concat(
		rbacutil.BoundClusterRole(MemberClusterRole, labels, MemberRBACRules(), subjects),
		rbacutil.LeaderElection(namespace, LeaderElectionRole, LeaderElectionID, labels, subjects),
		labelerRBACPolicy(namespace, labels),
	)
}

// memberRBACHeader heads the rendering; %[1]s is the namespace.
const memberRBACHeader = `# The member-cluster RBAC of the ctrlmesh agent, for its ServiceAccount
# %[1]s/ctrlmesh-agent, with the FlowSchema that puts its leader election's
# Lease requests at the leader-election priority level. Generated from
# agent.MemberRBAC("%[1]s") by
#   go test ./agent -run TestMemberRBACFile -update
# (a test fails when this file and the function differ); do not edit.
# Its hub credentials are in agent-hub.yaml.
`

// RenderMemberRBAC renders MemberRBAC(namespace) as multi-document YAML.
func RenderMemberRBAC(namespace string) ([]byte, error) {
	return rbacutil.Render(fmt.Sprintf(memberRBACHeader, namespace), MemberRBAC(namespace))
}
