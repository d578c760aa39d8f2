package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

// startupNamespace holds the Works a hub's start is measured with.
const startupNamespace = "scalebench-startup"

// startup is what a hub's start cost with works Works on the API server,
// its informers filling their cache from a list read whole (as client-go
// does by default) and from a streamed watch (WatchListClient, as the hub
// ships): the peak RSS until the cache settled and the live heap then.
type startup struct {
	works        int
	list, stream startCost
}

// startCost is one start's peak RSS, live heap once settled, and the time
// until it settled.
type startCost struct {
	peak, heap int64
	settle     time.Duration
}

// measureStartup creates works Works as the hub writes them once placed
// (manifests and a member's status, the ceiling's template), starts the
// hub twice in turn, once reading lists whole and once streaming them, and
// deletes the Works. The Works carry no config's labels: the hub only
// caches them, which is the cost measured.
func (b *bench) measureStartup(ctx context.Context, works int, dir string) (*startup, error) {
	c := b.admin
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: startupNamespace}}); err != nil {
		return nil, err
	}
	config := newConfig(startupNamespace, configName(0), ctrlmeshv1alpha1.ScopePerCluster, memberLabel)
	if err := c.Create(ctx, config, client.DryRunAll); err != nil {
		return nil, err
	}
	placed, rbac, status, err := templateWork(config, b.opts.pods)
	if err != nil {
		return nil, err
	}
	if _, err := writeAll(ctx, works, func(i int) error {
		w := routework.NewWork(client.ObjectKey{Namespace: startupNamespace, Name: fmt.Sprintf("startup-%06d", i)})
		if err := routework.SetManifests(w, placed, rbac); err != nil {
			return err
		}
		if err := c.Create(ctx, w); err != nil {
			return err
		}
		w.Status = *status.DeepCopy()
		return c.Status().Update(ctx, w)
	}); err != nil {
		return nil, fmt.Errorf("creating the Works a start is measured with: %w", err)
	}
	out := &startup{works: works}
	if out.list, err = b.measureStart(ctx, works, "list", hub.WatchListEnv+"=false", dir); err != nil {
		return nil, err
	}
	if out.stream, err = b.measureStart(ctx, works, "stream", hub.WatchListEnv+"=true", dir); err != nil {
		return nil, err
	}
	if err := deleteStartupWorks(ctx, c); err != nil {
		return nil, fmt.Errorf("deleting the Works a start was measured with: %w", err)
	}
	return out, nil
}

// deleteStartupWorks deletes the Works a start was measured with. At
// 100,000 Works the API server takes longer than its request timeout (60
// s) to delete them all: it answers 504, or resets the stream, and goes on
// deleting. The deletion is asked again for as long as each attempt leaves
// fewer Works than the one before.
func deleteStartupWorks(ctx context.Context, c client.Client) error {
	left := int64(math.MaxInt64)
	for {
		err := c.DeleteAllOf(ctx, &workv1alpha1.Work{}, client.InNamespace(startupNamespace))
		if err == nil {
			return nil
		}
		var works workv1alpha1.WorkList
		if listErr := c.List(ctx, &works, client.InNamespace(startupNamespace), client.Limit(1)); listErr != nil {
			return errors.Join(err, listErr)
		}
		now := int64(len(works.Items))
		if works.RemainingItemCount != nil {
			now += *works.RemainingItemCount
		}
		if now == 0 {
			return nil
		}
		if now >= left {
			return fmt.Errorf("%d Works left, no fewer than after the attempt before: %w", now, err)
		}
		left = now
	}
}

// measureStart starts a replica named for way with env added, waits until
// it settled, reads its peak RSS and live heap, and stops it.
func (b *bench) measureStart(ctx context.Context, works int, way, env, dir string) (cost startCost, err error) {
	h, err := startHub(b.hubBin, b.kubecf, hubNamespace, "startup-"+way, filepath.Join(dir, "startup-"+way+".log"),
		b.opts.hubArgs, append(memoryEnv(b.opts.hubMemoryLimit), env))
	if err != nil {
		return cost, err
	}
	defer func() {
		if stopErr := h.stop(30 * time.Second); err == nil {
			err = stopErr
		}
		if err != nil {
			err = fmt.Errorf("the hub's start, lists read %s: %w", way, err)
		}
	}()
	start := time.Now()
	if err := awaitSettled(ctx, h); err != nil {
		return cost, err
	}
	cost.settle = time.Since(start)
	if _, cost.peak, err = h.memory(); err != nil {
		return cost, err
	}
	if cost.heap, err = h.heapProfile(ctx, filepath.Join(dir, "startup-"+way+".heap")); err != nil {
		return cost, err
	}
	b.logf("hub start with %d Works, lists read %s: peak RSS %d MiB, live heap %.1f MB, settled after %s",
		works, way, cost.peak>>20, float64(cost.heap)/1e6, cost.settle.Round(time.Second))
	return cost, nil
}

// awaitSettled waits until the replica's peak RSS has not grown for 15 s
// (its caches filled: with no config the hub has nothing else to do),
// within 5 min.
func awaitSettled(ctx context.Context, h *hubProcess) error {
	const still, within = 15 * time.Second, 5 * time.Minute
	deadline := time.Now().Add(within)
	var last int64
	since := time.Now()
	for time.Now().Before(deadline) {
		if err := h.exited(); err != nil {
			return err
		}
		_, peak, err := h.memory()
		if err != nil {
			return err
		}
		if peak != last {
			last, since = peak, time.Now()
		} else if time.Since(since) >= still {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("%w after %s: %s's peak RSS still growing", errTimeout, within, h.name)
}
