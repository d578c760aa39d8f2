package proxy_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// flakyScopes is discovery that fails its first calls, then answers that
// every resource is namespaced.
type flakyScopes struct{ failures atomic.Int32 }

func (f *flakyScopes) IsNamespaced(schema.GroupResource) (bool, error) {
	if f.failures.Add(-1) >= 0 {
		return false, errors.New("the server is currently unable to handle the request")
	}
	return true, nil
}

// TestRulesRetriedAfterDiscoveryErrors: rules that did not compile because
// discovery failed are offered again, and put in force once discovery
// answers — not refused for good, which would leave the proxy on its old
// rules and stall the hub's handover until the next generation.
func TestRulesRetriedAfterDiscoveryErrors(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster := fleet.Cluster("label")
	c := cluster.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "retry-rules"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	r := route("r1", 1, "0-15", "16-31")
	r.Namespace = "retry-rules"
	if err := c.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	scopes := &flakyScopes{}
	scopes.failures.Store(2)
	p, err := proxy.New(proxy.Config{Upstream: cluster.Config, Scopes: scopes, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	source := &proxy.APISource{Config: cluster.Config, Namespace: r.Namespace, Name: r.Name, Loader: &proxy.Loader{
		Proxy: p, Pod: "pod-a", Scopes: scopes, Mode: rules.ModeLabel, Log: testr.New(t),
	}}
	errc := make(chan error, 1)
	go func() { errc <- source.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if snap, _ := p.Applied(); snap != nil && snap.Hash() == "r1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rules not in force 30 s after discovery recovered (%d failures left)", scopes.failures.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
