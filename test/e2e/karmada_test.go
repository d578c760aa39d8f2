package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"github.com/karmada-io/karmada/pkg/util"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/fleettest"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// TestKarmadaFleet runs the hub on a real Karmada control plane
// (localfleet.Options.Karmada): member1 joined to Karmada in push mode
// (karmada-controller-manager applies its Works), member2 in pull mode
// (karmada-agent does), and ctrlmesh's agents in Karmada mode, applying
// nothing. Everything the hub learns of the members comes back through
// Karmada's work-status controller and the shipped ShardRoute interpreter.
// It goes through the steps of TestNoDoubleReconcile (label mode) that
// involve the hub's rules: a PerCluster ShardingConfig over both members
// becomes Ready with every bucket served and every object reconciled by the
// pod the hub's status names; a pod killed in member2 (pull) has its
// buckets healed; a canary pod in member1 (push) goes through two steps;
// the hub restarts and keeps the placement. Then deleting the
// ShardingConfig makes Karmada remove the ShardRoutes from the members
// (the Work finalizer's life cycle is Karmada's); and no object is ever
// reconciled by two pods at once.
func TestKarmadaFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts API servers, Karmada and operator processes")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	f := startKarmadaFleet(t, ctx, nil)
	// An operator whose proxy stops serving (its rules removed with the
	// ShardingConfig) loses its leader election and exits; the kubelet
	// would start it again.
	f.RestartOperators = true
	modes := syncModes(t, ctx, f)
	objects := f.MemberObjects(t, ctx)

	sc := fleettest.ShardingConfig(ctrlmeshv1alpha1.ScopePerCluster)
	fleettest.Canary(sc, fleettest.LabelModeCanary)
	run, got := f.Apply(sc, objects, fleettest.PerCluster, 90*time.Second, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return fleettest.ServesIn(sc, member1) && fleettest.ServesIn(sc, member2)
	})
	logPlacement(f, modes, got)
	if got.Status.Shards != 4 {
		t.Errorf("%d shards, want 2 per member: %s", got.Status.Shards, fleettest.Placement(got))
	}
	checkKarmadaWorks(t, ctx, f)

	// A pod killed in the pull member: its buckets move to the other pod
	// there once its lease expires.
	logPlacement(f, modes, run.PodKill(member2+"-0"))
	// A canary in the push member.
	promoted := run.CanarySteps(member1, member1+"-canary", fleettest.LabelModeCanary)
	logPlacement(f, modes, promoted)
	// The hub restarted: it reads what Karmada reported back and keeps the
	// placement.
	run.HubRestart(promoted)
	run.StopTouching()

	// Deleting the ShardingConfig: the hub deletes its Works, and Karmada's
	// execution controller (push) or karmada-agent (pull) removes each
	// ShardRoute from its member before it lets the Work go.
	t0 := time.Now()
	if err := f.Hub.Client.Delete(ctx, sc); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{member1, member2} {
		route := client.ObjectKey{Namespace: fleettest.OpNamespace, Name: fleettest.OpName}
		env.Eventually(t, 30*time.Second, "the ShardRoute removed from "+m, func() error {
			err := f.Members[m].Client.Get(ctx, route, &ctrlmeshv1alpha1.ShardRoute{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("the ShardRoute is still there (%v)", err)
		})
		work := routework.WorkKey(m, sc.Namespace, sc.Name)
		env.Eventually(t, 30*time.Second, "the Work of "+m+" gone", func() error {
			err := f.Hub.Client.Get(ctx, work, &workv1alpha1.Work{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("Work %s is still there (%v)", work, err)
		})
	}
	f.Logf("ShardingConfig deleted: Karmada removed both ShardRoutes and let the Works go after %.1fs", time.Since(t0).Seconds())

	records := run.Finish()
	t.Logf("TestKarmadaFleet: %.1fs in all, %d reconciles, %d overlapping", time.Since(start).Seconds(), records.Reconciles, records.Overlaps)
}

// TestKarmadaFleetScope: Fleet scope on the Karmada fleet, the operator's
// objects on the hub (as TestFleetScope). member2's karmada-agent stops
// (its ctrlmesh agent keeps heartbeating, its operator pods keep running):
// Karmada marks its Cluster not Ready, which the hub takes as unavailable
// but not lapsed, so its pods' buckets wait until it outlived the rules
// that gave them (the revocation, published to member2 first, never
// arrives there; its agent grants no renewal of rules its Work has moved
// past): then they move to member1's pods, which reconcile every object.
// With karmada-agent back, Karmada applies the Works again, the Cluster is
// Ready, and the placement spreads over both members again. No object is
// ever reconciled by two pods at once.
func TestKarmadaFleetScope(t *testing.T) {
	if testing.Short() {
		t.Skip("starts API servers, Karmada and operator processes")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	f := startKarmadaFleet(t, ctx, []string{controlplane.FeatureShardedListAndWatch})
	modes := syncModes(t, ctx, f)
	run := f.FleetScope(t, ctx)

	run.CutOff("member2's karmada-agent stopped", member2, func() time.Time {
		t0 := time.Now()
		if err := f.Hub.Karmada.StopAgent(member2); err != nil {
			t.Fatal(err)
		}
		notReady := waitKarmadaReady(t, ctx, f, member2, false, controlplane.KarmadaClusterMonitorGracePeriod+15*time.Second)
		f.Logf("Karmada's Cluster %s not Ready %.1fs after its karmada-agent stopped", member2, notReady.Sub(t0).Seconds())
		return notReady
	})
	var mc clusterv1.ManagedCluster
	if err := f.Hub.Client.Get(ctx, client.ObjectKey{Name: member2}, &mc); err != nil {
		t.Fatal(err)
	}
	available := meta.FindStatusCondition(mc.Status.Conditions, clusterv1.ManagedClusterConditionAvailable)
	if available == nil || available.Status == metav1.ConditionTrue {
		t.Errorf("ManagedCluster %s is %+v while Karmada's Cluster is not Ready, want not Available", member2, available)
	} else {
		f.Logf("ManagedCluster %s: Available %s (%s)", member2, available.Status, available.Reason)
	}

	t0 := run.Begin("member2's karmada-agent back")
	if err := f.Hub.Karmada.StartAgent(member2); err != nil {
		t.Fatal(err)
	}
	ready := waitKarmadaReady(t, ctx, f, member2, true, time.Minute)
	f.Logf("Karmada's Cluster %s Ready %.1fs after its karmada-agent started again", member2, ready.Sub(t0).Seconds())
	back := run.W.Ready("member2 back", t0, 90*time.Second, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return fleettest.ServesIn(sc, member1) && fleettest.ServesIn(sc, member2)
	})
	logPlacement(f, modes, back)
	f.CheckReconciledBy("member2 back", back, run.Objects, run.Domain)

	records := run.Finish()
	t.Logf("TestKarmadaFleetScope: %.1fs in all, %d reconciles, %d overlapping", time.Since(start).Seconds(), records.Reconciles, records.Overlaps)
}

// startKarmadaFleet starts the Karmada fleet of the tests: member1 joined
// push, member2 pull, the hub's API server with hubGates.
func startKarmadaFleet(t *testing.T, ctx context.Context, hubGates []string) *fleettest.Fleet {
	t.Helper()
	return fleettest.StartFleet(t, ctx, localfleet.Options{Members: []string{member1, member2}, HubFeatureGates: hubGates,
		Karmada: map[string]clusterv1alpha1.ClusterSyncMode{member1: clusterv1alpha1.Push, member2: clusterv1alpha1.Pull}})
}

// syncModes reads each member's sync mode back from Karmada's Cluster and
// checks it is the one it joined with.
func syncModes(t *testing.T, ctx context.Context, f *fleettest.Fleet) map[string]clusterv1alpha1.ClusterSyncMode {
	t.Helper()
	modes := map[string]clusterv1alpha1.ClusterSyncMode{}
	for _, m := range []string{member1, member2} {
		mode, err := f.KarmadaSyncMode(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		modes[m] = mode
	}
	if modes[member1] != clusterv1alpha1.Push || modes[member2] != clusterv1alpha1.Pull {
		t.Fatalf("Karmada's sync modes are %v, want %s %s and %s %s", modes, member1, clusterv1alpha1.Push, member2, clusterv1alpha1.Pull)
	}
	return modes
}

// waitKarmadaReady waits, within, until Karmada's Cluster of member is
// Ready (or not), and returns when that was seen.
func waitKarmadaReady(t *testing.T, ctx context.Context, f *fleettest.Fleet, member string, ready bool, within time.Duration) time.Time {
	t.Helper()
	env.Eventually(t, within, fmt.Sprintf("Karmada's Cluster %s Ready %t", member, ready), func() error {
		var cluster clusterv1alpha1.Cluster
		if err := f.Hub.Client.Get(ctx, client.ObjectKey{Name: member}, &cluster); err != nil {
			return err
		}
		if got := meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1alpha1.ClusterConditionReady); got != ready {
			return fmt.Errorf("conditions %v", cluster.Status.Conditions)
		}
		return nil
	})
	return time.Now()
}

// logPlacement logs each member's Karmada sync mode beside the placement.
func logPlacement(f *fleettest.Fleet, modes map[string]clusterv1alpha1.ClusterSyncMode, sc *ctrlmeshv1alpha1.ShardingConfig) {
	f.Logf("Karmada sync modes: %s %s, %s %s; placement:\n%s", member1, modes[member1], member2, modes[member2], fleettest.Placement(sc))
}

// checkKarmadaWorks checks that the hub's Work for each member carries
// Karmada's execution finalizer (the hub's to put on, with
// KarmadaFinalizer) and that Karmada reported it: Applied, and the
// ShardRoute Healthy through the shipped interpreter.
func checkKarmadaWorks(t *testing.T, ctx context.Context, f *fleettest.Fleet) {
	t.Helper()
	for _, m := range []string{member1, member2} {
		key := routework.WorkKey(m, fleettest.OpNamespace, fleettest.OpName)
		work := &workv1alpha1.Work{}
		env.Eventually(t, 30*time.Second, "Karmada's report of the Work of "+m, func() error {
			if err := f.Hub.Client.Get(ctx, key, work); err != nil {
				return err
			}
			report, err := routework.ReadStatus(work)
			if err != nil {
				return err
			}
			if report.Applied == nil || report.Health != workv1alpha1.ResourceHealthy {
				return fmt.Errorf("applied %+v, health %q", report.Applied, report.Health)
			}
			return nil
		})
		if !slices.Contains(work.Finalizers, util.ExecutionControllerFinalizer) {
			t.Errorf("Work %s has finalizers %v, want Karmada's execution finalizer", key, work.Finalizers)
		}
		f.Logf("Karmada's status of the Work of %s: conditions %v", m, work.Status.Conditions)
	}
}
