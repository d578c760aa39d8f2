package propagation

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "open-cluster-management.io/api/cluster/v1"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestWriterThroughLeanCache: the hub caches its objects without their
// managedFields, and Works without their manifests (hub.Run,
// CacheOptions), and its Writer updates Works from that cache; an update
// that omits managedFields keeps the server's, so the field ownership of
// others — here the member's agent, which writes the Work's status —
// survives the hub's rewrite, as does the status itself; the rewrite
// carries the new manifests whole. The Writer knows the rules hash of the
// Works it wrote, which the cache cannot tell; a Writer that wrote none
// (a restarted hub's) knows them once it read them from the API server.
func TestWriterThroughLeanCache(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lean, cached := startCache(t, ctx, hubCache(t), nil)
	direct := writerClient(t)
	writer := &Writer{Client: cached, Reader: direct}
	cluster := newCluster(t, ctx, "lean")
	config := testConfig(unique("team-lean"), ctrlmeshv1alpha1.ScopePerCluster)
	if err := (&Writer{Client: direct}).Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 1)); err != nil {
		t.Fatal(err)
	}

	// The member's agent reports, as its own field manager.
	const agentManager = "member-agent"
	work := getWork(t, ctx, config, cluster)
	meta.SetStatusCondition(&work.Status.Conditions, metav1.Condition{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: "AppliedSuccessful"})
	reported := manifest(t, work)
	reported.Status = ctrlmeshv1alpha1.ShardRouteStatus{ObservedGeneration: 1, Pods: []ctrlmeshv1alpha1.PodRouteStatus{{Name: "op-0", Address: "10.0.0.1", Ready: true, AppliedRulesHash: reported.Spec.RulesHash}}}
	work.Status.ManifestStatuses = []workv1alpha1.ManifestStatus{routework.ManifestStatus(reported)}
	if err := hub.Client.Status().Update(ctx, work, client.FieldOwner(agentManager)); err != nil {
		t.Fatal(err)
	}
	wantReport, err := routework.ReadStatus(work)
	if err != nil {
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
		if len(seen.Spec.Workload.Manifests) != 0 {
			t.Fatalf("the cached Work has %d manifests: the cache does not strip them", len(seen.Spec.Workload.Manifests))
		}
		if st := seen.Status.ManifestStatuses[0].Status; st.Raw != nil || st.Object == nil {
			t.Fatalf("the cached Work's route status is raw (%d bytes): the cache does not decode it", len(st.Raw))
		}
		if got, err := routework.ReadStatus(&seen); err != nil || !equality.Semantic.DeepEqual(got, wantReport) {
			t.Fatalf("the cached Work reads %+v, %v; want %+v, as from the API server", got, err, wantReport)
		}
		return nil
	})

	// The Writer reads the cache's own Work, not a copy: writing it must
	// leave that object as it was.
	var own workv1alpha1.Work
	if err := lean.Get(ctx, key, &own, client.UnsafeDisableDeepCopy); err != nil {
		t.Fatal(err)
	}
	ownHash, ownLabels := own.Annotations[ctrlmeshv1alpha1.WorkRulesHashAnnotation], maps.Clone(own.Labels)
	if err := writer.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 2)); err != nil {
		t.Fatal(err)
	}
	if hash := own.Annotations[ctrlmeshv1alpha1.WorkRulesHashAnnotation]; hash != ownHash || !maps.Equal(own.Labels, ownLabels) {
		t.Errorf("the Writer changed the cache's own Work: rules hash %q, labels %v; were %q, %v", hash, own.Labels, ownHash, ownLabels)
	}
	updated := getWork(t, ctx, config, cluster)
	if updated.ResourceVersion == work.ResourceVersion || manifest(t, updated).Spec.RoutingGeneration != 2 {
		t.Fatalf("the Writer did not rewrite the Work with the new rules")
	}
	if !meta.IsStatusConditionTrue(updated.Status.Conditions, workv1alpha1.WorkApplied) {
		t.Errorf("the rewrite lost the agent's report: %+v", updated.Status.Conditions)
	}
	if got, err := routework.ReadStatus(updated); err != nil || !equality.Semantic.DeepEqual(got.Route, wantReport.Route) {
		t.Errorf("after the rewrite from the cache, the Work's route status reads %+v, %v; want %+v", got.Route, err, wantReport.Route)
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

	// What the cache shows of the Work, once it shows the rewrite.
	var seen workv1alpha1.Work
	env.Eventually(t, time.Minute, "the cache shows the rewrite", func() error {
		if err := lean.Get(ctx, key, &seen); err != nil {
			return err
		}
		if seen.ResourceVersion != updated.ResourceVersion {
			return fmt.Errorf("cached resourceVersion %s, want %s", seen.ResourceVersion, updated.ResourceVersion)
		}
		return nil
	})
	wantHash := manifest(t, updated).Spec.RulesHash
	if hash, ok := writer.Known(&seen); !ok || hash != wantHash {
		t.Errorf("the Writer that rewrote the Work knows its rules hash as %q (%t), want %q", hash, ok, wantHash)
	}
	restarted := &Writer{Client: cached, Reader: direct}
	if hash, ok := restarted.Known(&seen); ok {
		t.Errorf("a Writer that neither wrote nor read the Work knows its rules hash %q", hash)
	}
	read, err := restarted.ReadFromServer(ctx, config)
	if err != nil {
		t.Fatal(err)
	}
	if len(read) != 1 || manifest(t, &read[0]).Spec.RoutingGeneration != 2 {
		t.Fatalf("read from the API server: %d Works, want the one carrying generation 2", len(read))
	}
	if hash, ok := restarted.Known(&seen); !ok || hash != wantHash {
		t.Errorf("after reading the Work from the API server, the Writer knows its rules hash as %q (%t), want %q", hash, ok, wantHash)
	}
	// The cache lags behind the Writer's next write: the Work carries the
	// written rules, whatever the cache shows.
	third := singleShardRoute(t, config, cluster, 3)
	if err := restarted.Sync(ctx, config, cluster, third); err != nil {
		t.Fatal(err)
	}
	if hash, ok := restarted.Known(&seen); !ok || hash != third.Spec.RulesHash {
		t.Errorf("after writing generation 3, the Writer knows the cached Work of generation 2 to carry %q (%t), want %q", hash, ok, third.Spec.RulesHash)
	}
}

// BenchmarkSyncUnchanged is the Writer at each reconcile for a member whose
// Work carries the rules already, as most members' at most reconciles:
// read the member's ManagedCluster and Work from the hub's cache, find the
// rules there, write nothing. The Work holds a report of 4 pods.
func BenchmarkSyncUnchanged(b *testing.B) {
	ctx := b.Context()
	lean, cached := startCache(b, ctx, hubCache(b), nil)
	writer := &Writer{Client: cached, Reader: writerClient(b)}
	cluster := newCluster(b, ctx, "bench")
	env.Create(b, ctx, hub.Client, &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster}, Spec: clusterv1.ManagedClusterSpec{HubAcceptsClient: true}})
	config := testConfig(unique("team-bench"), ctrlmeshv1alpha1.ScopePerCluster)
	route := singleShardRoute(b, config, cluster, 1)
	if err := writer.Sync(ctx, config, cluster, route); err != nil {
		b.Fatal(err)
	}
	var work workv1alpha1.Work
	if err := hub.Client.Get(ctx, routework.WorkKey(cluster, config.Namespace, config.Name), &work); err != nil {
		b.Fatal(err)
	}
	meta.SetStatusCondition(&work.Status.Conditions, metav1.Condition{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: "AppliedSuccessful"})
	reported := route.DeepCopy()
	reported.Generation = 1
	reported.Status.ObservedGeneration = 1
	for i := range 4 {
		reported.Status.Pods = append(reported.Status.Pods, ctrlmeshv1alpha1.PodRouteStatus{Name: fmt.Sprintf("op-%d", i), Address: fmt.Sprintf("10.0.0.%d", i+1),
			Ready: true, Shard: "0", AppliedRulesHash: route.Spec.RulesHash})
	}
	work.Status.ManifestStatuses = []workv1alpha1.ManifestStatus{routework.ManifestStatus(reported)}
	if err := hub.Client.Status().Update(ctx, &work); err != nil {
		b.Fatal(err)
	}
	env.Eventually(b, time.Minute, "the cache shows the report", func() error {
		var seen workv1alpha1.Work
		if err := lean.Get(ctx, client.ObjectKeyFromObject(&work), &seen); err != nil {
			return err
		}
		if seen.ResourceVersion != work.ResourceVersion {
			return fmt.Errorf("cached resourceVersion %s, want %s", seen.ResourceVersion, work.ResourceVersion)
		}
		return nil
	})
	b.ReportAllocs()
	for b.Loop() {
		if err := writer.Sync(ctx, config, cluster, route); err != nil {
			b.Fatal(err)
		}
	}
	if after := getWork(b, ctx, config, cluster); after.ResourceVersion != work.ResourceVersion {
		b.Errorf("the Work was written: resourceVersion %s, was %s", after.ResourceVersion, work.ResourceVersion)
	}
}
