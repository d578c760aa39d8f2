package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/fleettest"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// The members of TestNoDoubleReconcile; the disruptions hit member1 except
// the pod kill, which hits member2.
const (
	member1 = fleettest.Member1
	member2 = fleettest.Member2
)

// TestNoDoubleReconcile runs the demo operator's pods, recording every
// reconcile, in two members sharded per cluster while ConfigMaps keep
// changing, and goes through the user's steps (the hub up, both members
// joined, a ShardingConfig applied, its placement observed) and then
// rebalancing, a pod kill, a canary's steps, a hub restart and an agent
// restart. No object may ever be reconciled by two pods at once; after
// each disruption every bucket is served again; and every object is
// reconciled by the pod the hub's status gives it to. It runs in range mode
// (KEP-5866 in the members' API servers) and in label mode (without).
func TestNoDoubleReconcile(t *testing.T) {
	if testing.Short() {
		t.Skip("starts API servers and operator processes")
	}
	for _, tc := range []struct {
		mode  string
		gates []string
		// canary are the canary's steps: label mode cannot state a canary
		// ownership of buckets and a namespace besides.
		canary []ctrlmeshv1alpha1.CanaryStep
	}{
		{mode: "range", gates: []string{controlplane.FeatureShardedListAndWatch}, canary: []ctrlmeshv1alpha1.CanaryStep{
			{Namespaces: []string{fleettest.CanaryNamespace}},
			{Buckets: "0-3", Namespaces: []string{fleettest.CanaryNamespace}},
		}},
		{mode: "label", canary: []ctrlmeshv1alpha1.CanaryStep{
			{Namespaces: []string{fleettest.CanaryNamespace}},
			{Buckets: "0-3"},
		}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			testNoDoubleReconcile(t, tc.gates, tc.canary)
		})
	}
}

func testNoDoubleReconcile(t *testing.T, gates []string, canarySteps []ctrlmeshv1alpha1.CanaryStep) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// (user steps 1 and 2) the hub up, both members joined.
	f := fleettest.StartFleet(t, ctx, localfleet.Options{Members: []string{member1, member2}, MemberFeatureGates: gates})
	for _, m := range []string{member1, member2} {
		for i := range 2 {
			f.AddPod(m, fmt.Sprintf("%s-%d", m, i), false, nil)
		}
	}
	var objects []fleettest.ClusterObjects
	for _, m := range []string{member1, member2} {
		c := f.Members[m].Client
		objects = append(objects, fleettest.ClusterObjects{Cluster: m, Client: c, Keys: fleettest.ManagedObjects(t, ctx, c)})
	}
	ownDomain := func(cluster string) string { return cluster }

	// (user step 3) apply a ShardingConfig over both members.
	sc := fleettest.ShardingConfig(ctrlmeshv1alpha1.ScopePerCluster)
	sc.Spec.Canary = &ctrlmeshv1alpha1.CanarySpec{
		Selector:          metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}},
		Steps:             canarySteps,
		MinHealthySeconds: 2,
	}
	env.Create(t, ctx, f.Hub.Client, sc)
	w := &fleettest.Waiter{F: f, Key: client.ObjectKeyFromObject(sc)}
	// (user step 4) observe: two shards per member, each pod reconciling
	// exactly the objects of its shard.
	got := w.Ready("initial placement", time.Now(), 90*time.Second, nil)
	if got.Status.Shards != 4 {
		t.Errorf("%d shards, want 2 per member: %s", got.Status.Shards, fleettest.Placement(got))
	}
	f.CheckReconciledBy("initial placement", got, objects, ownDomain)

	touching := fleettest.StartTouching(ctx, objects)
	defer touching.Stop()
	phases := []fleettest.Phase{{Name: "steady", Start: time.Now()}}
	time.Sleep(2 * time.Second)

	// (1) Rebalancing: a third pod in member1 takes a share of its buckets.
	added := member1 + "-2"
	t0 := time.Now()
	phases = append(phases, fleettest.Phase{Name: "rebalancing", Start: t0})
	f.AddPod(member1, added, false, nil)
	w.Ready("rebalancing (pod added)", t0, fleettest.ReadyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return fleettest.Placed(sc, added)
	})

	// (2) Pod kill in member2: its buckets move to the other pod there once
	// its lease expires, within the failover bound.
	victim := member2 + "-0"
	t0 = time.Now()
	phases = append(phases, fleettest.Phase{Name: "pod kill", Start: t0})
	f.Kill(victim)
	w.Ready("pod kill", t0, fleettest.FailoverBound, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return !fleettest.Placed(sc, victim)
	})

	// (3) Canary promotion in member1: the canary pod serves each step's
	// buckets and namespaces.
	canaryPod := member1 + "-canary"
	t0 = time.Now()
	phases = append(phases, fleettest.Phase{Name: "canary", Start: t0})
	f.AddPod(member1, canaryPod, false, map[string]string{"track": "canary"})
	var promoted *ctrlmeshv1alpha1.ShardingConfig
	for step := range int32(len(canarySteps)) {
		want := canarySteps[step]
		promoted = w.Ready(fmt.Sprintf("canary step %d", step+1), t0, fleettest.ReadyWithin, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
			if sc.Status.Canary == nil || sc.Status.Canary.Step < step {
				return false
			}
			// A short step may be over before a poll sees it.
			return sc.Status.Canary.Step > step || slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
				return p.Canary && p.Buckets == want.Buckets && slices.Equal(p.Namespaces, want.Namespaces)
			})
		})
	}
	f.CheckReconciledBy("canary promoted", promoted, objects, ownDomain)

	// (4) Hub restart: the pods keep serving meanwhile, and the restarted
	// hub keeps the placement.
	t0 = time.Now()
	phases = append(phases, fleettest.Phase{Name: "hub restart", Start: t0})
	if err := f.StopHub(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := f.StartHub(ctx); err != nil {
		t.Fatal(err)
	}
	if got := w.Ready("hub restart", t0, fleettest.ReadyWithin, nil); fleettest.Placement(got) != fleettest.Placement(promoted) {
		t.Errorf("the placement changed over the hub restart:\n%s\nto\n%s", fleettest.Placement(promoted), fleettest.Placement(got))
	}

	// (5) Agent restart in member1.
	t0 = time.Now()
	phases = append(phases, fleettest.Phase{Name: "agent restart", Start: t0})
	if err := f.StopAgent(member1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := f.StartAgent(member1); err != nil {
		t.Fatal(err)
	}
	final := w.Ready("agent restart", t0, fleettest.ReadyWithin, nil)
	if fleettest.Placement(final) != fleettest.Placement(promoted) {
		t.Errorf("the placement changed over the agent restart:\n%s\nto\n%s", fleettest.Placement(promoted), fleettest.Placement(final))
	}
	f.CheckReconciledBy("the end", final, objects, ownDomain)

	f.Finish(touching, phases, ownDomain)
}
