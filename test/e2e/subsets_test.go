package e2e_test

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/fleettest"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// TestSubsets runs the demo operator in two members with a subset "v2"
// (pods labeled version=v2) that serves buckets 0-3 and the namespace
// team-a. A v2 pod started in member1 is given exactly that, the other
// pods shard the rest, and member2, without a v2 pod, shards everything
// among its pods; then the subset's rules change to buckets 8-11 only.
// Every object is reconciled by the pod the hub's status names after each
// step, and no object is ever reconciled by two pods at once, through the
// subset's arrival and the change of its rules (range mode).
func TestSubsets(t *testing.T) {
	if testing.Short() {
		t.Skip("starts API servers and operator processes")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := fleettest.StartFleet(t, ctx, localfleet.Options{Members: []string{member1, member2}, MemberFeatureGates: []string{controlplane.FeatureShardedListAndWatch}})
	objects := f.MemberObjects(t, ctx)
	sc := fleettest.ShardingConfig(ctrlmeshv1alpha1.ScopePerCluster)
	v2 := map[string]string{"version": "v2"}
	sc.Spec.Subsets = []ctrlmeshv1alpha1.Subset{{Name: "v2", Selector: metav1.LabelSelector{MatchLabels: v2},
		Buckets: "0-3", Namespaces: []string{fleettest.CanaryNamespace}}}
	run, _ := f.Apply(sc, objects, fleettest.PerCluster, 90*time.Second, nil)

	servesExactly := func(buckets string, namespaces []string) func(*ctrlmeshv1alpha1.ShardingConfig) bool {
		return func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
			return slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
				return p.Subset == "v2" && p.Shard == "v2" && p.Cluster == member1 && p.State == ctrlmeshv1alpha1.ShardServing &&
					slices.Equal(p.Pods, []string{member1 + "-v2"}) && p.Buckets == buckets && slices.Equal(p.Namespaces, namespaces)
			}) && !slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
				return p.Subset != "" && p.Cluster == member2
			})
		}
	}
	t0 := run.Begin("subset pod")
	f.AddPod(member1, member1+"-v2", false, v2)
	placed := run.W.Ready("the v2 pod serves its subset", t0, fleettest.ReadyWithin, servesExactly("0-3", []string{fleettest.CanaryNamespace}))
	f.CheckReconciledBy("subset placed", placed, objects, fleettest.PerCluster)
	f.Logf("subset placed:\n%s", fleettest.Placement(placed))

	t1 := run.Begin("subset rules changed")
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur ctrlmeshv1alpha1.ShardingConfig
		if err := f.Hub.Client.Get(ctx, client.ObjectKeyFromObject(sc), &cur); err != nil {
			return err
		}
		cur.Spec.Subsets[0].Buckets, cur.Spec.Subsets[0].Namespaces = "8-11", nil
		return f.Hub.Client.Update(ctx, &cur)
	})
	if err != nil {
		t.Fatal(err)
	}
	changed := run.W.Ready("the v2 pod serves the subset's new rules", t1, fleettest.ReadyWithin, servesExactly("8-11", nil))
	f.CheckReconciledBy("subset rules changed", changed, objects, fleettest.PerCluster)
	f.Logf("subset rules changed:\n%s", fleettest.Placement(changed))
	run.Finish()
}
