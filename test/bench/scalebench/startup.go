package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

// startupNamespace holds the Works a hub's start is measured with.
const startupNamespace = "scalebench-startup"

// startup is what a hub's start cost with works Works on the API server,
// its informers filling their cache from a list read whole (as client-go
// does by default) and from a streamed watch (WatchListClient, as the hub
// ships): the peak RSS until the cache settled and the live heap then.
type startup struct {
	works                    int
	listPeak, streamPeak     int64
	listHeap, streamHeap     int64
	listSettle, streamSettle time.Duration
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
	for _, way := range []struct {
		name       string
		env        string
		peak, heap *int64
		settle     *time.Duration
	}{
		{"list", watchListEnv + "=false", &out.listPeak, &out.listHeap, &out.listSettle},
		{"stream", watchListEnv + "=true", &out.streamPeak, &out.streamHeap, &out.streamSettle},
	} {
		h, err := startHub(b.hubBin, b.kubecf, hubNamespace, "startup-"+way.name, filepath.Join(dir, "startup-"+way.name+".log"),
			b.opts.hubArgs, append(memoryEnv(b.opts.hubMemoryLimit), way.env))
		if err != nil {
			return nil, err
		}
		start := time.Now()
		err = awaitSettled(ctx, h)
		*way.settle = time.Since(start)
		if err == nil {
			_, *way.peak, err = h.memory()
		}
		if err == nil {
			*way.heap, err = h.heapProfile(ctx, filepath.Join(dir, "startup-"+way.name+".heap"))
		}
		if stopErr := h.stop(30 * time.Second); err == nil {
			err = stopErr
		}
		if err != nil {
			return nil, fmt.Errorf("the hub's start, lists read %s: %w", way.name, err)
		}
		b.logf("hub start with %d Works, lists read %s: peak RSS %d MiB, live heap %.1f MB, settled after %s",
			works, way.name, *way.peak>>20, float64(*way.heap)/1e6, way.settle.Round(time.Second))
	}
	if err := c.DeleteAllOf(ctx, &workv1alpha1.Work{}, client.InNamespace(startupNamespace)); err != nil {
		return nil, fmt.Errorf("deleting the Works a start was measured with: %w", err)
	}
	return out, nil
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
