package routestatus_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/agent/routestatus"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

// TestValidityGrants: the agent grants the renewal requests it read before a
// heartbeat renewal, and only while the member holds the rules the hub's
// Work publishes: not for a route its Work moved past (a member back from a
// partition, whose buckets the hub may have given away), not for one whose
// Work is gone, and not a request written after the requests were read.
// The API server plays both the member and the hub.
func TestValidityGrants(t *testing.T) {
	ctx := t.Context()
	const cluster = "renewals"
	hubNamespace := routework.WorkKey(cluster, "x", "y").Namespace
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: hubNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	renewals := &routestatus.ValidityGrants{Member: admin, MemberReader: admin, Hub: admin, Cluster: cluster, Log: testr.New(t)}

	// A Fleet route in the member, with requests of two pods, and the
	// hub's Work carrying it at generation.
	outer := t
	setup := func(t *testing.T, workGeneration int64) (*ctrlmeshv1alpha1.ShardRoute, *ctrlmeshv1alpha1.ShardRoute) {
		t.Helper()
		// Named after the test, which a subtest's name with its slash
		// cannot be.
		ns := namespace(outer)
		// Live pods: the status controller keeps their entries, with
		// the proxies' requests and the grants, as written.
		for _, pod := range []string{"op-0", "op-1"} {
			createPod(t, ns, pod, operatorLabels, "10.0.0.1", true, corev1.PodRunning)
		}
		route := newRoute(ns, "h3", 3)
		route.Spec.Scope, route.Spec.ValiditySeconds = ctrlmeshv1alpha1.ScopeFleet, 30
		create(t, route)
		setValidityRequests(t, route, map[string][2]int64{"op-0": {11, 0}, "op-1": {21, 20}})
		published := route.DeepCopy()
		published.Spec.RoutingGeneration = workGeneration
		if workGeneration != 3 {
			published.Spec.RulesHash = "newer"
		}
		if workGeneration > 0 {
			work := routework.NewWork(routework.WorkKey(cluster, ns, route.Name))
			if err := routework.SetManifests(work, published, nil); err != nil {
				t.Fatal(err)
			}
			if err := admin.Create(ctx, work); err != nil {
				t.Fatal(err)
			}
		}
		return route, published
	}
	granted := func(t *testing.T, route *ctrlmeshv1alpha1.ShardRoute) map[string]int64 {
		t.Helper()
		var got ctrlmeshv1alpha1.ShardRoute
		if err := admin.Get(ctx, client.ObjectKeyFromObject(route), &got); err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, p := range got.Status.Pods {
			out[p.Name] = p.RenewalGranted
		}
		return out
	}

	t.Run("member holds the hub's rules", func(t *testing.T) {
		route, _ := setup(t, 3)
		renewed := renewals.Collect(ctx)
		// A request written after the collection waits for the next
		// heartbeat: the hub's observation may precede it.
		setValidityRequests(t, route, map[string][2]int64{"op-0": {12, 0}, "op-1": {21, 20}})
		renewed(ctx)
		if got := granted(t, route); got["op-0"] != 11 || got["op-1"] != 21 {
			t.Errorf("granted %v, want op-0 11 (read before the heartbeat, not 12) and op-1 21", got)
		}
	})
	t.Run("the hub publishes newer rules", func(t *testing.T) {
		route, _ := setup(t, 4)
		renewals.Collect(ctx)(ctx)
		if got := granted(t, route); got["op-0"] != 0 || got["op-1"] != 20 {
			t.Errorf("granted %v while the member is behind the hub, want nothing new", got)
		}
	})
	t.Run("the hub publishes no rules", func(t *testing.T) {
		route, _ := setup(t, 0)
		renewals.Collect(ctx)(ctx)
		if got := granted(t, route); got["op-0"] != 0 || got["op-1"] != 20 {
			t.Errorf("granted %v without a Work on the hub, want nothing new", got)
		}
	})
}

// setValidityRequests sets the renewal request and grant of pods in route's status,
// as the proxies and an earlier grant would have, retrying while the status
// controller writes it too.
func setValidityRequests(t *testing.T, route *ctrlmeshv1alpha1.ShardRoute, byPod map[string][2]int64) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var current ctrlmeshv1alpha1.ShardRoute
		if err := admin.Get(t.Context(), client.ObjectKeyFromObject(route), &current); err != nil {
			return err
		}
		current.Status.Pods = slices.DeleteFunc(current.Status.Pods, func(p ctrlmeshv1alpha1.PodRouteStatus) bool { _, ok := byPod[p.Name]; return ok })
		for _, name := range slices.Sorted(maps.Keys(byPod)) {
			current.Status.Pods = append(current.Status.Pods, ctrlmeshv1alpha1.PodRouteStatus{Name: name, RenewalRequest: byPod[name][0], RenewalGranted: byPod[name][1]})
		}
		return admin.Status().Update(t.Context(), &current)
	})
	if err != nil {
		t.Fatal(err)
	}
}
