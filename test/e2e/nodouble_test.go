package e2e_test

import (
	"context"
	"testing"
	"time"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
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
		mode   string
		gates  []string
		canary []ctrlmeshv1alpha1.CanaryStep
	}{
		{mode: "range", gates: []string{controlplane.FeatureShardedListAndWatch}, canary: fleettest.RangeModeCanary},
		{mode: "label", canary: fleettest.LabelModeCanary},
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
	objects := f.MemberObjects(t, ctx)

	// (user steps 3 and 4) apply a ShardingConfig over both members and
	// observe: two shards per member, each pod reconciling exactly the
	// objects of its shard.
	sc := fleettest.ShardingConfig(ctrlmeshv1alpha1.ScopePerCluster)
	fleettest.Canary(sc, canarySteps)
	run, got := f.Apply(sc, objects, fleettest.PerCluster, 90*time.Second, nil)
	if got.Status.Shards != 4 {
		t.Errorf("%d shards, want 2 per member: %s", got.Status.Shards, fleettest.Placement(got))
	}

	// (1) Rebalancing: a third pod in member1 takes a share of its buckets.
	run.Rebalance(member1, member1+"-2")
	// (2) Pod kill in member2: its buckets move to the other pod there once
	// its lease expires, within the failover bound.
	run.PodKill(member2 + "-0")
	// (3) Canary promotion in member1: the canary pod serves each step's
	// buckets and namespaces.
	promoted := run.CanarySteps(member1, member1+"-canary", canarySteps)
	// (4) Hub restart: the pods keep serving meanwhile, and the restarted
	// hub keeps the placement.
	run.HubRestart(promoted)
	// (5) Agent restart in member1.
	final := run.AgentRestart(member1, promoted)
	f.CheckReconciledBy("the end", final, objects, fleettest.PerCluster)

	run.Finish()
}
