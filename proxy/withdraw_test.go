package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy"
)

// TestDeletedShardRouteStopsServing: when the ShardRoute a proxy follows is
// deleted (its ShardingConfig deleted, or the member deselected) the proxy
// does not go on with its last rules, nor fall back to passing everything:
// sharded reads are served empty, so that the operator's informers drop
// what they held (its open watches end), writes get 403, leader election
// 503, /readyz fails. A ShardRoute of that name put back
// is served again.
func TestDeletedShardRouteStopsServing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster := fleet.Cluster("label")
	admin := kubernetes.NewForConfigOrDie(cluster.Config)
	seed(t, ctx, admin)
	const rulesNS = "withdrawn-rules"
	if err := cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rulesNS}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	r := route("w1", 1, "0-15", "16-31")
	r.Namespace = rulesNS
	if err := cluster.Client.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	a := runProxy(t, ctx, proxy.Options{Upstream: cluster.Config, Pod: "pod-a", RulesNamespace: rulesNS, RulesName: r.Name})
	waitReady(t, a.health, "w1")
	operator := kubernetes.NewForConfigOrDie(noRetries(a.config))
	mine := owned("0-15")[0]
	view := informerView(t, ctx, a.config, "application/json")
	if got := view(); len(got) == 0 {
		t.Fatal("the operator's informer sees nothing before the deletion")
	}

	if err := cluster.Client.Delete(ctx, r); err != nil {
		t.Fatal(err)
	}
	// The informer's watch, opened under the rules, was ended, and it
	// relisted empty.
	eventually(t, "the informer emptied once the ShardRoute is deleted", func() (bool, string) {
		got := view()
		return len(got) == 0, fmt.Sprintf("the informer holds objects of %v", got)
	})
	checkMetric(t, a.health, `ctrlmesh_proxy_relists_forced_total{reason="rules-changed"}`)
	for _, ns := range []string{mine, ""} {
		list, err := operator.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 0 {
			t.Errorf("list in %q after the deletion: %d objects, %v, want an empty list", ns, len(list.Items), err)
		}
	}
	_, err := operator.CoreV1().ConfigMaps(mine).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-withdrawal"}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "deleted") || !strings.Contains(err.Error(), ctrlmeshv1alpha1.EnableProxyLabel) {
		t.Errorf("write in the pod's former namespace after the deletion: %v, want 403 naming the deletion and how to run without ctrlmesh", err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: rulesNS}}
	if _, err := operator.CoordinationV1().Leases(rulesNS).Create(ctx, lease, metav1.CreateOptions{}); !apierrors.IsServiceUnavailable(err) {
		t.Errorf("taking the leader-election lock after the deletion: %v, want 503", err)
	}
	if status, body := get(t, a.health+"/readyz"); status != http.StatusServiceUnavailable || !strings.Contains(body, "deleted") {
		t.Errorf("/readyz after the deletion: %d %q, want 503 naming the deletion", status, body)
	}
	// What the rules never sharded is not the proxy's to refuse.
	if _, err := operator.CoreV1().Secrets(mine).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("listing an unsharded resource after the deletion: %v", err)
	}

	// Put back (a new object: generation 1 again), it is served again.
	back := route("w2", 1, "0-15", "16-31")
	back.Namespace = rulesNS
	if err := cluster.Client.Create(ctx, back); err != nil {
		t.Fatal(err)
	}
	waitReady(t, a.health, "w2")
	awaitReported(t, ctx, cluster.Client, client.ObjectKeyFromObject(back), "pod-a", "w2")
	eventually(t, "the informer fills again once the ShardRoute is back", func() (bool, string) {
		got := view()
		return slices.Equal(got, owned("0-15")), fmt.Sprintf("the informer sees %v, want %v", got, owned("0-15"))
	})
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}
