// Package rbacutil assembles and renders the RBAC that ctrlmesh's
// components ship: each component states the rules its parts need, and the
// rendered manifests in deploy/rbac are generated from them.
package rbacutil

import (
	"bytes"
	"fmt"
	"slices"

	coordinationv1 "k8s.io/api/coordination/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// Merge merges the rules that name the same groups, resources and resource
// names, uniting their verbs, so that a role lists each resource once.
func Merge(in ...[]rbacv1.PolicyRule) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for _, r := range slices.Concat(in...) {
		i := slices.IndexFunc(out, func(o rbacv1.PolicyRule) bool {
			return slices.Equal(o.APIGroups, r.APIGroups) && slices.Equal(o.Resources, r.Resources) && slices.Equal(o.ResourceNames, r.ResourceNames)
		})
		if i < 0 {
			out = append(out, *r.DeepCopy())
			continue
		}
		for _, v := range r.Verbs {
			if !slices.Contains(out[i].Verbs, v) {
				out[i].Verbs = append(out[i].Verbs, v)
			}
		}
	}
	return out
}

// Render renders objects as multi-document YAML for kubectl apply, after
// header (comment lines).
func Render(header string, objects []client.Object) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(header)
	for _, obj := range objects {
		data, err := yaml.Marshal(obj)
		if err != nil {
			return nil, fmt.Errorf("rendering %T %s: %w", obj, obj.GetName(), err)
		}
		b.WriteString("---\n")
		b.Write(data)
	}
	return b.Bytes(), nil
}

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: kind}
}

// BoundClusterRole returns the ClusterRole name with rules and the
// ClusterRoleBinding of the same name that grants it to subjects.
func BoundClusterRole(name string, labels map[string]string, rules []rbacv1.PolicyRule, subjects []rbacv1.Subject) []client.Object {
	return []client.Object{
		&rbacv1.ClusterRole{TypeMeta: typeMeta("ClusterRole"), ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Rules: rules},
		&rbacv1.ClusterRoleBinding{
			TypeMeta: typeMeta("ClusterRoleBinding"), ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}, Subjects: subjects,
		},
	}
}

// LeaderElection returns the Role name and its RoleBinding in namespace that
// let subjects elect a leader with the Lease lease (controller-runtime's
// leader election creates it, then gets and updates it by name) and record
// the election's Events, and the FlowSchema name that gives their Lease
// requests in namespace the API server's leader-election priority level.
//
// Why the FlowSchema: API Priority and Fairness puts every ServiceAccount
// outside kube-system in workload-low (FlowSchema service-accounts), one
// flow per user, so a component's renewals queue behind its own writes. At
// 1000 members × 100 configs the hub's requests waited 6,400 s in all in
// that queue within three minutes, 49 of them refused for waiting too long,
// and a hub whose renewals waited past its renew deadline stepped down
// (make bench-scale). The suggested priority level leader-election, which
// kube-controller-manager's and kube-scheduler's renewals use, has seats of
// its own; precedence 200 is that of the API server's own
// workload-leader-election FlowSchema, ahead of service-accounts (9000). A
// cluster without that priority level leaves the FlowSchema dangling, and
// the API server then classifies the requests as before.
func LeaderElection(namespace, name, lease string, labels map[string]string, subjects []rbacv1.Subject) []client.Object {
	return []client.Object{
		&rbacv1.Role{
			TypeMeta: typeMeta("Role"), ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{coordinationv1.GroupName}, Resources: []string{"leases"}, Verbs: []string{"create"}},
				{APIGroups: []string{coordinationv1.GroupName}, Resources: []string{"leases"}, ResourceNames: []string{lease}, Verbs: []string{"get", "update"}},
				{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
			},
		},
		&rbacv1.RoleBinding{
			TypeMeta: typeMeta("RoleBinding"), ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subjects,
		},
		leaderElectionFlowSchema(namespace, name, labels, subjects),
	}
}

// LeaderElectionPriorityLevel is the API server's suggested priority level
// for leader elections, and LeaderElectionPrecedence the matching
// precedence of LeaderElection's FlowSchema.
const (
	LeaderElectionPriorityLevel = "leader-election"
	LeaderElectionPrecedence    = 200
)

func leaderElectionFlowSchema(namespace, name string, labels map[string]string, subjects []rbacv1.Subject) *flowcontrolv1.FlowSchema {
	var flowSubjects []flowcontrolv1.Subject
	for _, s := range subjects {
		switch s.Kind {
		case rbacv1.ServiceAccountKind:
			flowSubjects = append(flowSubjects, flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindServiceAccount,
				ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: s.Namespace, Name: s.Name}})
		case rbacv1.UserKind:
			flowSubjects = append(flowSubjects, flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: s.Name}})
		case rbacv1.GroupKind:
			flowSubjects = append(flowSubjects, flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindGroup, Group: &flowcontrolv1.GroupSubject{Name: s.Name}})
		}
	}
	return &flowcontrolv1.FlowSchema{
		TypeMeta:   metav1.TypeMeta{APIVersion: flowcontrolv1.SchemeGroupVersion.String(), Kind: "FlowSchema"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: LeaderElectionPriorityLevel},
			MatchingPrecedence:         LeaderElectionPrecedence,
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: flowSubjects,
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
					Verbs: []string{"get", "create", "update"}, APIGroups: []string{coordinationv1.GroupName},
					Resources: []string{"leases"}, Namespaces: []string{namespace},
				}},
			}},
		},
	}
}
