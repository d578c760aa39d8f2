package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// TestShardedWatchesInFormatsTheProxyFrames: a sharded watch that asks for
// CBOR — which kube-apiserver serves with CBORServingAndStorage — or any
// other format the proxy cannot frame is served as JSON, so that a rules
// change still ends it with 410 Expired instead of leaving it open under
// the old selection.
func TestShardedWatchesInFormatsTheProxyFrames(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster := fleet.Cluster("range")
	seed(t, ctx, kubernetes.NewForConfigOrDie(cluster.Config))
	// The API server itself answers a CBOR watch in CBOR.
	direct := openWatch(t, ctx, cluster.Config, "application/cbor")
	if ct := direct.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/cbor") {
		t.Fatalf("kube-apiserver answers a CBOR watch as %q: the test would not ask for a format the proxy cannot frame", ct)
	}
	_ = direct.Body.Close()

	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, route("c1", 1, "0-15", "16-31"))
	a := startProxy(t, ctx, cluster.Config, "pod-a", rulesFile, rules.ModeRange)
	checkMetric(t, a.health, `ctrlmesh_proxy_rules_info{generation="1",hash="c1"`)
	var watches []*http.Response
	for _, accept := range []string{"application/cbor", "application/cbor-seq", "application/yaml", "application/cbor, application/json;q=0.5", "*/*"} {
		resp := openWatch(t, ctx, a.config, accept)
		defer func() { _ = resp.Body.Close() }()
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("a watch asking for %q came back as %q, want application/json", accept, ct)
		}
		watches = append(watches, resp)
	}

	writeRules(t, rulesFile, route("c2", 2, "8-15", "0-7,16-31"))
	for _, resp := range watches {
		ended := make(chan error, 1)
		go func() {
			dec := json.NewDecoder(bufio.NewReader(resp.Body))
			for {
				var ev struct {
					Type   string        `json:"type"`
					Object metav1.Status `json:"object"`
				}
				if err := dec.Decode(&ev); err != nil {
					ended <- err
					return
				}
				if ev.Type == "ERROR" {
					if ev.Object.Code != http.StatusGone {
						t.Errorf("the watch asking for %s ended with %+v, want 410", resp.Request.Header.Get("Accept"), ev.Object)
					}
					ended <- nil
					return
				}
			}
		}()
		select {
		case err := <-ended:
			if err != nil {
				t.Fatalf("the watch asking for %s broke: %v", resp.Request.Header.Get("Accept"), err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("the watch asking for %s was not ended by the rules change", resp.Request.Header.Get("Accept"))
		}
	}
}

// openWatch starts a watch of ConfigMaps across namespaces with the given
// Accept header.
func openWatch(t *testing.T, ctx context.Context, cfg *rest.Config, accept string) *http.Response {
	t.Helper()
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/api/v1/configmaps?watch=true", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", accept)
	resp, err := transport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		t.Fatalf("watch asking for %q: %s", accept, resp.Status)
	}
	return resp
}
