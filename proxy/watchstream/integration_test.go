package watchstream

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// watchEnd is what a proxied watch's Copy returned.
type watchEnd struct {
	namespace string
	res       Result
	err       error
}

// testProxy is a minimal reverse proxy in front of a real kube-apiserver
// whose WATCH responses on namespaced ConfigMaps go through WrapResponse, and
// so Copy. It counts LIST and WATCH requests per namespace and can end the
// watches of a namespace in two ways: expire (the 410 ERROR event) and cut
// (the upstream connection closes, as a proxy without this package would).
type testProxy struct {
	rp   *httputil.ReverseProxy
	ends chan watchEnd

	mu           sync.Mutex
	lists        map[string]int
	watches      map[string]int
	expire       map[string]chan string
	active       map[string]map[io.Closer]bool // upstream bodies of open watches
	contentTypes map[string]map[string]bool    // Content-Type (and Content-Encoding) of watch responses
}

func newTestProxy(t *testing.T, upstream *url.URL, transport http.RoundTripper) *testProxy {
	p := &testProxy{
		ends:         make(chan watchEnd, 64),
		lists:        map[string]int{},
		watches:      map[string]int{},
		expire:       map[string]chan string{},
		active:       map[string]map[io.Closer]bool{},
		contentTypes: map[string]map[string]bool{},
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        func(r *httputil.ProxyRequest) { r.SetURL(upstream) },
		Transport:      transport,
		ModifyResponse: p.modifyResponse,
		ErrorLog:       log.New(testLogWriter{t}, "reverse proxy: ", 0),
	}
	return p
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// configMapNamespace returns the namespace of a request on
// /api/v1/namespaces/NS/configmaps, or "".
func configMapNamespace(r *http.Request) string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method != http.MethodGet || len(parts) != 5 || parts[0] != "api" || parts[2] != "namespaces" || parts[4] != "configmaps" {
		return ""
	}
	return parts[3]
}

// isWatch is how kube-apiserver tells a WATCH from a LIST.
func isWatch(r *http.Request) bool {
	v := strings.ToLower(r.URL.Query().Get("watch"))
	return v != "" && v != "false" && v != "0"
}

func (p *testProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if ns := configMapNamespace(r); ns != "" {
		p.mu.Lock()
		if isWatch(r) {
			p.watches[ns]++
		} else {
			p.lists[ns]++
		}
		p.mu.Unlock()
	}
	p.rp.ServeHTTP(w, r)
}

func (p *testProxy) modifyResponse(resp *http.Response) error {
	ns := configMapNamespace(resp.Request)
	if ns == "" || !isWatch(resp.Request) || resp.StatusCode != http.StatusOK {
		return nil
	}
	upstream := resp.Body
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.contentTypes[ns] == nil {
		p.contentTypes[ns] = map[string]bool{}
	}
	p.contentTypes[ns][resp.Header.Get("Content-Type")+" encoding="+resp.Header.Get("Content-Encoding")] = true
	if p.expire[ns] == nil {
		p.expire[ns] = make(chan string)
	}
	if p.active[ns] == nil {
		p.active[ns] = map[io.Closer]bool{}
	}
	wrapped := WrapResponse(resp, p.expire[ns], nil, func(res Result, err error) {
		p.mu.Lock()
		delete(p.active[ns], upstream)
		p.mu.Unlock()
		p.ends <- watchEnd{ns, res, err}
	})
	if !wrapped {
		return fmt.Errorf("watch response not wrapped: Content-Type %q, Content-Encoding %q, Content-Length %d",
			resp.Header.Get("Content-Type"), resp.Header.Get("Content-Encoding"), resp.ContentLength)
	}
	p.active[ns][upstream] = true
	return nil
}

func (p *testProxy) counts(ns string) (lists, watches, active int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lists[ns], p.watches[ns], len(p.active[ns])
}

// expireWatches ends the namespace's open watches with the ERROR event, by
// closing the channel they were given; later watches get a new one.
func (p *testProxy) expireWatches(ns string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.expire[ns] != nil {
		close(p.expire[ns])
	}
	p.expire[ns] = make(chan string)
}

// cutWatches closes the upstream bodies of the namespace's open watches.
func (p *testProxy) cutWatches(ns string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for body := range p.active[ns] {
		_ = body.Close()
	}
}

func (p *testProxy) waitEnd(t *testing.T, ns string) watchEnd {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case end := <-p.ends:
			if end.namespace == ns {
				return end
			}
		case <-timeout:
			t.Fatalf("no watch of namespace %s ended within 30s", ns)
		}
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 30s waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestInformerRelistsThroughProxy runs a client-go informer on ConfigMaps
// through a reverse proxy in front of a real kube-apiserver, once with JSON
// and once with protobuf, and shows that:
//   - cutting the watch connection makes the reflector watch again from its
//     last resourceVersion, without a LIST: what this package exists to avoid;
//   - expiring it with Copy's ERROR event makes the reflector LIST again
//     (exactly one more LIST), and the informer goes on receiving events.
func TestInformerRelistsThroughProxy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
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
	cfg := fleet.Cluster("c").Config
	upstream, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newTestProxy(t, upstream, transport)
	server := httptest.NewServer(proxy)
	defer server.Close()

	for _, tc := range []struct {
		name              string
		clientContentType string
		wantContentType   string
	}{
		{"JSON", "application/json", "application/json"},
		{"Protobuf", "application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf;stream=watch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := "watchstream-" + strings.ToLower(tc.name)
			if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			createConfigMap := func(name string) {
				t.Helper()
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": `v "}{" \`}}
				if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}

			// The informer talks to the proxy, which adds the credentials.
			client, err := kubernetes.NewForConfig(&rest.Config{Host: server.URL, ContentConfig: rest.ContentConfig{ContentType: tc.clientContentType}})
			if err != nil {
				t.Fatal(err)
			}
			factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
			informer := factory.Core().V1().ConfigMaps().Informer()
			var seenMu sync.Mutex
			added := map[string]bool{}
			relisted := map[string]bool{} // updates without a change: a relist
			if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc: func(obj any) {
					seenMu.Lock()
					defer seenMu.Unlock()
					added[obj.(*corev1.ConfigMap).Name] = true
				},
				UpdateFunc: func(oldObj, newObj any) {
					seenMu.Lock()
					defer seenMu.Unlock()
					if oldObj.(*corev1.ConfigMap).ResourceVersion == newObj.(*corev1.ConfigMap).ResourceVersion {
						relisted[newObj.(*corev1.ConfigMap).Name] = true
					}
				},
			}); err != nil {
				t.Fatal(err)
			}
			sawAdd := func(name string) func() bool {
				return func() bool { seenMu.Lock(); defer seenMu.Unlock(); return added[name] }
			}
			stop := make(chan struct{})
			factory.Start(stop)
			defer func() {
				close(stop)
				factory.Shutdown()
			}()
			if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
				t.Fatal("informer did not sync")
			}
			eventually(t, "the informer's first watch", func() bool { _, _, active := proxy.counts(ns); return active == 1 })
			createConfigMap("a")
			eventually(t, "ConfigMap a through the first watch", sawAdd("a"))

			// Control: cut the connection. The reflector watches again
			// from where it was, with no LIST.
			lists, watches, _ := proxy.counts(ns)
			proxy.cutWatches(ns)
			if end := proxy.waitEnd(t, ns); end.res.Outcome != Failed || end.err == nil {
				t.Errorf("cut watch ended with %+v, %v; want Failed and the read error", end.res, end.err)
			}
			eventually(t, "a new watch after the cut", func() bool {
				_, w, active := proxy.counts(ns)
				return w == watches+1 && active == 1
			})
			createConfigMap("b")
			eventually(t, "ConfigMap b through the watch after the cut", sawAdd("b"))
			if l, _, _ := proxy.counts(ns); l != lists {
				t.Fatalf("after a cut connection the reflector listed %d times more; the control expects 0", l-lists)
			}
			seenMu.Lock()
			if len(relisted) != 0 {
				t.Errorf("updates without change after a cut connection: %v", relisted)
			}
			seenMu.Unlock()

			// Expire: the ERROR event makes the reflector LIST again.
			lists, watches, _ = proxy.counts(ns)
			proxy.expireWatches(ns)
			end := proxy.waitEnd(t, ns)
			if end.res.Outcome != Expired || end.err != nil || end.res.Events < 1 {
				t.Errorf("expired watch ended with %+v, %v; want Expired after at least 1 event (b)", end.res, end.err)
			}
			eventually(t, "a LIST and a new watch after the ERROR event", func() bool {
				l, w, active := proxy.counts(ns)
				return l == lists+1 && w == watches+1 && active == 1
			})
			createConfigMap("c")
			eventually(t, "ConfigMap c through the watch after the relist", sawAdd("c"))
			eventually(t, "the relist's updates of a and b", func() bool {
				seenMu.Lock()
				defer seenMu.Unlock()
				return relisted["a"] && relisted["b"]
			})
			if l, w, _ := proxy.counts(ns); l != lists+1 || w != watches+1 {
				t.Errorf("after one ERROR event: %d more LISTs and %d more WATCHes, want 1 and 1", l-lists, w-watches)
			}

			proxy.mu.Lock()
			seen := proxy.contentTypes[ns]
			proxy.mu.Unlock()
			if want := tc.wantContentType + " encoding="; len(seen) != 1 || !seen[want] {
				t.Errorf("watch responses had %v, want only %q", seen, want)
			}
			t.Logf("watch response Content-Type: %v", seen)
		})
	}

	server.Close() // waits for the proxied requests to finish
	waitNoGoroutines(t)
}
