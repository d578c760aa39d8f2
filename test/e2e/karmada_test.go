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
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
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
// A PerCluster ShardingConfig over both members becomes Ready with every
// bucket served and every object reconciled by the pod the hub's status
// names; a pod killed in member2 (pull) has its buckets healed; deleting
// the ShardingConfig makes Karmada remove the ShardRoutes from the members
// (the Work finalizer's life cycle is Karmada's); and no object is ever
// reconciled by two pods at once.
func TestKarmadaFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts API servers, Karmada and operator processes")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	f := fleettest.StartFleet(t, ctx, localfleet.Options{Members: []string{member1, member2},
		Karmada: map[string]clusterv1alpha1.ClusterSyncMode{member1: clusterv1alpha1.Push, member2: clusterv1alpha1.Pull}})
	// An operator whose proxy stops serving (its rules removed with the
	// ShardingConfig) loses its leader election and exits; the kubelet
	// would start it again.
	f.RestartOperators = true
	modes := map[string]clusterv1alpha1.ClusterSyncMode{}
	for _, m := range []string{member1, member2} {
		mode, err := f.KarmadaSyncMode(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		modes[m] = mode
		for i := range 2 {
			f.AddPod(m, fmt.Sprintf("%s-%d", m, i), false, nil)
		}
	}
	if modes[member1] != clusterv1alpha1.Push || modes[member2] != clusterv1alpha1.Pull {
		t.Fatalf("Karmada's sync modes are %v, want %s %s and %s %s", modes, member1, clusterv1alpha1.Push, member2, clusterv1alpha1.Pull)
	}
	var objects []fleettest.ClusterObjects
	for _, m := range []string{member1, member2} {
		c := f.Members[m].Client
		objects = append(objects, fleettest.ClusterObjects{Cluster: m, Client: c, Keys: fleettest.ManagedObjects(t, ctx, c)})
	}
	ownDomain := func(cluster string) string { return cluster }

	sc := fleettest.ShardingConfig(ctrlmeshv1alpha1.ScopePerCluster)
	env.Create(t, ctx, f.Hub.Client, sc)
	w := &fleettest.Waiter{F: f, Key: client.ObjectKeyFromObject(sc)}
	got := w.Ready("initial placement", time.Now(), 90*time.Second, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return fleettest.ServesIn(sc, member1) && fleettest.ServesIn(sc, member2)
	})
	logPlacement(f, modes, got)
	if got.Status.Shards != 4 {
		t.Errorf("%d shards, want 2 per member: %s", got.Status.Shards, fleettest.Placement(got))
	}
	f.CheckReconciledBy("initial placement", got, objects, ownDomain)
	checkKarmadaWorks(t, ctx, f)

	touching := fleettest.StartTouching(ctx, objects)
	defer touching.Stop()
	phases := []fleettest.Phase{{Name: "steady", Start: time.Now()}}
	time.Sleep(2 * time.Second)

	// A pod killed in the pull member: its buckets move to the other pod
	// there once its lease expires.
	victim := member2 + "-0"
	t0 := time.Now()
	phases = append(phases, fleettest.Phase{Name: "pod kill", Start: t0})
	f.Kill(victim)
	healed := w.Ready("pod kill", t0, fleettest.FailoverBound, func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
		return !fleettest.Placed(sc, victim)
	})
	logPlacement(f, modes, healed)
	f.CheckReconciledBy("pod kill", healed, objects, ownDomain)
	touching.Stop()

	// Deleting the ShardingConfig: the hub deletes its Works, and Karmada's
	// execution controller (push) or karmada-agent (pull) removes each
	// ShardRoute from its member before it lets the Work go.
	t0 = time.Now()
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

	records := f.Finish(touching, phases, ownDomain)
	t.Logf("TestKarmadaFleet: %.1fs in all, %d reconciles, %d overlapping", time.Since(start).Seconds(), records.Reconciles, records.Overlaps)
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
