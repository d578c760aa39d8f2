package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/fleettest"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// TestSubsetNamespaceRelabelled runs the demo operator in two members with
// two label-based subsets, "gold" and "silver" (pods labeled tier=gold or
// tier=silver, each serving the namespaces labeled the same), a pod of
// each in member1, the namespace team-a labeled tier=gold there. The gold
// pod serves exactly team-a, the silver pod nothing (its subset forms no
// shard: a subset with nothing to serve in a member once made the hub
// publish a new generation of that member's route on every reconcile,
// and the member never became Ready); then team-a is
// relabelled tier=silver in member1 while the writer keeps its objects
// changing: the silver pod serves it and the gold pod nothing, every object
// is reconciled by the pod the hub's status names, and no object is ever
// reconciled by two pods at once (the move is revoke-before-grant, through
// the agent's report of the relabel, in range mode). Member2, without
// subset pods, shards everything among its pods throughout.
func TestSubsetNamespaceRelabelled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts API servers and operator processes")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := fleettest.StartFleet(t, ctx, localfleet.Options{Members: []string{member1, member2}, MemberFeatureGates: []string{controlplane.FeatureShardedListAndWatch}})
	// A subset's pod left with nothing to serve is in no shard: its proxy
	// stops serving it, its operator loses its leader election and exits,
	// and is started again, as a kubelet would.
	f.RestartOperators = true
	objects := f.MemberObjects(t, ctx)
	const tier = "tier"
	relabel := func(value string) {
		t.Helper()
		patch := client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, tier, value))
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fleettest.CanaryNamespace}}
		if err := f.Members[member1].Client.Patch(ctx, ns, patch); err != nil {
			t.Fatal(err)
		}
	}
	relabel("gold")
	sc := fleettest.ShardingConfig(ctrlmeshv1alpha1.ScopePerCluster)
	for _, name := range []string{"gold", "silver"} {
		labels := map[string]string{tier: name}
		sc.Spec.Subsets = append(sc.Spec.Subsets, ctrlmeshv1alpha1.Subset{Name: name, Selector: metav1.LabelSelector{MatchLabels: labels},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: labels}})
	}
	f.AddPod(member1, member1+"-gold", false, map[string]string{tier: "gold"})
	f.AddPod(member1, member1+"-silver", false, map[string]string{tier: "silver"})

	// serves tells whether the subsets' shards in member1 serve exactly
	// these namespaces (no buckets) — a subset with none has no shard —
	// and no subset has a shard in member2.
	serves := func(gold, silver []string) func(*ctrlmeshv1alpha1.ShardingConfig) bool {
		return func(sc *ctrlmeshv1alpha1.ShardingConfig) bool {
			want := map[string][]string{"gold": gold, "silver": silver}
			for name, namespaces := range want {
				if len(namespaces) == 0 {
					// Nothing to serve: no shard, its pod stands by.
					if slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool { return p.Subset == name }) {
						return false
					}
					continue
				}
				if !slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
					return p.Subset == name && p.Cluster == member1 && p.State == ctrlmeshv1alpha1.ShardServing &&
						slices.Equal(p.Pods, []string{member1 + "-" + name}) && p.Buckets == "" && slices.Equal(p.Namespaces, namespaces)
				}) {
					return false
				}
			}
			return !slices.ContainsFunc(sc.Status.Placement, func(p ctrlmeshv1alpha1.ShardPlacement) bool {
				return p.Subset != "" && p.Cluster == member2
			})
		}
	}
	run, placed := f.Apply(sc, objects, fleettest.PerCluster, 90*time.Second, serves([]string{fleettest.CanaryNamespace}, nil))
	f.Logf("gold serves %s:\n%s", fleettest.CanaryNamespace, fleettest.Placement(placed))

	t0 := run.Begin("namespace relabelled")
	relabel("silver")
	moved := run.W.Ready("the silver pod serves the relabelled namespace", t0, fleettest.ReadyWithin, serves(nil, []string{fleettest.CanaryNamespace}))
	f.CheckReconciledBy("namespace relabelled", moved, objects, fleettest.PerCluster)
	f.Logf("silver serves %s:\n%s", fleettest.CanaryNamespace, fleettest.Placement(moved))
	run.Finish()
}
