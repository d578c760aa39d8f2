package routework

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	workv1alpha2 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha2"
	"github.com/karmada-io/karmada/pkg/util/names"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/validation/path"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

func limits(groups ...ctrlmeshv1alpha1.ResourceGroup) ctrlmeshv1alpha1.Limits {
	return ctrlmeshv1alpha1.Limits{{RelateResources: groups}}
}

func TestNewLabelerRBAC(t *testing.T) {
	for _, tc := range []struct {
		name           string
		limits         ctrlmeshv1alpha1.Limits
		agentNamespace string
		rules          []rbacv1.PolicyRule // nil: no RBAC
		unexpressed    []string
	}{{
		name: "named resources, grouped by API group",
		limits: append(limits(ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{"apps", ""}, Resources: []string{"deployments", "configmaps"}}),
			limits(ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{""}, Resources: []string{"secrets", "configmaps"}})...),
		agentNamespace: "ctrlmesh",
		rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps", "deployments", "secrets"}, Verbs: []string{"list", "patch", "watch"}},
			{APIGroups: []string{"apps"}, Resources: []string{"configmaps", "deployments"}, Verbs: []string{"list", "patch", "watch"}},
		},
	}, {
		name: "wildcards and subresources are left out and reported",
		limits: limits(ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{"*"}, Resources: []string{"configmaps"}},
			ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{""}, Resources: []string{"*", "pods/exec", "pods"}}),
		agentNamespace: "ctrlmesh",
		rules:          []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "patch", "watch"}}},
		unexpressed:    []string{"*/configmaps", "/*", "/pods/exec"},
	}, {
		name:           "only wildcards: nothing to grant",
		limits:         limits(ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{"*"}, Resources: []string{"*"}}),
		agentNamespace: "ctrlmesh",
		unexpressed:    []string{"*/*"},
	}, {
		name:   "no agent namespace claimed: nothing to bind",
		limits: limits(ctrlmeshv1alpha1.ResourceGroup{APIGroups: []string{""}, Resources: []string{"configmaps"}}),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rbac, unexpressed := NewLabelerRBAC("team-a", "op", tc.limits, tc.agentNamespace)
			want := tc.unexpressed
			if want != nil {
				want = slices.Sorted(slices.Values(want))
			}
			if !reflect.DeepEqual(unexpressed, want) {
				t.Errorf("unexpressed %q, want %q", unexpressed, want)
			}
			if tc.rules == nil {
				if rbac != nil {
					t.Fatalf("RBAC %+v, want none", rbac)
				}
				return
			}
			if rbac == nil {
				t.Fatal("no RBAC")
			}
			if err := rbac.Check(); err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(rbac.Role.Rules, tc.rules) {
				t.Errorf("rules %+v, want %+v", rbac.Role.Rules, tc.rules)
			}
			wantName := "ctrlmesh-labeler-team-a.op"
			if rbac.Role.Name != wantName || rbac.Binding.Name != wantName || rbac.Binding.RoleRef.Name != wantName {
				t.Errorf("names %q, %q, roleRef %q; want %q", rbac.Role.Name, rbac.Binding.Name, rbac.Binding.RoleRef.Name, wantName)
			}
			if s := rbac.Binding.Subjects; len(s) != 1 || s[0] != (rbacv1.Subject{Kind: "ServiceAccount", Namespace: tc.agentNamespace, Name: "ctrlmesh-agent"}) {
				t.Errorf("subjects %+v", s)
			}
		})
	}
}

// The longest namespace and ShardingConfig name still make a valid RBAC
// object name, and distinct configs never share one.
func TestLabelerRBACName(t *testing.T) {
	longest := ctrlmeshv1alpha1.LabelerRBACName(strings.Repeat("n", 63), strings.Repeat("c", 63))
	if errs := path.IsValidPathSegmentName(longest); len(errs) > 0 || len(longest) > 253 {
		t.Errorf("%q (%d characters): %v", longest, len(longest), errs)
	}
	if a, b := ctrlmeshv1alpha1.LabelerRBACName("a-b", "c"), ctrlmeshv1alpha1.LabelerRBACName("a", "b-c"); a == b {
		t.Errorf("two configs share %q", a)
	}
}

// What the hub encodes with labeler RBAC, the member decodes; any change
// that would grant more is refused.
func TestDecodeAllLabelerRBAC(t *testing.T) {
	route := testRoute()
	good, _ := NewLabelerRBAC(route.Namespace, route.Name, route.Spec.Limits, "ctrlmesh")
	encode := func(rbac *LabelerRBAC) *workv1alpha1.Work {
		work := NewWork(WorkKey("m1", route.Namespace, route.Name))
		if err := SetManifests(work, route, rbac); err != nil {
			t.Fatal(err)
		}
		return work
	}
	m, err := DecodeAll(encode(good))
	if err != nil {
		t.Fatal(err)
	}
	if m.Labeler == nil || !equality.Semantic.DeepEqual(m.Labeler.Role.Rules, good.Role.Rules) || !equality.Semantic.DeepEqual(m.Labeler.Binding.Subjects, good.Binding.Subjects) {
		t.Fatalf("decoded %+v, want %+v", m.Labeler, good)
	}
	if m.Route.Name != route.Name {
		t.Errorf("route %s", m.Route.Name)
	}
	if targets, want := Targets(encode(good)), []string{"ShardRoute/team-a/op", "ClusterRole//" + good.Role.Name, "ClusterRoleBinding//" + good.Role.Name}; !reflect.DeepEqual(targets, want) {
		t.Errorf("targets %v, want %v", targets, want)
	}

	for _, tc := range []struct {
		name   string
		mutate func(*LabelerRBAC)
		want   string
	}{
		{"a wildcard resource", func(r *LabelerRBAC) { r.Role.Rules[0].Resources = []string{"*"} }, `resource "*"`},
		{"a wildcard group", func(r *LabelerRBAC) { r.Role.Rules[0].APIGroups = []string{"*"} }, `API group "*"`},
		{"a subresource", func(r *LabelerRBAC) { r.Role.Rules[0].Resources = []string{"pods/exec"} }, `resource "pods/exec"`},
		{"another verb", func(r *LabelerRBAC) { r.Role.Rules[0].Verbs = []string{"get", "list", "patch", "watch"} }, "verbs"},
		{"resourceNames", func(r *LabelerRBAC) { r.Role.Rules[0].ResourceNames = []string{"x"} }, "name no objects"},
		{"a non-resource URL", func(r *LabelerRBAC) { r.Role.Rules[0].NonResourceURLs = []string{"/metrics"} }, "non-resource"},
		{"aggregation", func(r *LabelerRBAC) { r.Role.AggregationRule = &rbacv1.AggregationRule{} }, "aggregationRule"},
		{"another name", func(r *LabelerRBAC) { r.Role.Name, r.Binding.Name, r.Binding.RoleRef.Name = "admin", "admin", "admin" }, "starts with"},
		{"a binding of another role", func(r *LabelerRBAC) { r.Binding.RoleRef.Name = "cluster-admin" }, "binds it"},
		{"another subject", func(r *LabelerRBAC) { r.Binding.Subjects[0].Name = "default" }, "one subject"},
		{"two subjects", func(r *LabelerRBAC) { r.Binding.Subjects = append(r.Binding.Subjects, r.Binding.Subjects[0]) }, "one subject"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := &LabelerRBAC{Role: good.Role.DeepCopy(), Binding: good.Binding.DeepCopy()}
			tc.mutate(bad)
			if err := SetManifests(NewWork(WorkKey("m1", "a", "b")), route, bad); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("SetManifests: %v, want an error containing %q", err, tc.want)
			}
			// A Work written by someone else than the hub's Writer.
			work := encode(nil)
			for _, obj := range []runtime.Object{bad.Role, bad.Binding} {
				raw, err := json.Marshal(obj)
				if err != nil {
					t.Fatal(err)
				}
				work.Spec.Workload.Manifests = append(work.Spec.Workload.Manifests, workv1alpha1.Manifest{RawExtension: runtime.RawExtension{Raw: raw}})
			}
			if _, err := DecodeAll(work); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("DecodeAll: %v, want an error containing %q", err, tc.want)
			}
		})
	}

	for _, tc := range []struct {
		name   string
		mutate func(*workv1alpha1.Work)
		want   string
	}{
		{"two manifests", func(w *workv1alpha1.Work) { w.Spec.Workload.Manifests = w.Spec.Workload.Manifests[:2] }, "has 2 manifests"},
		{"the role and binding swapped", func(w *workv1alpha1.Work) {
			m := w.Spec.Workload.Manifests
			m[1], m[2] = m[2], m[1]
		}, `manifest 1 is a "ClusterRoleBinding"`},
		{"the route not first", func(w *workv1alpha1.Work) {
			m := w.Spec.Workload.Manifests
			m[0], m[1] = m[1], m[0]
		}, `manifest 0 is a "ClusterRole"`},
		{"an unknown field in the role", func(w *workv1alpha1.Work) {
			w.Spec.Workload.Manifests[1].Raw = []byte(strings.Replace(string(w.Spec.Workload.Manifests[1].Raw), `"rules"`, `"extra":1,"rules"`, 1))
		}, `unknown field "extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			work := encode(good)
			tc.mutate(work)
			if _, err := DecodeAll(work); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("DecodeAll: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// The statuses Karmada reports of the labeler's RBAC (manifests 1 and 2)
// read with the route's.
func TestReadStatusWithLabelerRBAC(t *testing.T) {
	route := testRoute()
	work := &workv1alpha1.Work{}
	work.Namespace, work.Name = names.GenerateExecutionSpaceName("m1"), "w"
	work.Status.ManifestStatuses = []workv1alpha1.ManifestStatus{
		{Identifier: workv1alpha1.ResourceIdentifier{Ordinal: 2, Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding", Name: "ctrlmesh-labeler-team-a.op"}},
		ManifestStatus(route),
		{Identifier: workv1alpha1.ResourceIdentifier{Ordinal: 1, Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole", Name: "ctrlmesh-labeler-team-a.op"}},
	}
	if _, err := ReadStatus(work); err != nil {
		t.Fatal(err)
	}
}

// Only the route's manifest names its Work: Karmada's work-status
// controller keeps the status of the last object it reflected as the
// Work's only manifest status, so a named labeler ClusterRole would replace
// the route's status in the Work (TestKarmadaJoin shows it on a real
// Karmada). The RBAC keeps Karmada's labels, by which it applies and
// deletes them, and the records of the keys it manages.
func TestSetManifestsNamesTheWorkOnTheRouteOnly(t *testing.T) {
	route := testRoute()
	rbac, _ := NewLabelerRBAC(route.Namespace, route.Name, route.Spec.Limits, "ctrlmesh")
	work := NewWork(WorkKey("m1", route.Namespace, route.Name))
	if err := SetManifests(work, route, rbac); err != nil {
		t.Fatal(err)
	}
	wantLabels := AppliedLabels(work)
	for i, m := range work.Spec.Workload.Manifests {
		var obj struct {
			Kind     string
			Metadata struct{ Labels, Annotations map[string]string }
		}
		if err := json.Unmarshal(m.Raw, &obj); err != nil {
			t.Fatal(err)
		}
		from, managed := AppliedFrom(&metav1.ObjectMeta{Labels: obj.Metadata.Labels, Annotations: obj.Metadata.Annotations})
		if !managed || !equality.Semantic.DeepEqual(obj.Metadata.Labels, merged(obj.Metadata.Labels, wantLabels)) {
			t.Errorf("manifest %d (%s): labels %v, want Karmada's %v", i, obj.Kind, obj.Metadata.Labels, wantLabels)
		}
		managedKeys := obj.Metadata.Annotations[workv1alpha2.ManagedAnnotation]
		if i == 0 {
			if from != client.ObjectKeyFromObject(work) || !strings.Contains(managedKeys, workv1alpha2.WorkNameAnnotation) {
				t.Errorf("the route's manifest names Work %v (managed annotations %q), want %s/%s", from, managedKeys, work.Namespace, work.Name)
			}
			continue
		}
		if from.Name != "" || from.Namespace != "" || strings.Contains(managedKeys, workv1alpha2.WorkNameAnnotation) {
			t.Errorf("manifest %d (%s) names Work %v (managed annotations %q), want none", i, obj.Kind, from, managedKeys)
		}
		if obj.Metadata.Annotations[workv1alpha2.ManagedLabels] == "" || !strings.Contains(managedKeys, workv1alpha2.ManagedAnnotation) {
			t.Errorf("manifest %d (%s): annotations %v, want the records of the managed keys", i, obj.Kind, obj.Metadata.Annotations)
		}
	}
}
