package inject_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// The clusters of test/env run no kubelet and no controllers: a test plays
// the ReplicaSet controller (it creates the owned pods, and replaces an
// evicted one), the kubelet (it reports pods running and ready) and the
// disruption controller (it writes a PodDisruptionBudget's status).

// createReplicaSet creates a ReplicaSet of the operator's pods, for pods to
// name as their controller.
func createReplicaSet(t *testing.T, ctx context.Context, ns string) *appsv1.ReplicaSet {
	t.Helper()
	template := operatorPod(ns)
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "demo-operator", Namespace: ns},
		Spec: appsv1.ReplicaSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{operatorLabel: operatorApp}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: template.Labels}, Spec: template.Spec},
		},
	}
	got, err := cs.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// createOwnedPod creates an operator pod of the ReplicaSet, as its
// controller would, and reports it running and ready, as a kubelet would.
func createOwnedPod(t *testing.T, ctx context.Context, rs *appsv1.ReplicaSet) *corev1.Pod {
	t.Helper()
	pod := operatorPod(rs.Namespace)
	pod.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true),
	}}
	return setReady(t, ctx, createPod(t, ctx, pod))
}

// setReady reports the pod running and ready.
func setReady(t *testing.T, ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	pod = pod.DeepCopy()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	got, err := cs.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// exists reports whether the pod, by UID, still exists.
func exists(t *testing.T, ctx context.Context, pod *corev1.Pod) bool {
	t.Helper()
	got, err := cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return got.UID == pod.UID
}

// waitForOneGone waits until exactly one of pods is gone, and returns it and
// the others.
func waitForOneGone(t *testing.T, ctx context.Context, pods []*corev1.Pod) (gone *corev1.Pod, left []*corev1.Pod) {
	t.Helper()
	waitFor(t, ctx, "one pod evicted", func() error {
		gone, left = nil, nil
		for _, p := range pods {
			if exists(t, ctx, p) {
				left = append(left, p)
			} else {
				gone = p
			}
		}
		switch {
		case len(left) < len(pods)-1:
			t.Fatalf("%d of %d pods evicted at once, want one at a time", len(pods)-len(left), len(pods))
		case gone == nil:
			return fmt.Errorf("all %d pods still exist", len(pods))
		}
		return nil
	})
	return gone, left
}

// stayFor checks, for a few of the Replacer's paces, that every pod is left
// alone.
func stayFor(t *testing.T, ctx context.Context, why string, pods ...*corev1.Pod) {
	t.Helper()
	deadline := time.Now().Add(5 * replacePace)
	for time.Now().Before(deadline) {
		for _, p := range pods {
			if !exists(t, ctx, p) {
				t.Fatalf("pod %s was evicted, but %s", p.Name, why)
			}
		}
		time.Sleep(replacePace / 3)
	}
}

// eventsOf returns the pod's Events of the reason.
func eventsOf(t *testing.T, ctx context.Context, pod *corev1.Pod, reason string) []corev1.Event {
	t.Helper()
	sel := fields.AndSelectors(
		fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID)),
		fields.OneTermEqualSelector("reason", reason),
	).String()
	list, err := cs.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// waitForEvent returns the pod's Event of the reason once there is one, and
// checks its type.
func waitForEvent(t *testing.T, ctx context.Context, pod *corev1.Pod, reason, eventType string) corev1.Event {
	t.Helper()
	var events []corev1.Event
	waitFor(t, ctx, "Event "+reason+" on pod "+pod.Name, func() error {
		if events = eventsOf(t, ctx, pod, reason); len(events) == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	if events[0].Type != eventType {
		t.Errorf("Event %s on pod %s is %s, want %s: %s", reason, pod.Name, events[0].Type, eventType, events[0].Message)
	}
	return events[0]
}

// evictions is the Replacer's count of evictions with the outcome.
func evictions(t *testing.T, outcome string) float64 {
	t.Helper()
	families, err := agentMetrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "ctrlmesh_agent_proxy_evictions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// replaceEvicted plays the ReplicaSet controller after an eviction: a new
// pod, which must come with the proxy, reported ready when ready is set.
func replaceEvicted(t *testing.T, ctx context.Context, rs *appsv1.ReplicaSet, ready bool) *corev1.Pod {
	t.Helper()
	pod := operatorPod(rs.Namespace)
	pod.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true),
	}}
	pod = createPod(t, ctx, pod)
	checkInjected(t, pod, "demo")
	if ready {
		pod = setReady(t, ctx, pod)
	}
	return pod
}

// TestRouteFirstInjectsAtAdmission is the documented order: the ShardRoute
// exists before the operator's pods, which get their proxy at admission and
// are never evicted.
func TestRouteFirstInjectsAtAdmission(t *testing.T) {
	ctx := testContext(t)
	ns := createNamespace(t, ctx, "route-first")
	createRoute(t, ctx, route(ns, "demo", nil))
	rs := createReplicaSet(t, ctx, ns)
	before := evictions(t, "evicted")
	pods := []*corev1.Pod{createOwnedPod(t, ctx, rs), createOwnedPod(t, ctx, rs)}
	for _, p := range pods {
		checkInjected(t, p, "demo")
	}
	stayFor(t, ctx, "it was injected at admission", pods...)
	for _, p := range pods {
		if events := eventsOf(t, ctx, p, ctrlmeshv1alpha1.ReasonEvictedForProxy); len(events) != 0 {
			t.Errorf("pod %s: eviction Events %+v", p.Name, events)
		}
	}
	if got := evictions(t, "evicted"); got != before {
		t.Errorf("%v evictions, want none", got-before)
	}
}

// TestPodsFirstAreReplaced is the other order: the operator's pods exist,
// opted in, before their ShardRoute, so the injector skipped them. Once the
// route arrives they are evicted one at a time — the next only once the
// replacement of the last is there and ready — and come back with the proxy.
func TestPodsFirstAreReplaced(t *testing.T) {
	ctx := testContext(t)
	ns := createNamespace(t, ctx, "pods-first")
	rs := createReplicaSet(t, ctx, ns)
	pods := []*corev1.Pod{createOwnedPod(t, ctx, rs), createOwnedPod(t, ctx, rs)}
	for _, p := range pods {
		if got := p.Annotations[ctrlmeshv1alpha1.ProxyInjectionAnnotation]; got != ctrlmeshv1alpha1.ProxyInjectionSkipped {
			t.Fatalf("pod %s created before its route: injection %q, want skipped", p.Name, got)
		}
	}
	// A pod no controller owns is not evicted: it would not come back.
	bare := setReady(t, ctx, createPod(t, ctx, operatorPod(ns)))
	before := evictions(t, "evicted")

	createRoute(t, ctx, route(ns, "demo", nil))
	first, left := waitForOneGone(t, ctx, pods)
	e := waitForEvent(t, ctx, first, ctrlmeshv1alpha1.ReasonEvictedForProxy, corev1.EventTypeNormal)
	if !strings.Contains(e.Message, `ShardRoute "demo"`) || !strings.Contains(e.Message, "ReplicaSet demo-operator") {
		t.Errorf("eviction Event %q does not name the route and the owner", e.Message)
	}
	stayFor(t, ctx, "the first evicted pod has no replacement yet", left...)
	replacement := replaceEvicted(t, ctx, rs, false)
	stayFor(t, ctx, "the first replacement is not ready yet", left...)
	setReady(t, ctx, replacement)
	second, _ := waitForOneGone(t, ctx, left)
	waitForEvent(t, ctx, second, ctrlmeshv1alpha1.ReasonEvictedForProxy, corev1.EventTypeNormal)
	replaceEvicted(t, ctx, rs, true)

	e = waitForEvent(t, ctx, bare, ctrlmeshv1alpha1.ReasonRecreateForProxy, corev1.EventTypeWarning)
	if !strings.Contains(e.Message, "delete it and create it again") {
		t.Errorf("Event on the bare pod %q does not say to recreate it", e.Message)
	}
	if !exists(t, ctx, bare) {
		t.Error("the pod no controller owns was evicted")
	}
	if got := evictions(t, "evicted") - before; got != 2 {
		t.Errorf("%v evictions counted, want 2", got)
	}
}

// TestEvictionHonoursDisruptionBudget replaces pods guarded by a
// PodDisruptionBudget: an eviction beyond the budget is refused (429), not
// forced, and the pod gets a Warning Event; it is evicted once the budget
// allows.
func TestEvictionHonoursDisruptionBudget(t *testing.T) {
	ctx := testContext(t)
	ns := createNamespace(t, ctx, "budget")
	rs := createReplicaSet(t, ctx, ns)
	pods := []*corev1.Pod{createOwnedPod(t, ctx, rs), createOwnedPod(t, ctx, rs), createOwnedPod(t, ctx, rs)}
	pdb, err := cs.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "demo-operator", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(2)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{operatorLabel: operatorApp}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// allow writes the status the disruption controller would: three
	// healthy pods of the two needed, one disruption allowed.
	allow := func() {
		t.Helper()
		current, err := cs.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, pdb.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		current.Status = policyv1.PodDisruptionBudgetStatus{
			ObservedGeneration: current.Generation, DisruptionsAllowed: 1, CurrentHealthy: 3, DesiredHealthy: 2, ExpectedPods: 3,
		}
		if _, err := cs.PolicyV1().PodDisruptionBudgets(ns).UpdateStatus(ctx, current, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	allow()
	blockedBefore := evictions(t, "blocked")

	createRoute(t, ctx, route(ns, "demo", nil))
	_, left := waitForOneGone(t, ctx, pods)
	// The eviction spent the budget's one disruption; the replacement is
	// there and ready, so only the budget holds the next pod back.
	replaceEvicted(t, ctx, rs, true)
	var blocked *corev1.Pod
	waitFor(t, ctx, "a refused eviction's Warning Event", func() error {
		for _, p := range left {
			if events := eventsOf(t, ctx, p, ctrlmeshv1alpha1.ReasonProxyEvictionBlocked); len(events) > 0 {
				blocked = p
				if e := events[0]; e.Type != corev1.EventTypeWarning || !strings.Contains(e.Message, "disruption budget") {
					t.Errorf("Event %s %q, want a Warning naming the disruption budget", e.Type, e.Message)
				}
				return nil
			}
		}
		return fmt.Errorf("none yet")
	})
	stayFor(t, ctx, "the disruption budget allows no eviction", left...)
	if got := evictions(t, "blocked") - blockedBefore; got < 1 {
		t.Errorf("%v refused evictions counted, want at least 1", got)
	}

	allow()
	second, _ := waitForOneGone(t, ctx, left)
	waitForEvent(t, ctx, second, ctrlmeshv1alpha1.ReasonEvictedForProxy, corev1.EventTypeNormal)
	if second.UID != blocked.UID {
		t.Logf("the pod evicted second, %s, is not the one first refused, %s", second.Name, blocked.Name)
	}
}

// TestRouteDeletedWarnsProxiedPods deletes the ShardRoute a pod's proxy
// enforces: the pod gets a Warning Event saying what the proxy does now and
// what to do, once per deletion; a pod without the proxy gets none.
func TestRouteDeletedWarnsProxiedPods(t *testing.T) {
	ctx := testContext(t)
	ns := createNamespace(t, ctx, "route-deleted")
	r := route(ns, "demo", nil)
	createRoute(t, ctx, r)
	proxied := createPod(t, ctx, operatorPod(ns))
	checkInjected(t, proxied, "demo")
	unproxied := operatorPod(ns)
	unproxied.Labels[operatorLabel] = "another-operator"
	unproxied = createPod(t, ctx, unproxied)

	deleteRoute := func() {
		t.Helper()
		if err := member.Client.Delete(ctx, r.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	deleteRoute()
	e := waitForEvent(t, ctx, proxied, ctrlmeshv1alpha1.ReasonShardRouteDeleted, corev1.EventTypeWarning)
	want := "ShardRoute demo deleted: the proxy refuses the operator's sharded reads and writes; remove label ctrlmesh.io/enable-proxy from the pod template and restart, or re-create the ShardingConfig"
	if e.Message != want {
		t.Errorf("Event message %q, want %q", e.Message, want)
	}

	// Created again and deleted again: a second Event.
	r.ResourceVersion = ""
	createRoute(t, ctx, r)
	deleteRoute()
	waitFor(t, ctx, "the second deletion's Event", func() error {
		events := eventsOf(t, ctx, proxied, ctrlmeshv1alpha1.ReasonShardRouteDeleted)
		if len(events) != 1 || events[0].Count != 2 {
			return fmt.Errorf("Events %+v, want one counted twice", events)
		}
		return nil
	})
	if events := eventsOf(t, ctx, unproxied, ctrlmeshv1alpha1.ReasonShardRouteDeleted); len(events) != 0 {
		t.Errorf("pod without the proxy got %+v", events)
	}
}
