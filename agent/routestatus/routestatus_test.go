package routestatus_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// TestPodsAndProxyReports: the candidate pods are reported with address,
// readiness, canary or subset (a canary pod is the canary's even if a subset
// selects it too) and shard; the proxies' server-side-applied hashes land
// beside the agent's Updates and are kept; ProxiesReady follows them; gone
// pods' entries are pruned, with the field managers of their proxies.
func TestPodsAndProxyReports(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	route := newRoute(ns, "h1", 1)
	route.Spec.CanarySelector = &metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}}
	route.Spec.Subsets = []ctrlmeshv1alpha1.RouteSubset{
		{Name: "blue", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"track": "blue"}}},
		{Name: "v2", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"version": "v2"}}},
	}
	route.Spec.Shards = []ctrlmeshv1alpha1.RouteShard{
		{ID: "s0", Buckets: "0-15", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-a"}}},
		{ID: "s1", Buckets: "16-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "op-b"}}},
	}
	create(t, route)
	createPod(t, ns, "op-a", operatorLabels, "10.0.0.1", true, corev1.PodRunning)
	createPod(t, ns, "op-b", map[string]string{"app": "op", "track": "canary", "version": "v2"}, "10.0.0.2", false, corev1.PodRunning)
	createPod(t, ns, "op-c", map[string]string{"app": "op", "version": "v2"}, "10.0.0.3", true, corev1.PodRunning)
	createPod(t, ns, "other", map[string]string{"app": "other"}, "10.0.0.4", true, corev1.PodRunning)
	createPod(t, ns, "op-done", operatorLabels, "10.0.0.5", false, corev1.PodSucceeded)

	want := []ctrlmeshv1alpha1.PodRouteStatus{
		{Name: "op-a", Address: "10.0.0.1", Ready: true, Shard: "s0"},
		{Name: "op-b", Address: "10.0.0.2", Canary: true, Shard: "s1"},
		{Name: "op-c", Address: "10.0.0.3", Ready: true, Subset: "v2"},
	}
	// A pod is created before its status is written: the status may show
	// it without its address or readiness first.
	got := waitFor(t, route, "the candidate pods, pending proxies", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return fmt.Sprint(r.Status.Pods) == fmt.Sprint(want) && hasCondition(r, ctrlmeshv1alpha1.ConditionProxiesReady, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonProxiesPending)
	})
	if got.Status.ObservedGeneration != got.Generation || got.Status.ObservedRoutingGeneration != 1 {
		t.Fatalf("observed generations %d/%d, want %d/1", got.Status.ObservedGeneration, got.Status.ObservedRoutingGeneration, got.Generation)
	}
	if !hasCondition(got, ctrlmeshv1alpha1.ConditionRulesApplied, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonRulesValid) {
		t.Fatalf("conditions %+v, want RulesApplied True", got.Status.Conditions)
	}
	if msg := condition(got, ctrlmeshv1alpha1.ConditionProxiesReady).Message; !strings.Contains(msg, "3 of 3") || !strings.Contains(msg, "op-c (reports nothing)") {
		t.Fatalf("ProxiesReady message %q names not all lagging pods", msg)
	}

	// op-a and op-b run the real proxy; op-c's reports are applied by hand,
	// as source.go does but without forcing: the agent's writes must leave
	// the proxies nothing to conflict with.
	runProxy(t, route, "op-a")
	stopB := runProxy(t, route, "op-b")
	if err := report(ctx, route, "op-c", "h1"); err != nil {
		t.Fatalf("op-c's report: %v", err)
	}
	waitFor(t, route, "ProxiesReady", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return hasCondition(r, ctrlmeshv1alpha1.ConditionProxiesReady, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonProxiesApplied)
	})

	// New rules: op-c lags and is named; its later report lands unforced.
	updateSpec(t, route, func(r *ctrlmeshv1alpha1.ShardRoute) { r.Spec.RulesHash, r.Spec.RoutingGeneration = "h2", 2 })
	// The proxies' reports land before the agent's next status, so the
	// message is waited for, not read at the first h2 report.
	waitFor(t, route, "op-c named as lagging", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return r.Status.ObservedRoutingGeneration == 2 && hashOf(r, "op-a") == "h2" && hashOf(r, "op-b") == "h2" &&
			hasCondition(r, ctrlmeshv1alpha1.ConditionProxiesReady, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonProxiesPending) &&
			condition(r, ctrlmeshv1alpha1.ConditionProxiesReady).Message == "1 of 3 candidate pods do not report rules h2: op-c (reports h1)"
	})
	if err := report(ctx, route, "op-c", "h2"); err != nil {
		t.Fatalf("op-c's later report: %v", err)
	}
	got = waitFor(t, route, "ProxiesReady again", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return hasCondition(r, ctrlmeshv1alpha1.ConditionProxiesReady, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonProxiesApplied)
	})
	if fields := managedStatusFields(got, ctrlmeshv1alpha1.ProxyFieldManager("op-c")); !strings.Contains(fields, "appliedRulesHash") {
		t.Fatalf("op-c's manager does not own its hash: %s", fields)
	}

	// op-b goes (its proxy first, as when a pod's containers stop), and a
	// proxy of a pod that never existed reports: both entries go, with the
	// proxies' field managers, though the agent owns no field of ghost's.
	// The report of a live pod the selector does not match stays, alone:
	// pruning it would only make its proxy write it again.
	stopB()
	for _, pod := range []string{"ghost", "other"} {
		if err := report(ctx, route, pod, "h2"); err != nil {
			t.Fatalf("%s's report: %v", pod, err)
		}
	}
	if err := admin.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "op-b"}}); err != nil {
		t.Fatal(err)
	}
	got = waitFor(t, route, "op-b and ghost pruned", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return len(r.Status.Pods) == 3 && hashOf(r, "op-b") == "" && hashOf(r, "ghost") == ""
	})
	if other := got.Status.Pods[2]; !reflect.DeepEqual(other, ctrlmeshv1alpha1.PodRouteStatus{Name: "other", AppliedRulesHash: "h2"}) {
		t.Fatalf("entry of the pod the selector does not match: %+v", other)
	}
	for _, pod := range []string{"op-b", "ghost"} {
		if fields := managedStatusFields(got, ctrlmeshv1alpha1.ProxyFieldManager(pod)); fields != "" {
			t.Fatalf("%s's field manager outlived its entry: %s", pod, fields)
		}
	}
	if !hasCondition(got, ctrlmeshv1alpha1.ConditionProxiesReady, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonProxiesApplied) {
		t.Fatalf("conditions %+v, want ProxiesReady True", got.Status.Conditions)
	}
}

// TestLeaders: each shard's renamed lock names its leader, mapped to a pod
// when the holder is one; an expired lease loses its leader with no other
// event, and a renewal brings it back.
func TestLeaders(t *testing.T) {
	ns := namespace(t)
	route := newRoute(ns, "h1", 1)
	route.Spec.Controller = &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "op-lock"}
	route.Spec.Shards = []ctrlmeshv1alpha1.RouteShard{{ID: "s0", Buckets: "0-15"}, {ID: "s1", Buckets: "16-31"}}
	create(t, route)
	createPod(t, ns, "op-a", operatorLabels, "10.0.0.1", true, corev1.PodRunning)
	create(t, lease(ns, "op-lock---s0", "op-a_4c1d6a4e-0000-4000-8000-000000000000", time.Hour))
	short := lease(ns, "op-lock---s1", "elsewhere_1", 4*time.Second)
	create(t, short)
	// The unrenamed lock is no shard's.
	create(t, lease(ns, "op-lock", "op-a_1", time.Hour))

	waitFor(t, route, "both leaders", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return fmt.Sprint(r.Status.Leaders) == "[{s0 op-a} {s1 elsewhere_1}]"
	})
	waitFor(t, route, "s1's leader gone at expiry", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return fmt.Sprint(r.Status.Leaders) == "[{s0 op-a}]"
	})
	short.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if err := admin.Update(t.Context(), short); err != nil {
		t.Fatal(err)
	}
	waitFor(t, route, "s1's leader back on renewal", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return fmt.Sprint(r.Status.Leaders) == "[{s0 op-a} {s1 elsewhere_1}]"
	})

	// A shard the hub dissolved still has a leader until its lease
	// expires: the hub must see it before it grants those buckets.
	// (s0's lease lasts an hour, so its leader stands however slow this is.)
	updateSpec(t, route, func(r *ctrlmeshv1alpha1.ShardRoute) {
		r.Spec.Shards = r.Spec.Shards[1:]
		r.Spec.RulesHash, r.Spec.RoutingGeneration = "h2", 2
	})
	waitFor(t, route, "the dissolved shard's leader still reported", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return r.Status.ObservedRoutingGeneration == 2 && slices.Contains(r.Status.Leaders, ctrlmeshv1alpha1.ShardLeader{Shard: "s0", Pod: "op-a"})
	})
}

// TestLeadersByTheAgentsClock: a shard lease's expiry is judged from when
// the agent saw it renewed, not from its renewTime, which the holder's clock
// wrote: with the agent's clock a minute ahead, a renewed lease keeps its
// leader; a minute behind, an unrenewed one loses its leader at expiry.
func TestLeadersByTheAgentsClock(t *testing.T) {
	for name, skew := range map[string]time.Duration{"ahead": time.Minute, "behind": -time.Minute} {
		t.Run(name, func(t *testing.T) {
			agentClock.set(skew)
			defer agentClock.set(0)
			ns := namespace(t)
			route := newRoute(ns, "h1", 1)
			route.Spec.Controller = &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "op-lock"}
			route.Spec.Shards = []ctrlmeshv1alpha1.RouteShard{{ID: "s0", Buckets: "0-15"}, {ID: "s1", Buckets: "16-31"}}
			create(t, route)
			renewed := lease(ns, "op-lock---s0", "renewer", 2*time.Second)
			create(t, renewed)
			renewCtx, stopRenewing := context.WithCancel(t.Context())
			defer stopRenewing()
			go func() {
				for {
					select {
					case <-renewCtx.Done():
						return
					case <-time.After(500 * time.Millisecond):
					}
					renewed.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
					if err := admin.Update(renewCtx, renewed); err != nil {
						return
					}
				}
			}()
			create(t, lease(ns, "op-lock---s1", "gone", 3*time.Second))

			waitFor(t, route, "s0's leader, s1's gone at expiry", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
				return fmt.Sprint(r.Status.Leaders) == "[{s0 renewer}]"
			})
			// Several of s0's lease durations later, its leader stands.
			time.Sleep(5 * time.Second)
			if got := getRoute(t, route); fmt.Sprint(got.Status.Leaders) != "[{s0 renewer}]" {
				t.Fatalf("leaders %v, want s0's renewed leader only", got.Status.Leaders)
			}
		})
	}
}

// TestInvalidRules: rules a proxy would refuse make RulesApplied False with
// the proxy's error, and a Warning Event on the route; good rules again
// make it True.
func TestInvalidRules(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	route := newRoute(ns, "h1", 1)
	route.Spec.Limits[0].RelateResources[0].Resources = []string{"configmapz"}
	create(t, route)

	got := waitFor(t, route, "RulesApplied False", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return hasCondition(r, ctrlmeshv1alpha1.ConditionRulesApplied, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonInvalidRules)
	})
	if msg := condition(got, ctrlmeshv1alpha1.ConditionRulesApplied).Message; !strings.Contains(msg, `"configmapz"`) {
		t.Fatalf("RulesApplied message %q does not name the unknown resource", msg)
	}
	eventually(t, "a Warning Event on the route", func() (bool, string) {
		var events corev1.EventList
		if err := admin.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == route.Name && e.InvolvedObject.Kind == "ShardRoute" &&
				e.Type == corev1.EventTypeWarning && e.Reason == ctrlmeshv1alpha1.ReasonInvalidRules && strings.Contains(e.Message, "configmapz") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events %+v", events.Items)
	})

	updateSpec(t, route, func(r *ctrlmeshv1alpha1.ShardRoute) {
		r.Spec.Limits[0].RelateResources[0].Resources = []string{"configmaps"}
		r.Spec.RulesHash, r.Spec.RoutingGeneration = "h2", 2
	})
	waitFor(t, route, "RulesApplied True", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return hasCondition(r, ctrlmeshv1alpha1.ConditionRulesApplied, metav1.ConditionTrue, ctrlmeshv1alpha1.ReasonRulesValid)
	})
}

// TestNothingTicks: with no candidate pods ProxiesReady says so; once the
// status is written, it stays unwritten while nothing changes — though a
// live leader's lease gets the route reconciled at its expiry time.
func TestNothingTicks(t *testing.T) {
	ns := namespace(t)
	route := newRoute(ns, "h1", 1)
	route.Spec.Controller = &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "op-lock"}
	create(t, route)
	held := lease(ns, "op-lock---s0", "somebody", 2*time.Second)
	create(t, held)
	// The holder renews its lease every half second, as an elector does.
	renewCtx, stopRenewing := context.WithCancel(t.Context())
	defer stopRenewing()
	go func() {
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
			held.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			if err := admin.Update(renewCtx, held); err != nil {
				return
			}
		}
	}()
	got := waitFor(t, route, "NoCandidatePods and the leader", func(r *ctrlmeshv1alpha1.ShardRoute) bool {
		return hasCondition(r, ctrlmeshv1alpha1.ConditionProxiesReady, metav1.ConditionFalse, ctrlmeshv1alpha1.ReasonNoCandidatePods) &&
			len(r.Status.Leaders) == 1
	})
	time.Sleep(5 * time.Second)
	after := getRoute(t, route)
	if after.ResourceVersion != got.ResourceVersion {
		t.Fatalf("the route was written while nothing changed: status %+v", after.Status)
	}
}

var operatorLabels = map[string]string{"app": "op"}

func newRoute(ns, hash string, generation int64) *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "op"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster: "member", RoutingGeneration: generation, RulesHash: hash, Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32,
			Selector: metav1.LabelSelector{MatchLabels: operatorLabels},
			Limits: ctrlmeshv1alpha1.Limits{{
				RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{""}, Resources: []string{"configmaps"}}},
			}},
			Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "s0", Buckets: "0-31"}},
		},
	}
}

// namespace creates a namespace of the test's own. Envtest runs no
// namespace controller, so namespaces are never cleaned up: each gets a
// generated name (of the test's, a subtest's "/" as "-"), and the tests
// also pass with -count above 1.
func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")) + "-"}}
	create(t, ns)
	return ns.Name
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := admin.Create(t.Context(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

// createPod creates a pod and sets the status a kubelet would. It has no
// node, so that deleting it removes it at once.
func createPod(t *testing.T, ns, name string, labels map[string]string, ip string, ready bool, phase corev1.PodPhase) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "operator", Image: "operator"}}},
	}
	create(t, pod)
	readiness := corev1.ConditionFalse
	if ready {
		readiness = corev1.ConditionTrue
	}
	pod.Status = corev1.PodStatus{
		Phase: phase, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: readiness}},
	}
	if err := admin.Status().Update(t.Context(), pod); err != nil {
		t.Fatalf("setting the status of pod %s: %v", name, err)
	}
}

func lease(ns, name, holder string, duration time.Duration) *coordinationv1.Lease {
	now := metav1.NewMicroTime(time.Now())
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(int32(duration / time.Second)),
			AcquireTime: &now, RenewTime: &now,
		},
	}
}

func updateSpec(t *testing.T, route *ctrlmeshv1alpha1.ShardRoute, change func(*ctrlmeshv1alpha1.ShardRoute)) {
	t.Helper()
	current := getRoute(t, route)
	change(current)
	if err := admin.Update(t.Context(), current); err != nil {
		t.Fatalf("updating the route: %v", err)
	}
}

// runProxy runs the real proxy of pod, following route from the API server
// and reporting the hashes it applies; the returned function stops it.
func runProxy(t *testing.T, route *ctrlmeshv1alpha1.ShardRoute, pod string) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- proxy.Run(ctx, proxy.Options{
			Upstream: member, ListenAddress: "127.0.0.1:0", Pod: pod, Mode: rules.ModeRange,
			RulesNamespace: route.Namespace, RulesName: route.Name, Log: logr.Discard(),
		})
	}()
	stop := sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("proxy of %s: %v", pod, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("proxy of %s did not stop", pod)
		}
	})
	t.Cleanup(stop)
	return stop
}

// report is a proxy's report as proxy/source.go applies it, except
// that it does not force: it fails on any conflict with the agent's fields.
func report(ctx context.Context, route *ctrlmeshv1alpha1.ShardRoute, pod, hash string) error {
	patch := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": ctrlmeshv1alpha1.GroupVersion.String(),
		"kind":       "ShardRoute",
		"metadata":   map[string]any{"namespace": route.Namespace, "name": route.Name},
		"status": map[string]any{"pods": []any{
			map[string]any{"name": pod, "appliedRulesHash": hash},
		}},
	}}
	return admin.Status().Patch(ctx, patch, client.Apply, client.FieldOwner(ctrlmeshv1alpha1.ProxyFieldManager(pod)))
}

func getRoute(t *testing.T, route *ctrlmeshv1alpha1.ShardRoute) *ctrlmeshv1alpha1.ShardRoute {
	t.Helper()
	var got ctrlmeshv1alpha1.ShardRoute
	if err := admin.Get(t.Context(), client.ObjectKeyFromObject(route), &got); err != nil {
		t.Fatalf("getting the route: %v", err)
	}
	return &got
}

// waitFor waits until the route satisfies ok, and returns it.
func waitFor(t *testing.T, route *ctrlmeshv1alpha1.ShardRoute, what string, ok func(*ctrlmeshv1alpha1.ShardRoute) bool) *ctrlmeshv1alpha1.ShardRoute {
	t.Helper()
	var got *ctrlmeshv1alpha1.ShardRoute
	eventually(t, what, func() (bool, string) {
		got = getRoute(t, route)
		return ok(got), fmt.Sprintf("status %+v", got.Status)
	})
	return got
}

func eventually(t *testing.T, what string, check func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, detail := check()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %s", what, detail)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func condition(route *ctrlmeshv1alpha1.ShardRoute, conditionType string) metav1.Condition {
	if c := meta.FindStatusCondition(route.Status.Conditions, conditionType); c != nil {
		return *c
	}
	return metav1.Condition{}
}

func hasCondition(route *ctrlmeshv1alpha1.ShardRoute, conditionType string, status metav1.ConditionStatus, reason string) bool {
	c := condition(route, conditionType)
	return c.Status == status && c.Reason == reason && c.ObservedGeneration == route.Generation
}

func hashOf(route *ctrlmeshv1alpha1.ShardRoute, pod string) string {
	for _, p := range route.Status.Pods {
		if p.Name == pod {
			return p.AppliedRulesHash
		}
	}
	return ""
}

// managedStatusFields is the status fields manager owns, "" when it owns none.
func managedStatusFields(route *ctrlmeshv1alpha1.ShardRoute, manager string) string {
	for _, mf := range route.ManagedFields {
		if mf.Manager == manager && mf.Subresource == "status" && mf.FieldsV1 != nil {
			return string(mf.FieldsV1.Raw)
		}
	}
	return ""
}
