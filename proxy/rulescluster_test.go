package proxy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy"
)

// TestRulesClusterApartFromUpstream: with Fleet scope over the hub's
// objects the operator's upstream (cluster "range", standing for the hub) is
// not the pod's own cluster ("label", standing for the member). The proxy
// follows its ShardRoute in the pod's cluster and reports its applied hash
// there, and takes the shard's leader-election lock there too, where the
// member's agent reads it; the operator's objects, its other leases and the
// selector mode come from the upstream.
func TestRulesClusterApartFromUpstream(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hub, member := fleet.Cluster("range"), fleet.Cluster("label")
	hubCS, memberCS := kubernetes.NewForConfigOrDie(hub.Config), kubernetes.NewForConfigOrDie(member.Config)

	// A namespace of pod-a's shard (buckets 0-15), in both clusters, so a
	// request sent to the wrong one would succeed there rather than fail.
	ns := ""
	for i := 0; ns == ""; i++ {
		if name := fmt.Sprintf("fleet-scope-%d", i); scheme32.Bucket(name) <= 15 {
			ns = name
		}
	}
	const rulesNS = "fleet-rules"
	for _, cs := range []kubernetes.Interface{hubCS, memberCS} {
		for _, name := range []string{ns, rulesNS} {
			if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
	}
	for cs, name := range map[kubernetes.Interface]string{hubCS: "only-on-hub", memberCS: "only-on-member"} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "demo"}}}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	r := route("f1", 1, "0-15", "16-31")
	r.Namespace = rulesNS
	if err := member.Client.Create(ctx, r); err != nil {
		t.Fatal(err)
	}

	// Mode "" detects it upstream: range, which only the hub supports.
	a := runProxy(t, ctx, proxy.Options{
		Upstream: hub.Config, OwnCluster: member.Config, Pod: "pod-a", RulesNamespace: rulesNS, RulesName: r.Name,
	})
	awaitReported(t, ctx, member.Client, client.ObjectKeyFromObject(r), "pod-a", "f1")
	waitReady(t, a.health, "f1")
	checkMetric(t, a.health, `ctrlmesh_proxy_rules_info{generation="1",hash="f1",mode="range",shard="0"} 1`)
	if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(r), &ctrlmeshv1alpha1.ShardRoute{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a ShardRoute %s exists on the upstream: %v", client.ObjectKeyFromObject(r), err)
	}

	// The sharded list is served from the upstream.
	operator := kubernetes.NewForConfigOrDie(a.config)
	list, err := operator.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != "only-on-hub" {
		t.Fatalf("the operator lists %v in %s, want only only-on-hub", list.Items, ns)
	}

	// The operator takes its lock with client-go leader election: the
	// shard's lock is taken in the pod's cluster.
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: ns, Name: "demo"},
		Client:     operator.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: "pod-a"},
	}
	leading, stoppedLeading := make(chan struct{}), make(chan struct{})
	electCtx, stopElection := context.WithCancel(ctx)
	elected := make(chan struct{})
	go func() {
		defer close(elected)
		leaderelection.RunOrDie(electCtx, leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond,
			ReleaseOnCancel: false,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { close(leading) },
				OnStoppedLeading: func() { close(stoppedLeading) },
			},
		})
	}()
	defer func() {
		stopElection()
		<-elected
	}()
	select {
	case <-leading:
	case <-time.After(20 * time.Second):
		t.Fatal("the operator did not become leader through the proxy")
	}
	stored, err := memberCS.CoordinationV1().Leases(ns).Get(ctx, "demo---0", metav1.GetOptions{})
	if err != nil || stored.Spec.HolderIdentity == nil || *stored.Spec.HolderIdentity != "pod-a" || stored.Spec.RenewTime == nil {
		t.Fatalf("the shard's lock in the pod's cluster: %v %v", err, stored)
	}
	// Renewals address the lock by its renamed name, as the responses
	// carry it: they must reach the pod's cluster too.
	acquired := stored.Spec.RenewTime.Time
	eventually(t, "the operator renews the shard's lock in the pod's cluster", func() (bool, string) {
		got, err := memberCS.CoordinationV1().Leases(ns).Get(ctx, "demo---0", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Spec.RenewTime.After(acquired) && *got.Spec.HolderIdentity == "pod-a", fmt.Sprintf("lease spec %+v", got.Spec)
	})
	select {
	case <-stoppedLeading:
		t.Fatal("the operator lost its lock")
	default:
	}
	for _, name := range []string{"demo---0", "demo"} {
		if _, err := hubCS.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("lease %s/%s exists on the upstream: %v", ns, name, err)
		}
	}
	if _, err := memberCS.CoordinationV1().Leases(ns).Get(ctx, "demo", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the unrenamed lock exists in the pod's cluster: %v", err)
	}

	// Other leases are the operator's objects: they go upstream.
	other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns}}
	if _, err := operator.CoordinationV1().Leases(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := hubCS.CoordinationV1().Leases(ns).Get(ctx, "other", metav1.GetOptions{}); err != nil {
		t.Fatalf("another lease is not on the upstream: %v", err)
	}
	if _, err := memberCS.CoordinationV1().Leases(ns).Get(ctx, "other", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("another lease went to the pod's cluster: %v", err)
	}
}
