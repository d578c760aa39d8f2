package env

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Create creates obj, leaving one that exists (tests that share a fleet
// create the same namespaces), and fails t on any other error.
func Create(t testing.TB, ctx context.Context, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

// pollInterval is how often Eventually checks.
const pollInterval = 100 * time.Millisecond

// Eventually calls check every pollInterval until it returns nil, and fails
// t with check's last error when within has passed.
func Eventually(t testing.TB, within time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(pollInterval)
	}
}

// Manager is what StartManager runs: a controller-runtime manager.
type Manager interface {
	Start(ctx context.Context) error
}

// StartManager runs mgr until the test ends or stop is called. ctx is the
// context it runs with, done once it is told to stop. stop, which the test's
// cleanup calls too, waits up to 30 s for mgr to return and fails t if it
// did not, or returned an error.
func StartManager(t testing.TB, mgr Manager) (ctx context.Context, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("manager: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("the manager did not stop within 30 s")
			}
		})
	}
	t.Cleanup(stop)
	return ctx, stop
}

// StartCluster starts one cluster named name (Start with default options)
// for t, stopped when t ends, and fails t if it cannot.
func StartCluster(t testing.TB, ctx context.Context, name string) *Cluster {
	t.Helper()
	fleet, err := Start(ctx, Options{Clusters: []ClusterSpec{{Name: name}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	})
	return fleet.Cluster(name)
}

// LiveHeap is the heap in use after a collection: what the benchmarks of
// the hub's memory per Work measure before and after filling a structure.
func LiveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
