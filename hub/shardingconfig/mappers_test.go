package shardingconfig_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/shardingconfig"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestMappersCopyNoStatus maps a cluster change and another config's
// change to their ShardingConfigs, read from a cache as the hub reads them,
// while a config's status lists placementRows shards. The mappers run on
// every heartbeat and every change of what a config's members report, and
// need only names: a deep copy of each config's
// status (660 KB a config at 1000 member clusters, measured by
// bench-scale's heap profile: 137 MB in flight at 1000 x 20) would cost
// allocations in proportion to the placement. They must cost far fewer.
func TestMappersCopyNoStatus(t *testing.T) {
	ctx := t.Context()
	const placementRows = 2000
	ns := unique("mappers")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	sc := configOver(ns, ctrlmeshv1alpha1.ScopePerCluster, "m1")
	env.Create(t, ctx, hub.Client, sc)
	for i := range placementRows {
		sc.Status.Placement = append(sc.Status.Placement, ctrlmeshv1alpha1.ShardPlacement{
			Shard: fmt.Sprint(i % 4), Cluster: fmt.Sprintf("m%04d", i/4), Pods: []string{fmt.Sprintf("op-%d", i%4)},
			Buckets: fmt.Sprint(i % 32), State: ctrlmeshv1alpha1.ShardServing, Health: ctrlmeshv1alpha1.ShardHealthy,
		})
	}
	if err := hub.Client.Status().Update(ctx, sc); err != nil {
		t.Fatal(err)
	}

	c, err := cache.New(hub.Config, cache.Options{Scheme: fleet.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	cl, err := client.New(hub.Config, client.Options{Scheme: fleet.Scheme, Cache: &client.CacheOptions{Reader: c}})
	if err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the cache holding the config's placement", func() error {
		var got ctrlmeshv1alpha1.ShardingConfig
		if err := cl.Get(ctx, client.ObjectKeyFromObject(sc), &got); err != nil {
			return err
		}
		if len(got.Status.Placement) != placementRows {
			return fmt.Errorf("%d placement rows", len(got.Status.Placement))
		}
		return nil
	})

	r := &shardingconfig.Reconciler{Client: cl}
	want := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(sc)}
	other := &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"}}
	for _, tc := range []struct {
		name string
		maps func() []reconcile.Request
	}{
		{"a cluster change", func() []reconcile.Request { return r.AllConfigs(ctx, nil) }},
		{"another config's change", func() []reconcile.Request { return r.PeersOf(ctx, other) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.maps(); !slices.Contains(got, want) {
				t.Fatalf("mapped to %v, which lacks %v", got, want)
			}
			if allocs := testing.AllocsPerRun(10, func() { tc.maps() }); allocs >= placementRows/4 {
				t.Errorf("%.0f allocations to map %s with a config of %d placement rows: the configs' statuses are copied", allocs, tc.name, placementRows)
			}
		})
	}
	// A change of the other config's Work reconciles the other config
	// alone, not this one (TestWorkMapsToItsConfig).
	work := &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: "karmada-es-m1", Name: "w", Labels: map[string]string{
		ctrlmeshv1alpha1.WorkConfigNamespaceLabel: ns, ctrlmeshv1alpha1.WorkConfigNameLabel: other.Name}}}
	if got := shardingconfig.ConfigOfWork(ctx, work); slices.Contains(got, want) {
		t.Errorf("a Work of %s mapped to %v, which holds %v", other.Name, got, want)
	}
}

// TestWorkMapsToItsConfig: a Work's change reconciles the ShardingConfig
// whose rules it carries, and no other config of the namespace. Mapping
// it to every config of the namespace (as each config's overlaps read
// the others' reports) reconciled 100 configs at each member's report at
// 1000 members × 100 configs (make bench-scale); the others now learn of
// the reports through the model (TestOverlappingSelectorsReported).
func TestWorkMapsToItsConfig(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   []reconcile.Request
	}{
		{"a Work of a config", map[string]string{ctrlmeshv1alpha1.WorkConfigNamespaceLabel: "ops", ctrlmeshv1alpha1.WorkConfigNameLabel: "a"},
			[]reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: "ops", Name: "a"}}}},
		{"a Work without the config's name", map[string]string{ctrlmeshv1alpha1.WorkConfigNamespaceLabel: "ops"}, nil},
		{"a Work of no config", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			work := &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Namespace: "karmada-es-m1", Name: "w", Labels: tc.labels}}
			if got := shardingconfig.ConfigOfWork(t.Context(), work); !slices.Equal(got, tc.want) {
				t.Errorf("mapped to %v, want %v", got, tc.want)
			}
		})
	}
}
