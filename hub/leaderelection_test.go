package hub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// TestLeaderKeepsLeaseUnderLoad: the hub's controllers are held to a tiny
// client-side limit and given far more writes than it lets through (members
// to accept), and the elected hub still renews its Lease: it keeps leading,
// one holder renewing, for more than two lease durations. Before the leader
// election had a client of its own it inherited the controllers' limit (and
// their connection) and stepped down within seconds.
func TestLeaderKeepsLeaseUnderLoad(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	})
	hubCluster := fleet.Cluster("hub")
	const namespace = "ctrlmesh"
	identity, err := localfleet.PrepareHub(ctx, hubCluster, namespace)
	if err != nil {
		t.Fatal(err)
	}
	// Members waiting for acceptance: each costs the hub writes.
	for i := range 50 {
		env.Create(t, ctx, hubCluster.Client, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("m%02d", i)}})
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- hub.Run(runCtx, hub.Options{
			Config: identity, AutoAccept: true, LeaderElection: true, Namespace: namespace,
			// One request every ten seconds for the controllers: far below
			// the two the elector may need every retry period.
			QPS: 0.1, Burst: 1,
			MetricsAddress: "0", HealthAddress: "0", Log: logr.Discard(),
		})
	}()
	defer func() {
		stop()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("the hub did not stop within a minute")
		}
	}()

	lease := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: namespace, Name: hub.LeaderElectionID}
	env.Eventually(t, time.Minute, "the hub leads", func() error {
		if err := hubCluster.Client.Get(ctx, key, lease); err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return fmt.Errorf("Lease %s held by none", key)
		}
		return nil
	})
	holder := *lease.Spec.HolderIdentity
	duration := time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	start := time.Now()
	// Over two lease durations and more, the one leader keeps renewing: a
	// renewal older than a lease duration would let another replica take
	// over.
	for time.Since(start) < 2*duration+5*time.Second {
		select {
		case err := <-done:
			t.Fatalf("the hub stopped leading after %s: %v", time.Since(start).Round(time.Second), err)
		case <-time.After(time.Second):
		}
		if err := hubCluster.Client.Get(ctx, key, lease); err != nil {
			t.Fatal(err)
		}
		if got := lease.Spec.HolderIdentity; got == nil || *got != holder {
			t.Fatalf("Lease %s held by %v after %s, want %s still", key, got, time.Since(start).Round(time.Second), holder)
		}
		if age := time.Since(lease.Spec.RenewTime.Time); age > duration {
			t.Fatalf("Lease %s last renewed %s ago, more than its duration %s", key, age.Round(time.Second), duration)
		}
	}
}
