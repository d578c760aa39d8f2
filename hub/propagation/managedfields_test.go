package propagation

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestWriterThroughLeanCache: the hub caches its objects without their
// managedFields (hub.Run, cache.TransformStripManagedFields), and its
// Writer updates Works from that cache; an update that omits managedFields
// keeps the server's, so the field ownership of others — here the member's
// agent, which writes the Work's status — survives the hub's rewrite, as
// does the status itself.
func TestWriterThroughLeanCache(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lean, err := cache.New(hub.Config, cache.Options{Scheme: fleet.Scheme, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = lean.Start(ctx) }()
	if !lean.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}
	direct := writerClient(t)
	cached, err := client.New(hub.Config, client.Options{Scheme: fleet.Scheme, Cache: &client.CacheOptions{Reader: lean}})
	if err != nil {
		t.Fatal(err)
	}
	writer := &Writer{Client: cached}
	cluster := newCluster(t, ctx, "lean")
	config := testConfig(unique("team-lean"), ctrlmeshv1alpha1.ScopePerCluster)
	if err := (&Writer{Client: direct}).Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 1)); err != nil {
		t.Fatal(err)
	}

	// The member's agent reports, as its own field manager.
	const agentManager = "member-agent"
	work := getWork(t, ctx, config, cluster)
	meta.SetStatusCondition(&work.Status.Conditions, metav1.Condition{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: "AppliedSuccessful"})
	if err := hub.Client.Status().Update(ctx, work, client.FieldOwner(agentManager)); err != nil {
		t.Fatal(err)
	}
	key := routework.WorkKey(cluster, config.Namespace, config.Name)
	env.Eventually(t, time.Minute, "the cache shows the report", func() error {
		var seen workv1alpha1.Work
		if err := lean.Get(ctx, key, &seen); err != nil {
			return err
		}
		if seen.ResourceVersion != work.ResourceVersion {
			return fmt.Errorf("cached resourceVersion %s, want %s", seen.ResourceVersion, work.ResourceVersion)
		}
		if len(seen.ManagedFields) != 0 {
			t.Fatalf("the cached Work has managedFields %v: the cache does not strip them", seen.ManagedFields)
		}
		return nil
	})

	if err := writer.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 2)); err != nil {
		t.Fatal(err)
	}
	updated := getWork(t, ctx, config, cluster)
	if updated.ResourceVersion == work.ResourceVersion || manifest(t, updated).Spec.RoutingGeneration != 2 {
		t.Fatalf("the Writer did not rewrite the Work with the new rules")
	}
	if !meta.IsStatusConditionTrue(updated.Status.Conditions, workv1alpha1.WorkApplied) {
		t.Errorf("the rewrite lost the agent's report: %+v", updated.Status.Conditions)
	}
	managers := func(w *workv1alpha1.Work) []string {
		var out []string
		for _, f := range w.ManagedFields {
			out = append(out, f.Manager+"/"+f.Subresource)
		}
		return out
	}
	if !slices.Contains(managers(updated), agentManager+"/status") {
		t.Errorf("after the rewrite from the lean cache the Work's managers are %v, want %s's status among them (were %v)", managers(updated), agentManager, managers(work))
	}
	if len(updated.ManagedFields) < len(work.ManagedFields) {
		t.Errorf("the rewrite dropped managedFields: %v, were %v", managers(updated), managers(work))
	}
}
