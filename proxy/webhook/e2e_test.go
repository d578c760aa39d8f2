package webhook_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/proxy/webhook"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// testLabel selects the ConfigMaps the test's webhook sees.
const testLabel = "ctrlmesh.io/webhook-router-test"

// TestAdmissionThroughAPIServer registers a mutating webhook for ConfigMaps
// on a real kube-apiserver, pointed at pod-b's router. ConfigMaps created in
// namespaces of both shards are annotated by the operator of the owning pod;
// during a handover the API server refuses the creation (failurePolicy Fail),
// since the router never admits on its own.
func TestAdmissionThroughAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "c"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	cfg, cl := fleet.Cluster("c").Config, fleet.Cluster("c").Client

	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		t.Fatal(err)
	}
	scopes := rules.NewMapperScopes(mapper)

	// kube-apiserver calls the router at 127.0.0.1; pods verify each other
	// for the Service name.
	ca := newTestCA(t)
	certPEM, keyPEM := ca.issue(t, "webhook.test.svc", "127.0.0.1")
	certDir := t.TempDir()
	writeCertDir(t, certDir, certPEM, keyPEM, nil)
	operators := map[string]*standIn{
		"pod-a": startStandIn(t, "pod-a", certPEM, keyPEM),
		"pod-b": startStandIn(t, "pod-b", certPEM, keyPEM),
	}
	routers := map[string]*router{"pod-a": listenRouter(t, "pod-a"), "pod-b": listenRouter(t, "pod-b")}
	setRules := func(mutate func(*ctrlmeshv1alpha1.ShardRoute)) {
		route := twoShards(certDir, routers["pod-a"].addr(), routers["pod-b"].addr())
		if mutate != nil {
			mutate(route)
		}
		for pod, r := range routers {
			r.snap.Store(compileFor(t, route, pod, operators[pod].port(), scopes))
		}
	}
	setRules(nil)
	for _, r := range routers {
		r.serve(t, webhook.Options{})
	}

	namespaces := map[string][]string{
		"pod-a": {namespaceIn("shop-a", 0, 7), namespaceIn("shop-a", 8, 14)},
		"pod-b": {namespaceIn("shop-b", 16, 23), namespaceIn("shop-b", 24, 31)},
	}
	moving := namespaceIn("moving", 15, 15)
	for _, ns := range append(append(namespaces["pod-a"], namespaces["pod-b"]...), moving) {
		if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}

	sideEffects := admissionregistrationv1.SideEffectClassNone
	failurePolicy := admissionregistrationv1.Fail
	scope := admissionregistrationv1.NamespacedScope
	hook := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "ctrlmesh-webhook-router-test"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "annotate.webhook-router.ctrlmesh.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				URL:      ptr.To("https://" + routers["pod-b"].addr() + "/mutate-configmaps"),
				CABundle: ca.pem,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}, Scope: &scope,
				},
			}},
			FailurePolicy:           &failurePolicy,
			SideEffects:             &sideEffects,
			AdmissionReviewVersions: []string{"v1"},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{testLabel: "true"}},
			TimeoutSeconds:          ptr.To[int32](30),
		}},
	}
	if err := cl.Create(ctx, hook); err != nil {
		t.Fatal(err)
	}

	// The API server picks the configuration up asynchronously: create probes
	// in B's namespace until one is mutated.
	probeNS := namespaces["pod-b"][0]
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		cm := labeled(fmt.Sprintf("probe-%d", i), probeNS)
		if err := cl.Create(ctx, cm); err != nil {
			t.Fatalf("creating a probe: %v", err)
		}
		if cm.Annotations[answeredByAnnotation] != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the API server never called the webhook")
		}
		time.Sleep(200 * time.Millisecond)
	}

	forwardedBefore := routers["pod-b"].outcome(t, webhook.OutcomeForwarded)
	calledA := len(operators["pod-a"].requests())
	for owner, nss := range namespaces {
		for _, ns := range nss {
			cm := labeled("cm", ns)
			if err := cl.Create(ctx, cm); err != nil {
				t.Fatalf("creating a ConfigMap in %s: %v", ns, err)
			}
			// What the API server stored, not just what Create returned.
			var stored corev1.ConfigMap
			if err := cl.Get(ctx, client.ObjectKeyFromObject(cm), &stored); err != nil {
				t.Fatal(err)
			}
			if got := stored.Annotations[answeredByAnnotation]; got != owner {
				t.Errorf("ConfigMap in %s (bucket %d) annotated by %q, want %q", ns, routers[owner].snap.Load().Bucket(ns), got, owner)
			}
		}
	}
	if d := routers["pod-b"].outcome(t, webhook.OutcomeForwarded) - forwardedBefore; d != float64(len(namespaces["pod-a"])) {
		t.Errorf("pod-b forwarded %v requests, want %d", d, len(namespaces["pod-a"]))
	}
	if d := len(operators["pod-a"].requests()) - calledA; d != len(namespaces["pod-a"]) {
		t.Errorf("pod-a's operator answered %d requests, want %d", d, len(namespaces["pod-a"]))
	}

	// Handover: bucket 15 leaves shard a, pending for shard b. Nobody may
	// answer for it, so the API server applies failurePolicy Fail.
	setRules(func(r *ctrlmeshv1alpha1.ShardRoute) {
		r.Spec.RoutingGeneration = 2
		r.Spec.Shards[0].Buckets = "0-14"
		r.Spec.Shards[1].PendingBuckets = "15"
	})
	err = cl.Create(ctx, labeled("cm", moving))
	if err == nil {
		t.Fatal("a ConfigMap was admitted while its bucket had no owner")
	}
	if !strings.Contains(err.Error(), "no shard serves namespace") {
		t.Errorf("the refusal does not give the router's reason: %v", err)
	}
	t.Logf("refused during the handover, as it should be: %v", err)

	// The handover completes: shard b serves bucket 15.
	setRules(func(r *ctrlmeshv1alpha1.ShardRoute) {
		r.Spec.RoutingGeneration = 3
		r.Spec.Shards[0].Buckets = "0-14"
		r.Spec.Shards[1].Buckets = "15-31"
	})
	cm := labeled("cm", moving)
	if err := cl.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if got := cm.Annotations[answeredByAnnotation]; got != "pod-b" {
		t.Errorf("ConfigMap in %s annotated by %q after the handover, want pod-b", moving, got)
	}
}

func labeled(name, namespace string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: namespace, Labels: map[string]string{testLabel: "true"},
	}}
}
