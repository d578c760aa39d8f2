package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// fenceSpace is the bucket space of the fence tests: shard "0" (pod "p")
// serves buckets 0-15, shard "1" (pod "q") 16-31.
var fenceSpace = sharding.MustSpace(32)

// fenceNamespace returns the first name prefix-N whose bucket is in the
// shard's half of the space.
func fenceNamespace(prefix string, shard0 bool) string {
	for i := 0; ; i++ {
		ns := fmt.Sprintf("%s-%d", prefix, i)
		if (fenceSpace.Bucket(ns) < 16) == shard0 {
			return ns
		}
	}
}

var (
	mine  = fenceNamespace("mine", true)
	their = fenceNamespace("their", false)
	// rulesNS holds the rules and the operator's lock; shard "1" serves it,
	// yet every shard takes its lock there.
	rulesNS = fenceNamespace("operators", false)
)

// fenceRoute shards every namespaced resource ("*" limits) and names the
// leader-election lock "demo".
func fenceRoute() *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: rulesNS, Name: "demo"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			RoutingGeneration: 1, RulesHash: "f1", Buckets: 32,
			Controller: &ctrlmeshv1alpha1.ControllerConfig{LeaderElectionName: "demo"},
			Limits:     ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{"*"}, Resources: []string{"*"}}}}},
			Shards: []ctrlmeshv1alpha1.RouteShard{
				{ID: "0", Buckets: "0-15", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "p"}}},
				{ID: "1", Buckets: "16-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "q"}}},
			},
		},
	}
}

// clusterScoped answers Scopes as kube-apiserver's discovery would for the
// resources of these tests.
var clusterScoped = scopesFunc(func(gr schema.GroupResource) (bool, error) {
	switch gr.Resource {
	case "namespaces", "nodes", "clusterroles":
		return false, nil
	}
	return true, nil
})

// recordingUpstream stands for kube-apiserver: it records the requests that
// reach it and answers 200, with an empty chunked stream for watches.
type recordingUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen []upstreamRequest
}

type upstreamRequest struct {
	method, path string
	query        url.Values
	body         string
}

func newRecordingUpstream(t testing.TB) *recordingUpstream {
	u := &recordingUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.seen = append(u.seen, upstreamRequest{method: r.Method, path: r.URL.Path, query: r.URL.Query(), body: string(body)})
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			return
		}
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Success"}`)
	}))
	t.Cleanup(u.Close)
	return u
}

// take returns the requests seen since the last take.
func (u *recordingUpstream) take() []upstreamRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	seen := u.seen
	u.seen = nil
	return seen
}

// fenceProxy is a proxy for pod "p" (shard "0") in mode, with fenceRoute
// in force, in front of upstream.
func fenceProxy(t testing.TB, upstream *recordingUpstream, mode rules.Mode, log logr.Logger) *Proxy {
	t.Helper()
	p, err := New(Config{Upstream: &rest.Config{Host: upstream.URL}, Scopes: clusterScoped, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := rules.Compile(fenceRoute(), "p", mode, clusterScoped)
	if err != nil {
		t.Fatal(err)
	}
	p.SetRules(snap)
	t.Cleanup(p.Stop)
	return p
}

// TestFenceRefusesWritesOutsideTheShard: every write path that changes an
// object of another shard is refused before it reaches the API server, and
// the same path in the pod's own namespace goes through; leader election
// keeps working in the rules' namespace, which another shard serves.
func TestFenceRefusesWritesOutsideTheShard(t *testing.T) {
	upstream := newRecordingUpstream(t)
	p := fenceProxy(t, upstream, rules.ModeLabel, testr.New(t))
	const (
		jsonType  = "application/json"
		applyType = "application/apply-patch+yaml"
		mergeType = "application/merge-patch+json"
	)
	named := func(name string) string { return fmt.Sprintf(`{"metadata":{"name":%q}}`, name) }
	lease := func(ns, name string) string {
		return fmt.Sprintf("/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s", ns, name)
	}
	tests := []struct {
		name                string
		method, path        string
		contentType, body   string
		wantCode            int
		wantPath, wantQuery string // what reaches the API server; "" for nothing
	}{
		// deletecollection
		{"deletecollection in another shard's namespace", http.MethodDelete, "/api/v1/namespaces/" + their + "/configmaps", "", "", 403, "", ""},
		{"deletecollection in the pod's namespace", http.MethodDelete, "/api/v1/namespaces/" + mine + "/configmaps", "", "", 200, "/api/v1/namespaces/" + mine + "/configmaps", ""},
		{"deletecollection across namespaces", http.MethodDelete, "/api/v1/configmaps", "", "", 403, "", ""},
		{"deletecollection of a custom resource across namespaces", http.MethodDelete, "/apis/example.com/v1/widgets", "", "", 403, "", ""},
		// subresources
		{"eviction in another shard's namespace", http.MethodPost, "/api/v1/namespaces/" + their + "/pods/p1/eviction", jsonType, `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"p1"}}`, 403, "", ""},
		{"eviction in the pod's namespace", http.MethodPost, "/api/v1/namespaces/" + mine + "/pods/p1/eviction", jsonType, `{"metadata":{"name":"p1"}}`, 200, "/api/v1/namespaces/" + mine + "/pods/p1/eviction", ""},
		{"status update in another shard's namespace", http.MethodPut, "/api/v1/namespaces/" + their + "/pods/p1/status", jsonType, named("p1"), 403, "", ""},
		{"status patch in another shard's namespace", http.MethodPatch, "/apis/apps/v1/namespaces/" + their + "/deployments/d/status", mergeType, `{}`, 403, "", ""},
		{"scale in another shard's namespace", http.MethodPut, "/apis/apps/v1/namespaces/" + their + "/deployments/d/scale", jsonType, named("d"), 403, "", ""},
		{"ephemeral containers in another shard's namespace", http.MethodPatch, "/api/v1/namespaces/" + their + "/pods/p1/ephemeralcontainers", mergeType, `{}`, 403, "", ""},
		{"status of a lock kind in another shard's namespace", http.MethodPut, "/api/v1/namespaces/" + their + "/configmaps/demo/status", jsonType, named("demo"), 403, "", ""},
		// dry run
		{"dry-run create in another shard's namespace", http.MethodPost, "/api/v1/namespaces/" + their + "/configmaps?dryRun=All", jsonType, named("x"), 403, "", ""},
		{"dry-run delete in another shard's namespace", http.MethodDelete, "/api/v1/namespaces/" + their + "/configmaps/x?dryRun=All", "", "", 403, "", ""},
		{"dry-run create in the pod's namespace", http.MethodPost, "/api/v1/namespaces/" + mine + "/configmaps?dryRun=All", jsonType, named("x"), 200, "/api/v1/namespaces/" + mine + "/configmaps", "dryRun=All"},
		// server-side apply
		{"apply in another shard's namespace", http.MethodPatch, "/apis/apps/v1/namespaces/" + their + "/deployments/d?fieldManager=op", applyType, "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n", 403, "", ""},
		{"apply of status in another shard's namespace", http.MethodPatch, "/apis/apps/v1/namespaces/" + their + "/deployments/d/status?fieldManager=op", applyType, "{}", 403, "", ""},
		{"apply in the pod's namespace", http.MethodPatch, "/apis/apps/v1/namespaces/" + mine + "/deployments/d?fieldManager=op", applyType, "{}", 200, "/apis/apps/v1/namespaces/" + mine + "/deployments/d", "fieldManager=op"},
		// Namespace objects belong to the shard that serves the namespace they name.
		{"update of another shard's Namespace", http.MethodPut, "/api/v1/namespaces/" + their, jsonType, named(their), 403, "", ""},
		{"patch of another shard's Namespace", http.MethodPatch, "/api/v1/namespaces/" + their, mergeType, `{"metadata":{"labels":{"x":"y"}}}`, 403, "", ""},
		{"apply of another shard's Namespace", http.MethodPatch, "/api/v1/namespaces/" + their + "?fieldManager=op", applyType, "{}", 403, "", ""},
		{"delete of another shard's Namespace", http.MethodDelete, "/api/v1/namespaces/" + their, "", "", 403, "", ""},
		{"finalize of another shard's Namespace", http.MethodPut, "/api/v1/namespaces/" + their + "/finalize", jsonType, named(their), 403, "", ""},
		{"status of another shard's Namespace", http.MethodPut, "/api/v1/namespaces/" + their + "/status", jsonType, named(their), 403, "", ""},
		{"create of another shard's Namespace", http.MethodPost, "/api/v1/namespaces", jsonType, named(their), 403, "", ""},
		{"create of a Namespace named by generateName", http.MethodPost, "/api/v1/namespaces", jsonType, `{"metadata":{"generateName":"x-"}}`, 403, "", ""},
		{"deletecollection of Namespaces", http.MethodDelete, "/api/v1/namespaces", "", "", 403, "", ""},
		{"create of the pod's Namespace", http.MethodPost, "/api/v1/namespaces", jsonType, named(mine), 200, "/api/v1/namespaces", ""},
		{"delete of the pod's Namespace", http.MethodDelete, "/api/v1/namespaces/" + mine, "", "", 200, "/api/v1/namespaces/" + mine, ""},
		{"get of another shard's Namespace", http.MethodGet, "/api/v1/namespaces/" + their, "", "", 200, "/api/v1/namespaces/" + their, ""},
		{"update of another cluster-scoped object", http.MethodPut, "/api/v1/nodes/n1", jsonType, named("n1"), 200, "/api/v1/nodes/n1", ""},
		// Objects named like the lock are the lock only where the lock may be.
		{"lease named like another shard's lock in another shard's namespace", http.MethodPut, lease(their, "demo---1"), jsonType, named("demo---1"), 403, "", ""},
		{"lease named like this shard's lock in another shard's namespace", http.MethodPut, lease(their, "demo---0"), jsonType, named("demo---0"), 403, "", ""},
		{"lease named like the lock created in another shard's namespace", http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/" + their + "/leases", jsonType, named("demo"), 403, "", ""},
		{"ConfigMap named like the lock in another shard's namespace", http.MethodPut, "/api/v1/namespaces/" + their + "/configmaps/demo", jsonType, named("demo"), 403, "", ""},
		{"ConfigMap named like the lock deleted in another shard's namespace", http.MethodDelete, "/api/v1/namespaces/" + their + "/configmaps/demo", "", "", 403, "", ""},
		{"another shard's lock in the rules' namespace", http.MethodPut, lease(rulesNS, "demo---1"), jsonType, named("demo---1"), 403, "", ""},
		{"another shard's lock deleted in the rules' namespace", http.MethodDelete, lease(rulesNS, "demo---1"), "", "", 403, "", ""},
		{"another shard's lock read in the rules' namespace", http.MethodGet, lease(rulesNS, "demo---1"), "", "", 200, lease(rulesNS, "demo---1"), ""},
		// Leader election.
		{"lock created in the rules' namespace", http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/" + rulesNS + "/leases", jsonType, named("demo"), 200, "/apis/coordination.k8s.io/v1/namespaces/" + rulesNS + "/leases", ""},
		{"lock read in the rules' namespace", http.MethodGet, lease(rulesNS, "demo"), "", "", 200, lease(rulesNS, "demo---0"), ""},
		{"lock renewed in the rules' namespace", http.MethodPut, lease(rulesNS, "demo---0"), jsonType, named("demo---0"), 200, lease(rulesNS, "demo---0"), ""},
		{"lock updated by its own name in the rules' namespace", http.MethodPut, lease(rulesNS, "demo"), jsonType, named("demo"), 200, lease(rulesNS, "demo---0"), ""},
		{"ConfigMap lock in the pod's namespace", http.MethodPut, "/api/v1/namespaces/" + mine + "/configmaps/demo", jsonType, named("demo"), 200, "/api/v1/namespaces/" + mine + "/configmaps/demo---0", ""},
		{"lock watched in another shard's namespace is an ordinary narrowed watch", http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/" + their + "/leases?watch=true&fieldSelector=metadata.name%3Ddemo", "", "", 200,
			"/apis/coordination.k8s.io/v1/namespaces/" + their + "/leases", "fieldSelector=metadata.name%3Ddemo&labelSelector=ctrlmesh.io%2Fsharding-hash+in+%280%2C1%2C10%2C11%2C12%2C13%2C14%2C15%2C2%2C3%2C4%2C5%2C6%2C7%2C8%2C9%29&watch=true"},
		{"lock watched in the rules' namespace", http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/" + rulesNS + "/leases?watch=true&fieldSelector=metadata.name%3Ddemo", "", "", 200,
			"/apis/coordination.k8s.io/v1/namespaces/" + rulesNS + "/leases", "fieldSelector=metadata.name%3Ddemo---0&watch=true"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			upstream.take()
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			req := httptest.NewRequest(tt.method, tt.path, body)
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			rec := httptest.NewRecorder()
			p.ServeHTTP(rec, req)
			if rec.Code != tt.wantCode {
				t.Errorf("status %d, want %d: %s", rec.Code, tt.wantCode, rec.Body)
			}
			seen := upstream.take()
			switch {
			case tt.wantPath == "" && len(seen) > 0:
				t.Errorf("reached the API server as %s %s?%s", seen[0].method, seen[0].path, seen[0].query.Encode())
			case tt.wantPath != "" && len(seen) != 1:
				t.Errorf("reached the API server %d times, want once", len(seen))
			case tt.wantPath != "":
				if got := seen[0].path; got != tt.wantPath {
					t.Errorf("reached the API server at %s, want %s", got, tt.wantPath)
				}
				if got := seen[0].query.Encode(); got != tt.wantQuery {
					t.Errorf("reached the API server with query %s, want %s", got, tt.wantQuery)
				}
			}
		})
	}
}

// FuzzFence: whatever request the operator sends, what reaches the API
// server never writes outside the shard, and never lists or watches a
// sharded resource unnarrowed. A write that reaches it is in a namespace
// the shard serves (for a Namespace, the one it names), or is this shard's
// own lock — by its renamed name — in a namespace that may hold the lock.
// A list or watch carries the shard's selector, or reads a shard's lock
// there.
func FuzzFence(f *testing.F) {
	methods := []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}
	for m := range methods {
		for _, path := range []string{
			"/api/v1/namespaces/" + their, "/api/v1/namespaces", "/api/v1/namespaces/" + their + "/finalize",
			"/api/v1/namespaces/" + their + "/configmaps/demo", "/api/v1/namespaces/" + rulesNS + "/configmaps/demo---1",
			"/apis/coordination.k8s.io/v1/namespaces/" + rulesNS + "/leases/demo", "/apis/coordination.k8s.io/v1/namespaces/" + their + "/leases",
			"/api/v1/namespaces/" + their + "/pods/p/eviction", "/apis/apps/v1/namespaces/" + their + "/deployments/d/status?dryRun=All",
			"/api/v1/configmaps?watch=true", "/apis/coordination.k8s.io/v1/namespaces/" + their + "/leases?fieldSelector=metadata.name%3Ddemo",
			"/api/v1/watch/namespaces/" + rulesNS + "/configmaps/demo",
		} {
			f.Add(uint8(m), path, "demo", false)
		}
	}
	f.Add(uint8(1), "/api/v1/namespaces", mine, false)
	f.Add(uint8(3), "/api/v1/namespaces/"+their+"?fieldManager=x", their, true)
	upstream := newRecordingUpstream(f)
	p := fenceProxy(f, upstream, rules.ModeLabel, logr.Discard())
	snap, _ := p.RulesInForce()
	own, err := snap.Ownership.LabelRequirements()
	if err != nil {
		f.Fatal(err)
	}
	infos := p.infos
	f.Fuzz(func(t *testing.T, m uint8, target, bodyName string, apply bool) {
		method := methods[int(m)%len(methods)]
		if !strings.HasPrefix(target, "/") {
			target = "/" + target
		}
		u, err := url.ParseRequestURI(target)
		if err != nil || u.Host != "" {
			t.Skip("not a request target")
		}
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{"name": bodyName}})
		if err != nil {
			t.Skip("a name JSON cannot hold")
		}
		req := httptest.NewRequest(method, "/", bytes.NewReader(body))
		req.URL, req.RequestURI = u, u.RequestURI()
		req.Header.Set("Content-Type", "application/json")
		if apply {
			req.Header.Set("Content-Type", "application/apply-patch+yaml")
		}
		upstream.take()
		p.ServeHTTP(httptest.NewRecorder(), req)
		for _, seen := range upstream.take() {
			out := &http.Request{Method: seen.method, URL: &url.URL{Path: seen.path, RawQuery: seen.query.Encode()}}
			info, err := infos.NewRequestInfo(out)
			if err != nil || !info.IsResourceRequest {
				continue
			}
			gr := schema.GroupResource{Group: info.APIGroup, Resource: info.Resource}
			if _, sharded := snap.LimitFor(gr); !sharded {
				t.Fatalf("every resource is sharded, %s is not", gr)
			}
			namespaced, _ := clusterScoped.IsNamespaced(gr)
			write := slices.Contains([]string{"create", "update", "patch", "delete", "deletecollection"}, info.Verb)
			name := info.Name
			if info.Verb == "create" {
				var obj struct {
					Metadata struct {
						Name string `json:"name"`
					} `json:"metadata"`
				}
				_ = json.Unmarshal([]byte(seen.body), &obj)
				name = obj.Metadata.Name
			}
			ownLock := isLockResource(gr) && info.Subresource == "" && name == "demo---0" && (info.Namespace == rulesNS || snap.Owns(info.Namespace))
			switch {
			case gr == namespacesResource && write:
				if info.Verb == "deletecollection" || !snap.Owns(name) {
					t.Fatalf("%s %s reached the API server as %s of Namespace %q, which shard 0 does not serve", method, target, info.Verb, name)
				}
			case !namespaced:
			case write:
				if !ownLock && (info.Namespace == "" || !snap.Owns(info.Namespace)) {
					t.Fatalf("%s %s reached the API server as %s of %s %q in namespace %q, outside shard 0", method, target, info.Verb, gr, name, info.Namespace)
				}
			case info.Verb == "list" || info.Verb == "watch":
				sel, err := labels.Parse(seen.query.Get("labelSelector"))
				if err != nil {
					t.Fatalf("%s %s reached the API server with labelSelector %q: %v", method, target, seen.query.Get("labelSelector"), err)
				}
				reqs, _ := sel.Requirements()
				lockRead := isLockResource(gr) && strings.HasPrefix(name, "demo---") && (info.Namespace == rulesNS || snap.Owns(info.Namespace))
				if !lockRead && !containsReq(reqs, own[0]) {
					t.Fatalf("%s %s reached the API server as a %s of %s not narrowed to shard 0: %s", method, target, info.Verb, gr, seen.query.Encode())
				}
			}
		}
	})
}
