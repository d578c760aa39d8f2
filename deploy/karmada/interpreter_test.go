// Package karmada_test checks deploy/karmada/shardroute-interpreter.yaml: its
// Lua runs in Karmada's own Lua VM and gives the Work status the shape and
// health that ctrlmesh-agent gives it in standalone mode, and the object is
// valid against Karmada's CRD.
package karmada_test

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	configv1alpha1 "github.com/karmada-io/karmada/pkg/apis/config/v1alpha1"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"github.com/karmada-io/karmada/pkg/resourceinterpreter/customized/declarative/luavm"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

const customizationFile = "shardroute-interpreter.yaml"

// loadCustomization decodes the shipped file strictly, so that a misspelt
// field fails here instead of being ignored by Karmada.
func loadCustomization(t *testing.T) *configv1alpha1.ResourceInterpreterCustomization {
	t.Helper()
	data, err := os.ReadFile(customizationFile)
	if err != nil {
		t.Fatal(err)
	}
	ric := &configv1alpha1.ResourceInterpreterCustomization{}
	if err := yaml.UnmarshalStrict(data, ric); err != nil {
		t.Fatalf("decoding %s: %v", customizationFile, err)
	}
	return ric
}

func TestCustomizationTargetsShardRoute(t *testing.T) {
	ric := loadCustomization(t)
	if got, want := ric.APIVersion+" "+ric.Kind, "config.karmada.io/v1alpha1 ResourceInterpreterCustomization"; got != want {
		t.Errorf("object is %q, want %q", got, want)
	}
	gvk := ctrlmeshv1alpha1.GroupVersion.WithKind("ShardRoute")
	if got, want := ric.Spec.Target, (configv1alpha1.CustomizationTarget{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind}); got != want {
		t.Errorf("target is %+v, want %+v", got, want)
	}
	c := ric.Spec.Customizations
	if c.HealthInterpretation == nil || c.StatusReflection == nil {
		t.Fatalf("health interpretation and status reflection are both needed, got %+v", c)
	}
	// Anything else would change how Karmada treats ShardRoutes beyond what
	// the agent does in standalone mode.
	c.HealthInterpretation, c.StatusReflection = nil, nil
	if !reflect.DeepEqual(c, configv1alpha1.CustomizationRules{}) {
		t.Errorf("customizations other than health and status: %+v", c)
	}
}

// The expectations below reproduce agent/workapply's health function
// (unexported, so not callable from here) case by case: Healthy when the
// status describes metadata.generation and RulesApplied and ProxiesReady are
// both True, Unhealthy when it describes it and either is False, Unknown
// otherwise.
var healthCases = []struct {
	name         string
	generation   int64
	status       *ctrlmeshv1alpha1.ShardRouteStatus // nil: no status field at all
	agentsHealth workv1alpha1.ResourceHealth
}{
	{"no status", 1, nil, workv1alpha1.ResourceUnknown},
	{"empty status", 1, &ctrlmeshv1alpha1.ShardRouteStatus{}, workv1alpha1.ResourceUnknown},
	{"current, both True", 3, fullStatus(3, metav1.ConditionTrue, metav1.ConditionTrue), workv1alpha1.ResourceHealthy},
	{"current, RulesApplied False", 3, fullStatus(3, metav1.ConditionFalse, metav1.ConditionTrue), workv1alpha1.ResourceUnhealthy},
	{"current, ProxiesReady False", 3, fullStatus(3, metav1.ConditionTrue, metav1.ConditionFalse), workv1alpha1.ResourceUnhealthy},
	{"current, both False", 3, fullStatus(3, metav1.ConditionFalse, metav1.ConditionFalse), workv1alpha1.ResourceUnhealthy},
	{"current, RulesApplied False, no ProxiesReady", 3, statusWith(3, cond(ctrlmeshv1alpha1.ConditionRulesApplied, metav1.ConditionFalse)), workv1alpha1.ResourceUnhealthy},
	{"current, RulesApplied True, no ProxiesReady", 3, statusWith(3, cond(ctrlmeshv1alpha1.ConditionRulesApplied, metav1.ConditionTrue)), workv1alpha1.ResourceUnknown},
	{"current, ProxiesReady Unknown", 3, fullStatus(3, metav1.ConditionTrue, metav1.ConditionUnknown), workv1alpha1.ResourceUnknown},
	{"current, no conditions", 3, statusWith(3), workv1alpha1.ResourceUnknown},
	{"stale, both True", 4, fullStatus(3, metav1.ConditionTrue, metav1.ConditionTrue), workv1alpha1.ResourceUnknown},
	{"stale, RulesApplied False", 4, fullStatus(3, metav1.ConditionFalse, metav1.ConditionTrue), workv1alpha1.ResourceUnknown},
	{"observedGeneration ahead", 2, fullStatus(3, metav1.ConditionTrue, metav1.ConditionTrue), workv1alpha1.ResourceUnknown},
}

func TestHealthInterpretationMatchesStandalone(t *testing.T) {
	script := loadCustomization(t).Spec.Customizations.HealthInterpretation.LuaScript
	vm := newVM()
	for _, tc := range healthCases {
		t.Run(tc.name, func(t *testing.T) {
			obj := routeObject(t, tc.generation, tc.status)
			got, err := karmadaHealth(vm, script, obj)
			if got != tc.agentsHealth {
				t.Fatalf("Karmada would report %s (script error: %v), the agent reports %s", got, err, tc.agentsHealth)
			}
			// An Unknown must come from the script's own error, which
			// Karmada puts in its Warning Event, not from a broken script.
			if got == workv1alpha1.ResourceUnknown && !strings.Contains(err.Error(), "health unknown") {
				t.Errorf("Unknown for an unexpected reason: %v", err)
			}
		})
	}
}

func TestStatusReflectionIsTheWholeStatus(t *testing.T) {
	script := loadCustomization(t).Spec.Customizations.StatusReflection.LuaScript
	vm := newVM()
	for _, tc := range healthCases {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := vm.ReflectStatus(routeObject(t, tc.generation, tc.status), script)
			if err != nil {
				t.Fatalf("reflecting the status: %v", err)
			}
			checkReflected(t, raw, tc.status)
		})
	}
}

// checkReflected asserts that raw, Karmada's manifest status, is the status
// the agent would write: the same JSON value, except that where the route
// has no status the agent writes none and the Lua (which must return a
// table) gives {}; both decode to the same empty ShardRouteStatus.
func checkReflected(t *testing.T, raw *runtime.RawExtension, status *ctrlmeshv1alpha1.ShardRouteStatus) {
	t.Helper()
	if raw == nil {
		t.Fatal("no status reflected")
	}
	if status == nil || reflect.DeepEqual(*status, ctrlmeshv1alpha1.ShardRouteStatus{}) {
		if string(raw.Raw) != "{}" {
			t.Fatalf("reflected %s for a route without status, want {}", raw.Raw)
		}
	} else if want := mustJSON(t, status); !sameJSON(t, raw.Raw, want) {
		t.Fatalf("reflected\n%s\nwant the route's status\n%s", raw.Raw, want)
	}
	var decoded ctrlmeshv1alpha1.ShardRouteStatus
	if err := json.Unmarshal(raw.Raw, &decoded); err != nil {
		t.Fatalf("the reflected status does not decode as a ShardRouteStatus: %v", err)
	}
	want := ctrlmeshv1alpha1.ShardRouteStatus{}
	if status != nil {
		want = *status
	}
	// Semantic: a decoded time is in the local zone.
	if !equality.Semantic.DeepEqual(decoded, want) {
		t.Fatalf("decoded %+v, want %+v", decoded, want)
	}
}

// TestCustomizationValidAgainstCRD creates the shipped object, as it is in
// the file, against Karmada's CRD with a server-side dry run (the object is
// cluster-scoped and envtest would keep it across -count runs), and checks
// that the API server pruned nothing: a field the schema does not know
// would silently vanish.
func TestCustomizationValidAgainstCRD(t *testing.T) {
	data, err := os.ReadFile(customizationFile)
	if err != nil {
		t.Fatal(err)
	}
	sent := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &sent.Object); err != nil {
		t.Fatal(err)
	}
	created := sent.DeepCopy()
	if err := cluster.Client.Create(t.Context(), created, client.DryRunAll); err != nil {
		t.Fatalf("creating the ResourceInterpreterCustomization: %v", err)
	}
	if !reflect.DeepEqual(created.Object["spec"], sent.Object["spec"]) {
		t.Errorf("the API server changed the spec:\nsent    %v\nstored %v", sent.Object["spec"], created.Object["spec"])
	}
	if got, want := created.GetLabels(), sent.GetLabels(); !reflect.DeepEqual(got, want) {
		t.Errorf("labels %v, want %v", got, want)
	}
}

// TestInterpreterOnServedRoutes runs the scripts on a ShardRoute as a real
// API server serves it — the unstructured form Karmada's work-status
// controller reads from members — through its life: created without status,
// reported healthy, a proxy falling behind, then a new spec not yet
// reported on.
func TestInterpreterOnServedRoutes(t *testing.T) {
	ric := loadCustomization(t)
	health, status := ric.Spec.Customizations.HealthInterpretation.LuaScript, ric.Spec.Customizations.StatusReflection.LuaScript
	vm := newVM()
	ctx := t.Context()
	c := cluster.Client

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "interpreter-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	route := validRoute(ns.Name)
	if err := c.Create(ctx, route); err != nil {
		t.Fatalf("creating the ShardRoute: %v", err)
	}

	check := func(step string, want workv1alpha1.ResourceHealth) {
		t.Helper()
		served := &unstructured.Unstructured{}
		served.SetGroupVersionKind(ctrlmeshv1alpha1.GroupVersion.WithKind("ShardRoute"))
		if err := c.Get(ctx, client.ObjectKeyFromObject(route), served); err != nil {
			t.Fatal(err)
		}
		typed := &ctrlmeshv1alpha1.ShardRoute{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(served.Object, typed); err != nil {
			t.Fatal(err)
		}
		if got, err := karmadaHealth(vm, health, served); got != want {
			t.Errorf("%s: Karmada would report %s (script error: %v), want %s", step, got, err, want)
		}
		raw, err := vm.ReflectStatus(served, status)
		if err != nil {
			t.Fatalf("%s: reflecting the status: %v", step, err)
		}
		var st *ctrlmeshv1alpha1.ShardRouteStatus
		if _, ok := served.Object["status"]; ok {
			st = &typed.Status
		}
		checkReflected(t, raw, st)
		route = typed
	}

	check("created", workv1alpha1.ResourceUnknown)

	route.Status = *fullStatus(route.Generation, metav1.ConditionTrue, metav1.ConditionTrue)
	if err := c.Status().Update(ctx, route); err != nil {
		t.Fatalf("writing the status: %v", err)
	}
	check("reported healthy", workv1alpha1.ResourceHealthy)

	route.Status = *fullStatus(route.Generation, metav1.ConditionTrue, metav1.ConditionFalse)
	if err := c.Status().Update(ctx, route); err != nil {
		t.Fatalf("writing the status: %v", err)
	}
	check("a proxy behind", workv1alpha1.ResourceUnhealthy)

	route.Status = *fullStatus(route.Generation, metav1.ConditionTrue, metav1.ConditionTrue)
	if err := c.Status().Update(ctx, route); err != nil {
		t.Fatalf("writing the status: %v", err)
	}
	route.Spec.RoutingGeneration++
	route.Spec.RulesHash = "h2"
	if err := c.Update(ctx, route); err != nil {
		t.Fatalf("updating the spec: %v", err)
	}
	check("new spec, status stale", workv1alpha1.ResourceUnknown)
}

// karmadaHealth runs the health script in Karmada's Lua VM and maps the
// result as Karmada's work-status controller does
// (WorkStatusController.interpretHealth in pkg/controllers/status, v1.16,
// unexported): an error is Unknown, true Healthy, false Unhealthy.
func karmadaHealth(vm *luavm.VM, script string, obj *unstructured.Unstructured) (workv1alpha1.ResourceHealth, error) {
	healthy, err := vm.InterpretHealth(obj, script)
	switch {
	case err != nil:
		return workv1alpha1.ResourceUnknown, err
	case healthy:
		return workv1alpha1.ResourceHealthy, nil
	default:
		return workv1alpha1.ResourceUnhealthy, nil
	}
}

// newVM is a Lua VM as Karmada's configurable interpreter makes it: without
// the open libraries, so the scripts run in the same sandbox.
func newVM() *luavm.VM {
	return luavm.New(false, 1)
}

// routeObject is a ShardRoute in the unstructured form Karmada reads it in.
// A nil status leaves the field out, as the API server does for a route
// whose status was never written.
func routeObject(t *testing.T, generation int64, status *ctrlmeshv1alpha1.ShardRouteStatus) *unstructured.Unstructured {
	t.Helper()
	route := validRoute("ns")
	route.Generation = generation
	if status != nil {
		route.Status = *status
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(route)
	if err != nil {
		t.Fatal(err)
	}
	if status == nil {
		delete(obj, "status")
	}
	return &unstructured.Unstructured{Object: obj}
}

func validRoute(ns string) *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: ctrlmeshv1alpha1.GroupVersion.String(), Kind: "ShardRoute"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "op"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: "member1", RoutingGeneration: 1, RulesHash: "h1",
			Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "op"}},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}},
			}}},
			Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "s0", Buckets: "0-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-0"}}}},
		},
	}
}

// fullStatus is a status as the agent writes it, with pods and leaders, so
// that the reflection is checked on every field kind the status has.
func fullStatus(observed int64, rulesApplied, proxiesReady metav1.ConditionStatus) *ctrlmeshv1alpha1.ShardRouteStatus {
	st := statusWith(observed, cond(ctrlmeshv1alpha1.ConditionRulesApplied, rulesApplied), cond(ctrlmeshv1alpha1.ConditionProxiesReady, proxiesReady))
	st.Pods = []ctrlmeshv1alpha1.PodRouteStatus{
		{Name: "op-0", Address: "10.0.0.1", Ready: true, Shard: "s0", AppliedRulesHash: "h1"},
		{Name: "op-1", Address: "10.0.0.2", Canary: true},
	}
	st.Leaders = []ctrlmeshv1alpha1.ShardLeader{{Shard: "s0", Pod: "op-0"}}
	return st
}

func statusWith(observed int64, conditions ...metav1.Condition) *ctrlmeshv1alpha1.ShardRouteStatus {
	return &ctrlmeshv1alpha1.ShardRouteStatus{ObservedGeneration: observed, ObservedRoutingGeneration: observed, Conditions: conditions}
}

// transitionTime has whole seconds: the API server keeps no more.
var transitionTime = metav1.NewTime(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC))

func cond(typ string, status metav1.ConditionStatus) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: "Test", Message: "set by the test", LastTransitionTime: transitionTime}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// sameJSON compares JSON values, not bytes: key order may differ.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}
