package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
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
	run := f.FleetScope(t, ctx)
	run.CutOff("member2 cut off", member2, func() time.Time {
		t0 := time.Now()
		if err := f.StopAgent(member2); err != nil {
			t.Fatal(err)
		}
		return t0
	})
	run.Finish()
}
