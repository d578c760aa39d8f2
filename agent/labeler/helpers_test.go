package labeler_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/ctrlmesh/ctrlmesh/agent/labeler"
	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// testSelectorKey labels each test's namespaces, so each test's targets
// control its namespaces only.
const testSelectorKey = "labeler-test"

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func clients(t *testing.T) (*kubernetes.Clientset, dynamic.Interface) {
	t.Helper()
	if apiServer == nil {
		t.Fatal("no API server: TestMain starts one, except for fuzzing runs, which run no test")
	}
	cs, err := kubernetes.NewForConfig(apiServer)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(apiServer)
	if err != nil {
		t.Fatal(err)
	}
	return cs, dyn
}

// targetsFor controls the ConfigMaps of the namespaces labeled
// labeler-test=<test>.
func targetsFor(test string) labeler.Targets {
	return labeler.Targets{
		Resources:         []schema.GroupVersionResource{configMaps},
		Space:             sharding.MustSpace(32),
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{testSelectorKey: test}},
	}
}

func createNamespace(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// forEach runs f on 0..n-1 with a bounded pool of workers and returns the
// first error.
func forEach(n, workers int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// wantLabels is extra plus the three labels of ns, computed independently of
// the package under test.
func wantLabels(ns string, extra map[string]string) map[string]string {
	out := maps.Clone(extra)
	if out == nil {
		out = map[string]string{}
	}
	out[ctrlmeshv1alpha1.ShardingHashLabel] = sharding.LabelValue(sharding.MustSpace(32).Bucket(ns))
	out[ctrlmeshv1alpha1.NamespaceLabel] = ns
	out[ctrlmeshv1alpha1.ControlLabel] = "true"
	return out
}

// checkLabeled reports how cm's labels differ from wantLabels.
func checkLabeled(cm *corev1.ConfigMap, extra map[string]string) error {
	if want := wantLabels(cm.Namespace, extra); !maps.Equal(cm.Labels, want) {
		return fmt.Errorf("%s/%s: labels %v, want %v", cm.Namespace, cm.Name, cm.Labels, want)
	}
	return nil
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "resource" && l.GetValue() == "v1/configmaps" {
					if m.Gauge != nil {
						return m.GetGauge().GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("metric %s{resource=%q} not found", name, "v1/configmaps")
	return 0
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
