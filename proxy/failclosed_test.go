package proxy

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// scopesFunc is a rules.Scopes answering with a function.
type scopesFunc func(schema.GroupResource) (bool, error)

func (f scopesFunc) IsNamespaced(gr schema.GroupResource) (bool, error) { return f(gr) }

// TestDiscoveryErrorsFailClosed: a resource the rules shard that discovery
// cannot place — discovery failing, or not knowing the resource yet (a CRD
// installed after the proxy last asked) — is never passed through
// unnarrowed and unfenced: the operator gets a retryable error, and the API
// server never sees the request. Only a resource discovery knows to be
// cluster-scoped passes.
func TestDiscoveryErrorsFailClosed(t *testing.T) {
	var reached atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = w.Write([]byte(`{"kind":"List","apiVersion":"v1","items":[]}`))
	}))
	defer upstream.Close()
	tests := []struct {
		name       string
		scopes     scopesFunc
		path       string
		method     string
		wantStatus int
		wantPassed bool
	}{
		{"discovery fails on a list", func(schema.GroupResource) (bool, error) { return false, errors.New("connection refused") },
			"/api/v1/configmaps", http.MethodGet, http.StatusServiceUnavailable, false},
		{"discovery fails on a delete", func(schema.GroupResource) (bool, error) { return false, errors.New("connection refused") },
			"/api/v1/namespaces/team-a/configmaps/x", http.MethodDelete, http.StatusServiceUnavailable, false},
		{"unknown resource", func(gr schema.GroupResource) (bool, error) {
			return false, &meta.NoResourceMatchError{PartialResource: gr.WithVersion("")}
		}, "/apis/example.com/v1/namespaces/team-a/widgets", http.MethodGet, http.StatusNotFound, false},
		{"cluster-scoped resource", func(schema.GroupResource) (bool, error) { return false, nil },
			"/api/v1/configmaps", http.MethodGet, http.StatusOK, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Upstream: &rest.Config{Host: upstream.URL}, Scopes: tt.scopes, Log: testr.New(t)})
			if err != nil {
				t.Fatal(err)
			}
			p.SetRules(wildcardRules(t, "h1", "0-15"))
			before := reached.Load()
			req := httptest.NewRequest(tt.method, tt.path, nil)
			rec := httptest.NewRecorder()
			p.ServeHTTP(rec, req)
			if rec.Code != tt.wantStatus {
				t.Errorf("status %d, want %d: %s", rec.Code, tt.wantStatus, rec.Body)
			}
			if passed := reached.Load() != before; passed != tt.wantPassed {
				t.Errorf("reached the API server: %v, want %v", passed, tt.wantPassed)
			}
		})
	}
}

// wildcardRules are label-mode rules sharding every resource, under which
// pod "p" serves buckets of 32.
func wildcardRules(t *testing.T, hash, buckets string) *rules.Snapshot {
	t.Helper()
	snap, err := rules.Compile(&ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{
		RoutingGeneration: 1, RulesHash: hash, Buckets: 32,
		Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{"*"}, Resources: []string{"*"}}}}},
		Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: buckets, Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "p"}}}},
	}}, "p", rules.ModeLabel, nil)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}
