package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/fleettest"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// TestFleetScope shards an operator whose objects live on the hub across
// its pods in two members (Fleet scope, range mode: the hub's API server
// has KEP-5866): every hub object is reconciled by the pod the hub's status
// gives it to. Then member2 is lost — its agent stops, so its heartbeat
// expires — and its buckets move to member1's pods, which then reconcile
// every object; no object is ever reconciled by two pods at once.
//
// member2's pods are killed with its agent: a proxy keeps the last rules
// it got while its agent is away, so pods still running in a member whose
// heartbeat expired would keep serving their old buckets (a documented
// limit of Fleet scope).
func TestFleetScope(t *testing.T) {
	if testing.Short() {
		t.Skip("starts API servers and operator processes")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := fleettest.StartFleet(t, ctx, localfleet.Options{Members: []string{member1, member2},
		HubFeatureGates: []string{controlplane.FeatureShardedListAndWatch}})
	lost := []string{member2 + "-0", member2 + "-1"}
	for _, m := range []string{member1, member2} {
		for i := range 2 {
			f.AddPod(m, fmt.Sprintf("%s-%d", m, i), true, nil)
		}
	}
	objects := []fleettest.ClusterObjects{{Cluster: localfleet.HubName, Client: f.Hub.Client, Keys: fleettest.ManagedObjects(t, ctx, f.Hub.Client)}}
	fleetDomain := func(string) string { return "fleet" }

	sc := fleettest.ShardingConfig(ctrlmeshv1alpha1.ScopeFleet)
	env.Create(t, ctx, f.Hub.Client, sc)
	w := &fleettest.Waiter{F: f, Key: client.ObjectKeyFromObject(sc)}
	// Ready may come before the second member's agent reported its pods;
	// the placement then spreads over both.
	got := w.Ready("initial placement", time.Now(), 90*time.Second, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return fleettest.ServesIn(sc, member1) && fleettest.ServesIn(sc, member2)
	})
	f.CheckReconciledBy("initial placement", got, objects, fleetDomain)

	touching := fleettest.StartTouching(ctx, objects)
	defer touching.Stop()
	phases := []fleettest.Phase{{Name: "steady", Start: time.Now()}}
	time.Sleep(2 * time.Second)

	t0 := time.Now()
	phases = append(phases, fleettest.Phase{Name: "member2 lost", Start: t0})
	if err := f.StopAgent(member2); err != nil {
		t.Fatal(err)
	}
	for _, p := range lost {
		f.Kill(p)
	}
	moved := w.Served("member2 lost", t0, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return !fleettest.ServesIn(sc, member2)
	})
	f.CheckReconciledBy("member2 lost", moved, objects, fleetDomain)

	f.Finish(touching, phases, fleetDomain)
}
