package shardingconfig_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
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
	other := types.NamespacedName{Namespace: ns, Name: "other"}
	for _, tc := range []struct {
		name string
		maps func() []reconcile.Request
	}{
		{"a cluster change", func() []reconcile.Request { return r.AllConfigs(ctx, nil) }},
		{"another config's change", func() []reconcile.Request {
			peers, err := r.PeersOf(ctx, other)
			if err != nil {
				t.Fatal(err)
			}
			return peers
		}},
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

// TestPeersToldAgainAfterAFailedList: a config whose view changed tells
// the other configs of its namespace; where their list fails, it fails
// closed. It forgets the view told, so that the view is news again, and
// reconciles the changed config itself after a delay, which tells again.
// Before, the failure was logged and dropped: the view stayed recorded as
// told, and the peers could go on placing a pod they now share.
func TestPeersToldAgainAfterAFailedList(t *testing.T) {
	ctx := t.Context()
	ns := unique("peers")
	env.Create(t, ctx, hub.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	peer := configOver(ns, ctrlmeshv1alpha1.ScopePerCluster, "m1")
	env.Create(t, ctx, hub.Client, peer)
	changed := types.NamespacedName{Namespace: ns, Name: "changed"}

	direct, err := client.NewWithWatch(hub.Config, client.Options{Scheme: fleet.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	failing := true
	cl := interceptor.NewClient(direct, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*ctrlmeshv1alpha1.ShardingConfigList); ok && failing {
				return errors.New("the cache is not serving")
			}
			return c.List(ctx, list, opts...)
		},
	})
	r := &shardingconfig.Reconciler{Client: cl}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	const view = 7
	if !r.ViewNews(changed, view) {
		t.Fatal("a first view is not news")
	}

	start := time.Now()
	r.TellPeers(ctx, changed, q)
	if q.Len() != 0 {
		t.Fatalf("%d requests queued at once after a failed list, want none before the retry's delay", q.Len())
	}
	env.Eventually(t, 5*time.Second, "a request queued after the failed list", func() error {
		if q.Len() == 0 {
			return errors.New("none queued")
		}
		return nil
	})
	got, _ := q.Get()
	q.Done(got)
	if got.NamespacedName != changed {
		t.Fatalf("queued %v after a failed list, want the changed config %v itself", got, changed)
	}
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Errorf("the changed config was queued again after %v: a failing list would spin", waited)
	}
	if !r.ViewNews(changed, view) {
		t.Error("the view is still recorded as told after a failed list: its next reconcile would not tell the peers")
	}

	failing = false
	r.TellPeers(ctx, changed, q)
	if got, _ := q.Get(); got.NamespacedName != client.ObjectKeyFromObject(peer) {
		t.Errorf("queued %v once the list works, want the peer %v", got, client.ObjectKeyFromObject(peer))
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
