package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/placement"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// ceilingWriters are the concurrent clients of the ceiling: enough to keep
// the API server busy on every core, as the hub's workers and a thousand
// agents would.
const ceilingWriters = 64

// ceilingNamespace holds the ceiling's Works; no hub runs while they exist.
const ceilingNamespace = "scalebench-ceiling"

// ceiling is how many Work writes a second the run's API server takes at
// most, measured on it before the hub starts: ceilingWriters clients with no
// client-side limit create Works like the run's, update each as the hub
// does when it places pods, write each one's status as a member's agent
// does, and delete them.
type ceiling struct {
	works int
	// bytes is one Work's size in JSON, spec and status.
	bytes int
	// creates, updates and statuses are per second.
	creates, updates, statuses float64
}

// floor is the shortest time from applying the ShardingConfigs to Ready
// that the ceiling allows for works Works: each is created (by the hub),
// reported on (the member's pods, by its agent), updated (the hub places
// the pods), and reported on again (the proxies enforce the rules), and
// every write waits its turn at the API server.
func (c *ceiling) floor(works int) time.Duration {
	perWork := 1/c.creates + 1/c.updates + 2/c.statuses
	return time.Duration(float64(works) * perWork * float64(time.Second))
}

// measureCeiling measures the ceiling with works Works of a PerCluster
// ShardingConfig's route for pods pods.
func measureCeiling(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, works, pods int) (*ceiling, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	cfg.UserAgent = "scalebench-ceiling"
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ceilingNamespace}}); err != nil {
		return nil, err
	}
	// The run's config as the API server defaults it, not kept.
	config := newConfig(ceilingNamespace, configName(0), ctrlmeshv1alpha1.ScopePerCluster, memberLabel)
	if err := c.Create(ctx, config, client.DryRunAll); err != nil {
		return nil, err
	}
	placed, rbac, status, err := templateWork(config, pods)
	if err != nil {
		return nil, err
	}
	empty, err := templateRoute(config, pods, false)
	if err != nil {
		return nil, err
	}
	name := func(i int) string { return fmt.Sprintf("ceiling-%06d", i) }
	objs := make([]*workv1alpha1.Work, works)
	result := &ceiling{works: works}

	if result.creates, err = writeAll(ctx, works, func(i int) error {
		w := routework.NewWork(client.ObjectKey{Namespace: ceilingNamespace, Name: name(i)})
		if err := routework.SetManifests(w, empty, rbac); err != nil {
			return err
		}
		objs[i] = w
		return c.Create(ctx, w)
	}); err != nil {
		return nil, fmt.Errorf("creating Works: %w", err)
	}
	if result.updates, err = writeAll(ctx, works, func(i int) error {
		if err := routework.SetManifests(objs[i], placed, rbac); err != nil {
			return err
		}
		return c.Update(ctx, objs[i])
	}); err != nil {
		return nil, fmt.Errorf("updating Works: %w", err)
	}
	if result.statuses, err = writeAll(ctx, works, func(i int) error {
		objs[i].Status = *status.DeepCopy()
		return c.Status().Update(ctx, objs[i])
	}); err != nil {
		return nil, fmt.Errorf("writing the Works' status: %w", err)
	}
	data, err := json.Marshal(objs[0])
	if err != nil {
		return nil, err
	}
	result.bytes = len(data)
	if err := c.DeleteAllOf(ctx, &workv1alpha1.Work{}, client.InNamespace(ceilingNamespace)); err != nil {
		return nil, fmt.Errorf("deleting the ceiling's Works: %w", err)
	}
	return result, nil
}

// writeAll runs write for 0..n-1 on ceilingWriters goroutines and returns
// the writes per second; the first error ends it.
func writeAll(ctx context.Context, n int, write func(i int) error) (float64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range ceilingWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := write(i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// templateWork is what a Work of config carries once its pods are placed
// in a member of pods pods: the route (its status the member's report),
// the labeler's RBAC, and the Work's status as the member's agent writes
// it.
func templateWork(config *ctrlmeshv1alpha1.ShardingConfig, pods int) (*ctrlmeshv1alpha1.ShardRoute, *routework.LabelerRBAC, workv1alpha1.WorkStatus, error) {
	placed, err := templateRoute(config, pods, true)
	if err != nil {
		return nil, nil, workv1alpha1.WorkStatus{}, err
	}
	rbac, _ := routework.NewLabelerRBAC(placed.Namespace, placed.Name, placed.Spec.Limits, agentNamespace)
	placed.Status = memberStatus(&ctrlmeshv1alpha1.ShardRouteStatus{}, placed, pods, nil, placed.Spec.RulesHash)
	status := workv1alpha1.WorkStatus{ManifestStatuses: []workv1alpha1.ManifestStatus{routework.ManifestStatus(placed)}}
	meta.SetStatusCondition(&status.Conditions, workApplied(0))
	return placed, rbac, status, nil
}

// templateRoute is the route the hub publishes for config, a PerCluster
// config of the run, in one member with pods pods: before they report
// (placed false: no shard) or once placed, each serving a shard of its own,
// as placement.Compute and route.Build make it.
func templateRoute(config *ctrlmeshv1alpha1.ShardingConfig, pods int, placed bool) (*ctrlmeshv1alpha1.ShardRoute, error) {
	const cluster = "m0000"
	space, err := sharding.NewSpace(int(config.Spec.Sharding.Buckets))
	if err != nil {
		return nil, err
	}
	in := placement.Input{Space: space, PodsPerShard: int(config.Spec.Sharding.PodsPerShard)}
	if placed {
		for i := range pods {
			in.Pods = append(in.Pods, placement.Pod{PodID: route.PodID{Cluster: cluster, Name: podName(config.Name, i)}, Ready: true})
		}
	}
	desired, err := placement.Compute(in)
	if err != nil {
		return nil, err
	}
	step, err := placement.Handover(desired, route.Table{}, nil)
	if err != nil {
		return nil, err
	}
	addresses := map[route.PodID]string{}
	for i, p := range in.Pods {
		addresses[p.PodID] = fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
	}
	// The hub publishes the table without pods first (generation 1), and
	// the placed one next.
	table := step.Table
	table.Generation = 1
	if placed {
		table.Generation = 2
	}
	r, err := route.Build(config, cluster, table, addresses, 0)
	if err != nil {
		return nil, err
	}
	r.Generation = 1
	return r, nil
}
