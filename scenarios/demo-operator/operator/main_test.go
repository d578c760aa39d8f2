package operator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// One API server for the package, started by the first test that needs it
// (the unit tests run without one) and stopped by TestMain.
var (
	fleetOnce sync.Once
	fleet     *env.Fleet
	fleetErr  error
)

func TestMain(m *testing.M) {
	// Logs go to stderr, which go test shows for failing packages (or with
	// -v). Setting the global logger also keeps controller-runtime from
	// warning that it was never set.
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	code := m.Run()
	if fleet != nil {
		if err := fleet.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// member returns the package's API server, starting it on first use.
func member(t *testing.T) *env.Cluster {
	t.Helper()
	fleetOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		start := time.Now()
		fleet, fleetErr = env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "member"}}})
		if fleetErr == nil {
			fmt.Fprintf(os.Stderr, "kube-apiserver serving after %s\n", time.Since(start).Round(time.Millisecond))
		}
	})
	if fleetErr != nil {
		t.Fatal(fleetErr)
	}
	return fleet.Cluster("member")
}

// Short leader-election timings for tests, still loose enough for -race on
// two cores.
const (
	testLeaseDuration = 3 * time.Second
	testRenewDeadline = 2 * time.Second
	testRetryPeriod   = 500 * time.Millisecond
)

// instance is one operator "pod" running in this process.
type instance struct {
	pod    string
	rec    *operator.MemoryRecorder
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's result, set before done closes
}

// startOperator runs operator.Run with opts (Config, Recorder, timings and
// Logger filled in when unset) until the test ends or stop is called.
func startOperator(t *testing.T, c *env.Cluster, opts operator.Options) *instance {
	t.Helper()
	if opts.Config == nil {
		opts.Config = c.Config
	}
	rec := &operator.MemoryRecorder{}
	if opts.Recorder == nil {
		opts.Recorder = rec
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = testLeaseDuration, testRenewDeadline, testRetryPeriod
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = ctrllog.Log.WithValues("pod", opts.PodName)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{pod: opts.PodName, rec: rec, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(in.done)
		in.err = operator.Run(ctx, opts)
	}()
	t.Cleanup(func() {
		if err := in.stop(); err != nil {
			t.Errorf("operator %s: %v", in.pod, err)
		}
	})
	return in
}

// stop cancels the operator and returns what Run returned. It may be called
// more than once.
func (in *instance) stop() error {
	in.cancel()
	select {
	case <-in.done:
		return in.err
	case <-time.After(time.Minute):
		return errors.New("did not stop within a minute")
	}
}

// running tells whether Run has not returned yet; if it has, its error.
func (in *instance) running() (bool, error) {
	select {
	case <-in.done:
		return false, in.err
	default:
		return true, nil
	}
}

// eventually polls cond every 100ms until it reports true or timeout
// passes; then it fails the test with cond's last explanation.
func eventually(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not after %s: %s", timeout, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// newNamespace creates a namespace with a generated name.
func newNamespace(t *testing.T, c *env.Cluster, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if err := c.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func managedLabels() map[string]string {
	return map[string]string{operator.ManagedLabel: operator.ManagedValue}
}

func newConfigMap(ns, name string, labels map[string]string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Data:       data,
	}
}

func mustCreate(t *testing.T, c *env.Cluster, cm *corev1.ConfigMap) {
	t.Helper()
	if err := c.Client.Create(context.Background(), cm); err != nil {
		t.Fatalf("creating ConfigMap %s/%s: %v", cm.Namespace, cm.Name, err)
	}
}

func getConfigMap(c *env.Cluster, ns, name string) (*corev1.ConfigMap, error) {
	var cm corev1.ConfigMap
	err := c.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &cm)
	return &cm, err
}

// waitReconciledBy waits until ns/name carries pod's reconciled-by
// annotation and the hash of its current data.
func waitReconciledBy(t *testing.T, c *env.Cluster, ns, name, pod string) *corev1.ConfigMap {
	t.Helper()
	var cm *corev1.ConfigMap
	eventually(t, 30*time.Second, func() (bool, string) {
		var err error
		if cm, err = getConfigMap(c, ns, name); err != nil {
			return false, err.Error()
		}
		got, hash := cm.Annotations[operator.ReconciledByAnnotation], cm.Annotations[operator.DataHashAnnotation]
		if got != pod || hash != operator.DataHash(cm) {
			return false, fmt.Sprintf("%s/%s: reconciled-by %q data-hash %q, want %q and %q", ns, name, got, hash, pod, operator.DataHash(cm))
		}
		return true, ""
	})
	return cm
}

// leaseHolder returns the holder identity of the Lease ns/name, or "".
func leaseHolder(c *env.Cluster, ns, name string) (string, error) {
	var lease coordinationv1.Lease
	if err := c.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &lease); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "", err
	}
	if lease.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *lease.Spec.HolderIdentity, nil
}

// recordsFor returns the records about objects in namespace ns.
func recordsFor(records []operator.Reconcile, ns string) []operator.Reconcile {
	var out []operator.Reconcile
	for _, r := range records {
		if r.Namespace == ns {
			out = append(out, r)
		}
	}
	return out
}
