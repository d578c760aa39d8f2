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
// gives it to. Then member2 is cut off — its agent stops, so its heartbeat
// expires and nothing renews its rules — while its operator pods go on
// running against the hub: their proxies stop serving once the rules'
// validity ran out, and only then does the hub give their buckets to
// member1's pods, which then reconcile every object. No object is ever
// reconciled by two pods at once.
func TestFleetScope(t *testing.T) {
	if testing.Short() {
		t.Skip("starts API servers and operator processes")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := fleettest.StartFleet(t, ctx, localfleet.Options{Members: []string{member1, member2},
		HubFeatureGates: []string{controlplane.FeatureShardedListAndWatch}})
	// An operator whose proxy stops serving loses its leader election and
	// exits; the kubelet would start it again.
	f.RestartOperators = true
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
	phases = append(phases, fleettest.Phase{Name: "member2 cut off", Start: t0})
	if err := f.StopAgent(member2); err != nil {
		t.Fatal(err)
	}
	moved := w.Served("member2 cut off", t0, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return !fleettest.ServesIn(sc, member2)
	})
	f.CheckReconciledBy("member2 cut off", moved, objects, fleetDomain)

	f.Finish(touching, phases, fleetDomain)
}
