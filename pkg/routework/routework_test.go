package routework

import (
	"encoding/json"
	"strings"
	"testing"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	workv1alpha2 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha2"
	"github.com/karmada-io/karmada/pkg/util/names"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// testRoute is a ShardRoute as the hub builds it.
func testRoute() *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: "ctrlmesh.io/v1alpha1", Kind: "ShardRoute"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "op"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: "m1", RoutingGeneration: 3, RulesHash: "hash-3", Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 8,
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}},
			}}},
			Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: "0-7", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-0", Address: "10.0.0.1"}}}},
		},
	}
}

// TestSetManifest: what the hub encodes, the member decodes, with Karmada's
// label and annotations on it.
func TestSetManifest(t *testing.T) {
	route := testRoute()
	work := NewWork(WorkKey("m1", route.Namespace, route.Name))
	if work.Namespace != "karmada-es-m1" || work.Name != names.GenerateWorkName("ShardRoute", route.Name, route.Namespace) || work.Labels[workv1alpha2.WorkPermanentIDLabel] == "" {
		t.Errorf("new Work %s/%s with labels %v, want Karmada's Work name in karmada-es-m1 and a permanent ID", work.Namespace, work.Name, work.Labels)
	}
	if err := SetManifests(work, route, nil); err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(work.Spec.Workload.Manifests[0].Raw, &fields); err != nil {
		t.Fatal(err)
	}
	if _, ok := fields["status"]; ok {
		t.Errorf("the manifest has a status: %s", work.Spec.Workload.Manifests[0].Raw)
	}
	got, err := Decode(work)
	if err != nil {
		t.Fatal(err)
	}
	if got.GroupVersionKind() != ctrlmeshv1alpha1.ShardRouteGVK || got.Namespace != route.Namespace || got.Name != route.Name || !equality.Semantic.DeepEqual(got.Spec, route.Spec) {
		t.Errorf("decoded %+v, want %+v", got, route)
	}
	if want := AppliedLabels(work); !equality.Semantic.DeepEqual(got.Labels, want) {
		t.Errorf("manifest labels %v, want %v", got.Labels, want)
	}
	applied, managed := AppliedFrom(got)
	if !managed || applied.Namespace != work.Namespace || applied.Name != work.Name {
		t.Errorf("the manifest is applied from %v (managed %v), want Work %s/%s", applied, managed, work.Namespace, work.Name)
	}
	if targets := Targets(work); len(targets) != 1 || targets[0] != "ShardRoute/team-a/op" {
		t.Errorf("targets %v, want [ShardRoute/team-a/op]", targets)
	}
}

// TestManifestStatusReadsBack: what the member side reflects of an applied
// ShardRoute, the hub reads back.
func TestManifestStatusReadsBack(t *testing.T) {
	route := testRoute()
	route.Generation = 2
	for _, tc := range []struct {
		name   string
		status ctrlmeshv1alpha1.ShardRouteStatus
		health workv1alpha1.ResourceHealth
	}{
		{"no status yet", ctrlmeshv1alpha1.ShardRouteStatus{}, workv1alpha1.ResourceUnknown},
		{"an older generation", ctrlmeshv1alpha1.ShardRouteStatus{ObservedGeneration: 1, Conditions: conditions(metav1.ConditionTrue, metav1.ConditionTrue)}, workv1alpha1.ResourceUnknown},
		{"applied and enforced", ctrlmeshv1alpha1.ShardRouteStatus{ObservedGeneration: 2, Conditions: conditions(metav1.ConditionTrue, metav1.ConditionTrue),
			Pods: []ctrlmeshv1alpha1.PodRouteStatus{{Name: "op-0", Ready: true, AppliedRulesHash: "hash-3"}}}, workv1alpha1.ResourceHealthy},
		{"proxies lagging", ctrlmeshv1alpha1.ShardRouteStatus{ObservedGeneration: 2, Conditions: conditions(metav1.ConditionTrue, metav1.ConditionFalse)}, workv1alpha1.ResourceUnhealthy},
		{"refused", ctrlmeshv1alpha1.ShardRouteStatus{ObservedGeneration: 2, Conditions: conditions(metav1.ConditionFalse, metav1.ConditionTrue)}, workv1alpha1.ResourceUnhealthy},
		{"proxies unreported", ctrlmeshv1alpha1.ShardRouteStatus{ObservedGeneration: 2, Conditions: conditions(metav1.ConditionTrue, "")}, workv1alpha1.ResourceUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			route.Status = tc.status
			ms := ManifestStatus(route)
			if (ms.Status == nil) != equality.Semantic.DeepEqual(tc.status, ctrlmeshv1alpha1.ShardRouteStatus{}) {
				t.Errorf("raw status %v for status %+v", ms.Status, tc.status)
			}
			work := &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: names.GenerateExecutionSpaceName("m1"), Name: "w"}}
			work.Status.ManifestStatuses = []workv1alpha1.ManifestStatus{ms}
			report, err := ReadStatus(work)
			if err != nil {
				t.Fatal(err)
			}
			if report.Cluster != "m1" || report.Health != tc.health || !equality.Semantic.DeepEqual(report.Route, tc.status) {
				t.Errorf("report %+v, want cluster m1, health %s and status %+v", report, tc.health, tc.status)
			}

			// Decoded in place, as the hub's cache holds it: read the
			// same, encoded the same, and copied whole.
			raw, err := json.Marshal(work.Status)
			if err != nil {
				t.Fatal(err)
			}
			decoded := work.DeepCopy()
			if got := DecodeStatus(decoded); (got == nil) != (ms.Status == nil) {
				t.Fatalf("DecodeStatus = %+v for raw status %v", got, ms.Status)
			}
			if ms.Status != nil && (decoded.Status.ManifestStatuses[0].Status.Raw != nil || decoded.Status.ManifestStatuses[0].Status.Object == nil) {
				t.Errorf("decoded in place: %+v, want no raw status and the decoded one", decoded.Status.ManifestStatuses[0].Status)
			}
			// Decoded again (the hub's cache decodes as a Work arrives,
			// and its transform decodes again): the same status, as held.
			if ms.Status != nil {
				held := decoded.Status.ManifestStatuses[0].Status.Object
				if again := DecodeStatus(decoded); again == nil || runtime.Object(again) != held {
					t.Errorf("DecodeStatus of a decoded status = %p, want the one held, %p", again, held)
				}
			}
			for name, w := range map[string]*workv1alpha1.Work{"decoded": decoded, "its copy": decoded.DeepCopy()} {
				again, err := ReadStatus(w)
				if err != nil || !equality.Semantic.DeepEqual(again, report) {
					t.Errorf("%s: ReadStatus = %+v, %v; want %+v as from the raw status", name, again, err, report)
				}
				if encoded, err := json.Marshal(w.Status); err != nil || string(encoded) != string(raw) {
					t.Errorf("%s: encoded %s, %v; want %s", name, encoded, err, raw)
				}
			}
		})
	}
}

// conditions are RulesApplied and ProxiesReady of the given statuses; ""
// leaves one out.
func conditions(rules, proxies metav1.ConditionStatus) []metav1.Condition {
	var out []metav1.Condition
	now := metav1.NewTime(metav1.Now().Rfc3339Copy().Time)
	if rules != "" {
		out = append(out, metav1.Condition{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: rules, Reason: "R", LastTransitionTime: now})
	}
	if proxies != "" {
		out = append(out, metav1.Condition{Type: ctrlmeshv1alpha1.ConditionProxiesReady, Status: proxies, Reason: "P", LastTransitionTime: now})
	}
	return out
}

func TestDecode(t *testing.T) {
	route := testRoute()
	raw, err := json.Marshal(route)
	if err != nil {
		t.Fatal(err)
	}
	work := func(manifests ...[]byte) *workv1alpha1.Work {
		w := &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: "karmada-es-m1", Name: "w"}}
		for _, m := range manifests {
			w.Spec.Workload.Manifests = append(w.Spec.Workload.Manifests, workv1alpha1.Manifest{RawExtension: runtime.RawExtension{Raw: m}})
		}
		return w
	}
	got, err := Decode(work(raw))
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got.Spec, route.Spec) {
		t.Errorf("decoded spec %+v, want %+v", got.Spec, route.Spec)
	}
	for _, tc := range []struct {
		name string
		work *workv1alpha1.Work
		want string
	}{
		{"no manifest", work(), "the Work has 0 manifests"},
		{"two manifests", work(raw, raw), "the Work has 2 manifests"},
		{"another kind", work([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`)), `manifest 0 is a "ConfigMap" of "v1"`},
		{"unknown field", work([]byte(`{"apiVersion":"ctrlmesh.io/v1alpha1","kind":"ShardRoute","spec":{"bucketz":32}}`)), `unknown field "spec.bucketz"`},
		{"duplicate field", work([]byte(`{"apiVersion":"ctrlmesh.io/v1alpha1","kind":"ShardRoute","metadata":{"namespace":"a","name":"b"},"spec":{"buckets":8,"buckets":16}}`)), `duplicate field "spec.buckets"`},
		{"undecodable", work([]byte(`{"apiVersion":"ctrlmesh.io/v1alpha1","kind":"ShardRoute","spec":{"buckets":"eight"}}`)), "manifest 0 is not a valid ShardRoute: json: cannot unmarshal string"},
		{"no JSON", work([]byte(`{`)), "manifest 0 is not a Kubernetes object"},
		{"no namespace", work([]byte(`{"apiVersion":"ctrlmesh.io/v1alpha1","kind":"ShardRoute","metadata":{"name":"b"}}`)), "needs both metadata.namespace and metadata.name"},
	} {
		if got, err := Decode(tc.work); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Decode = %v, %v; want an error containing %q", tc.name, got, err, tc.want)
		}
	}
}

func TestReadStatusRefusesMalformed(t *testing.T) {
	status := func(health workv1alpha1.ResourceHealth, raw string, mutate ...func(*workv1alpha1.ManifestStatus)) []workv1alpha1.ManifestStatus {
		ms := workv1alpha1.ManifestStatus{
			Identifier: workv1alpha1.ResourceIdentifier{Group: "ctrlmesh.io", Version: "v1alpha1", Kind: "ShardRoute", Resource: "shardroutes", Namespace: "team-a", Name: "op"},
			Health:     health,
		}
		if raw != "" {
			ms.Status = &runtime.RawExtension{Raw: []byte(raw)}
		}
		for _, m := range mutate {
			m(&ms)
		}
		return []workv1alpha1.ManifestStatus{ms}
	}
	for _, tc := range []struct {
		name      string
		namespace string
		statuses  []workv1alpha1.ManifestStatus
		want      string
	}{{
		name: "not in an execution namespace", namespace: "default",
		want: "is not in an execution namespace",
	}, {
		name: "two ShardRoutes", statuses: append(status(workv1alpha1.ResourceHealthy, ""), status(workv1alpha1.ResourceHealthy, "")...),
		want: `reports manifest 0, a "ShardRoute"`,
	}, {
		name: "a ClusterRole as manifest 0", statuses: status(workv1alpha1.ResourceHealthy, "", func(ms *workv1alpha1.ManifestStatus) {
			ms.Identifier.Kind, ms.Identifier.Group = "ClusterRole", "rbac.authorization.k8s.io"
		}),
		want: `reports manifest 0, a "ClusterRole"`,
	}, {
		name: "another kind", statuses: status(workv1alpha1.ResourceHealthy, "", func(ms *workv1alpha1.ManifestStatus) { ms.Identifier.Kind = "ConfigMap"; ms.Identifier.Group = "" }),
		want: `a "ConfigMap" of group ""`,
	}, {
		name: "an unknown health", statuses: status("Fine", ""),
		want: `reports health "Fine"`,
	}, {
		name: "a status that is no JSON", statuses: status(workv1alpha1.ResourceHealthy, "{"),
		want: "is not a ShardRoute status",
	}, {
		name: "a status of the wrong shape", statuses: status(workv1alpha1.ResourceHealthy, `{"pods":"op-0"}`),
		want: "is not a ShardRoute status",
	}, {
		name: "a decoded status of another type", statuses: status(workv1alpha1.ResourceHealthy, "", func(ms *workv1alpha1.ManifestStatus) {
			ms.Status = &runtime.RawExtension{Object: &ctrlmeshv1alpha1.ShardRoute{}}
		}),
		want: "holds a *v1alpha1.ShardRoute, not a decoded ShardRoute status",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			work := &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: names.GenerateExecutionSpaceName("m1"), Name: "w"}}
			if tc.namespace != "" {
				work.Namespace = tc.namespace
			}
			work.Status.ManifestStatuses = tc.statuses
			if r, err := ReadStatus(work); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadStatus = %+v, %v; want an error containing %q", r, err, tc.want)
			}
			// A status the hub's cache cannot decode stays raw, and reads
			// as malformed all the same.
			DecodeStatus(work)
			if r, err := ReadStatus(work); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("after DecodeStatus, ReadStatus = %+v, %v; want an error containing %q", r, err, tc.want)
			}
		})
	}
}

func TestReadStatusBeforeReports(t *testing.T) {
	work := &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: names.GenerateExecutionSpaceName("m1"), Name: "w", Generation: 2}}
	r, err := ReadStatus(work)
	if err != nil {
		t.Fatal(err)
	}
	if r.Cluster != "m1" || r.Applied != nil || r.Current || r.Health != workv1alpha1.ResourceUnknown || !equality.Semantic.DeepEqual(r.Route, ctrlmeshv1alpha1.ShardRouteStatus{}) {
		t.Errorf("report of an unreported Work: %+v", r)
	}

	// Applied for the previous generation, with a newer agent's unknown field.
	work.Status.Conditions = []metav1.Condition{{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: "AppliedSuccessful", ObservedGeneration: 1}}
	work.Status.ManifestStatuses = []workv1alpha1.ManifestStatus{{
		Identifier: workv1alpha1.ResourceIdentifier{Group: "ctrlmesh.io", Version: "v1alpha1", Kind: "ShardRoute", Namespace: "team-a", Name: "op"},
		Health:     workv1alpha1.ResourceHealthy,
		Status:     &runtime.RawExtension{Raw: []byte(`{"observedRoutingGeneration":1,"leaders":[{"shard":"0","pod":"op-0"}],"future":true}`)},
	}}
	r, err = ReadStatus(work)
	if err != nil {
		t.Fatal(err)
	}
	want := ctrlmeshv1alpha1.ShardRouteStatus{ObservedRoutingGeneration: 1, Leaders: []ctrlmeshv1alpha1.ShardLeader{{Shard: "0", Pod: "op-0"}}}
	if r.Applied == nil || r.Current || r.Health != workv1alpha1.ResourceHealthy || !equality.Semantic.DeepEqual(r.Route, want) {
		t.Errorf("report of a Work applied at an older generation: %+v", r)
	}
}
