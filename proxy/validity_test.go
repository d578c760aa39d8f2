package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy"
)

// TestRulesValidity: Fleet-scope rules expire. A proxy serves them only
// once the agent granted one of its renewal requests, stops serving them —
// reads served empty (the operator's informers drop what they held),
// writes 403, leader election 503, /readyz failing — once the
// validity ran out since it sent the last granted request, and serves them
// again when granted again. A grant seen beside rules the proxy refused
// renews nothing: they are not the rules it holds, and the hub may have
// given those buckets elsewhere while the member was cut off.
func TestRulesValidity(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster := fleet.Cluster("label")
	admin := kubernetes.NewForConfigOrDie(cluster.Config)
	seed(t, ctx, admin)
	const rulesNS = "validity-rules"
	if err := cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rulesNS}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	const validity = 5 // seconds, the least the CRD allows
	r := route("v1", 1, "0-15", "16-31")
	r.Namespace, r.Spec.Scope, r.Spec.ValiditySeconds = rulesNS, ctrlmeshv1alpha1.ScopeFleet, validity
	if err := cluster.Client.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(r)
	a := runProxy(t, ctx, proxy.Options{Upstream: cluster.Config, Pod: "pod-a", RulesNamespace: rulesNS, RulesName: r.Name})
	operator := kubernetes.NewForConfigOrDie(noRetries(a.config))
	mine := owned("0-15")[0]
	// served is how many objects a sharded list gets; lapsed says whether
	// the proxy reports its rules not valid.
	served := func() (int, error) {
		list, err := operator.CoreV1().ConfigMaps(mine).List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, err
		}
		return len(list.Items), nil
	}
	lapsed := func() (bool, string) {
		n, err := served()
		status, body := get(t, a.health+"/readyz")
		return err == nil && n == 0 && status == http.StatusServiceUnavailable && strings.Contains(body, "not valid"),
			fmt.Sprintf("a sharded list: %d objects, %v; /readyz %d %q", n, err, status, body)
	}

	// Never granted: the rules are in force with the pod in no shard.
	eventually(t, "the proxy asks for a renewal", func() (bool, string) {
		request, _ := renewalOf(t, ctx, cluster.Client, key, "pod-a")
		return request != 0, "no renewalRequest in the status"
	})
	if ok, got := lapsed(); !ok {
		t.Fatalf("before any grant: %s, want an empty list and /readyz naming the validity", got)
	}

	// Granted: served, and the proxy asks again.
	first := grant(t, ctx, cluster.Client, key, "pod-a")
	granted := time.Now()
	waitReady(t, a.health, "v1")
	if n, err := served(); err != nil || n == 0 {
		t.Fatalf("sharded list once granted: %d objects, %v", n, err)
	}
	view := informerView(t, ctx, a.config, "application/json")
	eventually(t, "the informer fills", func() (bool, string) { return len(view()) > 0, "empty" })
	eventually(t, "the proxy asks again once granted", func() (bool, string) {
		request, _ := renewalOf(t, ctx, cluster.Client, key, "pod-a")
		return request != 0 && request != first, "still the granted request"
	})

	// No more grants: served no longer than the validity after the
	// request was sent (before it was granted).
	eventually(t, "sharded reads served empty once the validity ran out", lapsed)
	if served := time.Since(granted); served > validity*time.Second+2*time.Second {
		t.Errorf("served %s after the grant, want about the validity %ds", served, validity)
	}
	checkMetric(t, a.health, `ctrlmesh_proxy_validity_lapses_total 1`)
	checkMetric(t, a.health, `ctrlmesh_proxy_relists_forced_total{reason="rules-changed"}`)
	eventually(t, "the informer emptied once the validity ran out", func() (bool, string) {
		got := view()
		return len(got) == 0, fmt.Sprintf("the informer holds objects of %v", got)
	})
	_, err := operator.CoreV1().ConfigMaps(mine).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-lapse"}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "not valid") {
		t.Errorf("write after the lapse: %v, want 403 naming the validity", err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: rulesNS}}
	if _, err := operator.CoordinationV1().Leases(rulesNS).Create(ctx, lease, metav1.CreateOptions{}); !apierrors.IsServiceUnavailable(err) {
		t.Errorf("taking the leader-election lock after the lapse: %v, want 503", err)
	}
	if status, body := get(t, a.health+"/readyz"); status != http.StatusServiceUnavailable || !strings.Contains(body, "not valid") {
		t.Errorf("/readyz after the lapse: %d %q, want 503 naming the validity", status, body)
	}

	// Granted again: served again. A request asked for before the lapse
	// is valid only until shortly after it, so grants go on until then.
	stopRegranting := keepGranting(t, ctx, cluster.Client, key, "pod-a")
	eventually(t, "served again once granted", func() (bool, string) {
		n, err := served()
		return err == nil && n > 0, fmt.Sprintf("%d objects, %v", n, err)
	})
	stopRegranting()

	// Rules the proxy refuses arrive (a limit naming a resource the API
	// server does not serve), and the agent grants beside them: the
	// proxy keeps its last good rules, which lapse and stay lapsed.
	var bad ctrlmeshv1alpha1.ShardRoute
	if err := cluster.Client.Get(ctx, key, &bad); err != nil {
		t.Fatal(err)
	}
	bad.Spec.RoutingGeneration, bad.Spec.RulesHash = 2, "v2-refused"
	bad.Spec.Limits[0].RelateResources[0].Resources = []string{"nosuchresources"}
	if err := cluster.Client.Update(ctx, &bad); err != nil {
		t.Fatal(err)
	}
	checkMetric(t, a.health, `ctrlmesh_proxy_rules_loads_total{result="refused"} 1`)
	stopGranting := keepGranting(t, ctx, cluster.Client, key, "pod-a")
	eventually(t, "the last good rules lapse although grants go on beside refused ones", lapsed)
	time.Sleep(2 * time.Second)
	if ok, got := lapsed(); !ok {
		t.Errorf("while grants come beside refused rules: %s, want still lapsed", got)
	}
	stopGranting()
}

// renewalOf reads pod's renewal request and grant from the route's status.
func renewalOf(t *testing.T, ctx context.Context, c client.Client, key client.ObjectKey, pod string) (request, granted int64) {
	t.Helper()
	var r ctrlmeshv1alpha1.ShardRoute
	if err := c.Get(ctx, key, &r); err != nil {
		t.Fatal(err)
	}
	for _, p := range r.Status.Pods {
		if p.Name == pod {
			return p.RenewalRequest, p.RenewalGranted
		}
	}
	return 0, 0
}

// grant does what the agent does after a heartbeat: grants pod's current
// request. It returns the request granted.
func grant(t *testing.T, ctx context.Context, c client.Client, key client.ObjectKey, pod string) int64 {
	t.Helper()
	var request int64
	eventually(t, "granting "+pod+"'s renewal request", func() (bool, string) {
		var r ctrlmeshv1alpha1.ShardRoute
		if err := c.Get(ctx, key, &r); err != nil {
			return false, err.Error()
		}
		for i := range r.Status.Pods {
			if p := &r.Status.Pods[i]; p.Name == pod && p.RenewalRequest != 0 {
				request, p.RenewalGranted = p.RenewalRequest, p.RenewalRequest
				err := c.Status().Update(ctx, &r)
				return err == nil, errString(err)
			}
		}
		return false, "no request"
	})
	return request
}

// keepGranting grants pod's requests every half second until stopped.
func keepGranting(t *testing.T, ctx context.Context, c client.Client, key client.ObjectKey, pod string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var r ctrlmeshv1alpha1.ShardRoute
			if err := c.Get(ctx, key, &r); err == nil {
				for i := range r.Status.Pods {
					if p := &r.Status.Pods[i]; p.Name == pod && p.RenewalRequest != p.RenewalGranted {
						p.RenewalGranted = p.RenewalRequest
						_ = c.Status().Update(ctx, &r)
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return func() { cancel(); <-done }
}
