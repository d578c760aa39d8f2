package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
)

// TestDemoOperatorShardedByTwoProxies runs the unmodified demo operator as two
// pods, each behind its own proxy with disjoint buckets, in range and in
// label mode: each pod reconciles exactly its buckets and leads its own
// renamed lock; then buckets move at runtime, revoke before grant, and no
// object is reconciled by both pods.
func TestDemoOperatorShardedByTwoProxies(t *testing.T) {
	for _, tc := range []struct {
		cluster string
		mode    rules.Mode
	}{
		{"range", rules.ModeRange},
		{"label", rules.ModeLabel},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cluster := fleet.Cluster(tc.cluster)
			admin := kubernetes.NewForConfigOrDie(cluster.Config)
			seedManaged(t, ctx, admin)
			if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "operators"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}

			rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
			writeRules(t, rulesFile, operatorRoute("op1", 1, "0-15", "16-31"))
			proxies := map[string]*runningProxy{}
			recorders := map[string]*operator.MemoryRecorder{}
			done := make(chan error, 2)
			for _, pod := range []string{"pod-a", "pod-b"} {
				// The goroutine gets its own copies: the maps are written
				// while the other pod's operator runs.
				px, recorder := startProxy(t, ctx, cluster.Config, pod, rulesFile, tc.mode), &operator.MemoryRecorder{}
				proxies[pod], recorders[pod] = px, recorder
				go func() {
					done <- operator.Run(ctx, operator.Options{
						Config: px.config, PodName: pod,
						LeaderElectionID: "demo-op", LeaderElectionNamespace: "operators",
						LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond,
						HealthAddr: "0", MetricsAddr: "0",
						Recorder: recorder, ReconcileDelay: 20 * time.Millisecond,
						// controller-runtime goroutines may log after Run
						// returns, which a testr logger would turn into a
						// write to a finished test.
						Logger: logr.Discard(),
					})
				}()
			}

			owner := func(buckets map[string]string) func(ns string) string {
				return func(ns string) string {
					for pod, b := range buckets {
						if mustParse(t, b).HasNamespace(ns) {
							return pod
						}
					}
					return ""
				}
			}
			before := owner(map[string]string{"pod-a": "0-15", "pod-b": "16-31"})
			waitReconciledBy(t, ctx, admin, before)
			for shard, pod := range map[string]string{"0": "pod-a", "1": "pod-b"} {
				lease, err := admin.CoordinationV1().Leases("operators").Get(ctx, "demo-op---"+shard, metav1.GetOptions{})
				if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != pod {
					t.Fatalf("lease demo-op---%s: %v, holder %v; want %s", shard, err, lease.Spec.HolderIdentity, pod)
				}
			}
			if _, err := admin.CoordinationV1().Leases("operators").Get(ctx, "demo-op", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("the unrenamed lock exists: %v", err)
			}
			for pod, rec := range recorders {
				for _, r := range rec.Records() {
					if before(r.Namespace) != pod {
						t.Fatalf("%s reconciled %s/%s, which belongs to %s", pod, r.Namespace, r.Name, before(r.Namespace))
					}
				}
			}

			// Move buckets 0-7 from pod-a to pod-b as the hub does: revoke
			// first, and grant once pod-a reports the revocation applied —
			// its proxy enforces it and its operator has relisted under it.
			revoke := operatorRoute("op2", 2, "8-15", "16-31")
			revoke.Spec.Shards[1].PendingBuckets = "0-7"
			writeRules(t, rulesFile, revoke)
			waitReady(t, proxies["pod-a"].health, "op2")
			switched := time.Now()
			writeRules(t, rulesFile, operatorRoute("op3", 3, "8-15", "0-7,16-31"))
			waitReady(t, proxies["pod-b"].health, "op3")
			after := owner(map[string]string{"pod-a": "8-15", "pod-b": "0-7,16-31"})
			waitReconciledBy(t, ctx, admin, after)

			moved := owned("0-7")
			if len(moved) == 0 {
				t.Fatal("no namespace in the moved buckets")
			}
			csA := kubernetes.NewForConfigOrDie(proxies["pod-a"].config)
			if _, err := csA.CoreV1().ConfigMaps(moved[0]).Patch(ctx, "managed", "application/merge-patch+json", []byte(`{"metadata":{"annotations":{"x":"y"}}}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
				t.Fatalf("pod-a's write to moved namespace %s: %v, want 403", moved[0], err)
			}

			// Once pod-a has applied the revocation its cache no longer holds
			// the moved objects: controller-runtime may still hand it their
			// deletions, which it finds absent, and nothing else.
			var all []operator.Reconcile
			late := map[operator.Outcome]int{}
			for pod, rec := range recorders {
				records := rec.Records()
				all = append(all, records...)
				for _, r := range records {
					if pod == "pod-a" && r.Start.After(switched) && after(r.Namespace) != pod {
						late[r.Outcome]++
					}
				}
			}
			if overlaps := operator.Overlaps(all); len(overlaps) > 0 {
				t.Fatalf("%d objects reconciled by both pods at once, first: %+v", len(overlaps), overlaps[0])
			}
			for outcome, n := range late {
				if outcome != operator.OutcomeAbsent {
					t.Errorf("after applying the revocation pod-a reconciled %d moved objects with outcome %q", n, outcome)
				}
			}
			t.Logf("%d reconciles in all, none overlapping; %d namespaces moved from pod-a to pod-b; pod-a's runs on moved objects after the switch by outcome: %v",
				len(all), len(moved), late)

			// Both operators are still running and leading their shards.
			select {
			case err := <-done:
				t.Fatalf("an operator stopped: %v", err)
			default:
			}
			cancel()
			for range 2 {
				if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("operator: %v", err)
				}
			}
		})
	}
}

func mustParse(t *testing.T, buckets string) sharding.Set {
	t.Helper()
	set, err := scheme32.ParseSet(buckets)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func operatorRoute(hash string, generation int64, bucketsA, bucketsB string) *ctrlmeshv1alpha1.ShardRoute {
	r := route(hash, generation, bucketsA, bucketsB)
	r.Spec.Controller.LeaderElectionName = "demo-op"
	r.Spec.Limits[0].Selector = nil
	return r
}

// seedManaged creates one ConfigMap for the demo operator in each namespace.
func seedManaged(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
	t.Helper()
	seed(t, ctx, cs)
	for i := 0; i < namespaces; i++ {
		ns := nsName(i)
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "managed", Namespace: ns, Labels: map[string]string{
				operator.ManagedLabel:              operator.ManagedValue,
				ctrlmeshv1alpha1.ShardingHashLabel: sharding.LabelValue(scheme32.Bucket(ns)),
				ctrlmeshv1alpha1.NamespaceLabel:    ns,
			}},
			Data: map[string]string{"n": fmt.Sprint(i)},
		}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// waitReconciledBy waits until every managed ConfigMap carries the
// reconciled-by annotation of the pod that owns its namespace.
func waitReconciledBy(t *testing.T, ctx context.Context, cs kubernetes.Interface, owner func(string) string) {
	t.Helper()
	eventually(t, "every managed ConfigMap reconciled by its owner", func() (bool, string) {
		list, err := cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: operator.ManagedLabel + "=" + operator.ManagedValue})
		if err != nil {
			return false, err.Error()
		}
		if len(list.Items) != namespaces {
			return false, fmt.Sprintf("%d managed ConfigMaps", len(list.Items))
		}
		for _, cm := range list.Items {
			if got, want := cm.Annotations[operator.ReconciledByAnnotation], owner(cm.Namespace); got != want {
				return false, fmt.Sprintf("%s reconciled by %q, want %q", cm.Namespace, got, want)
			}
		}
		return true, ""
	})
}

func waitReady(t *testing.T, health, hash string) {
	t.Helper()
	eventually(t, "proxy enforces "+hash, func() (bool, string) {
		resp, err := http.Get(health + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), "rules "+hash+" "), string(body)
	})
}
