package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// TestRangeModeNeedsTheServerToShard: in range mode the proxy hands on a
// sharded list or watch only when it is sure the API server applied its
// shardSelector. kube-apiserver without the ShardedListAndWatch gate (HA
// version skew, a rollback, --selector-mode range set by hand) ignores the
// parameter and answers with every shard's objects; the proxy then refuses
// the list with a retryable 503 and ends the watch with an ERROR event
// before any object of another shard, in JSON and protobuf, compressed or
// not, for typed lists, metadata-only lists and custom resources. On a
// server with the gate the same requests are served, narrowed.
func TestRangeModeNeedsTheServerToShard(t *testing.T) {
	for _, tc := range []struct {
		cluster string
		sharded bool // the cluster's kube-apiserver has the gate
	}{
		{"range", true},
		{"label", false},
	} {
		t.Run(tc.cluster, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cluster := fleet.Cluster(tc.cluster)
			admin := kubernetes.NewForConfigOrDie(cluster.Config)
			seed(t, ctx, admin)
			bigConfigMaps(t, ctx, admin)
			routesIn := []string{owned("0-15")[0], owned("16-31")[0]}
			for _, ns := range routesIn {
				cr := route("check", 1, "0-15", "16-31")
				cr.Name, cr.Namespace = "unsharded-check", ns
				if err := cluster.Client.Create(ctx, cr); err != nil && !apierrors.IsAlreadyExists(err) {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cluster.Client.Delete(context.Background(), cr) })
			}

			r := route("u1", 1, "0-15", "16-31")
			r.Spec.Limits = append(r.Spec.Limits, ctrlmeshv1alpha1.Limit{
				RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{ctrlmeshv1alpha1.GroupVersion.Group}, Resources: []string{"shardroutes"}}},
			})
			rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
			writeRules(t, rulesFile, r)
			// Range mode set by hand, as with --selector-mode range.
			a := startProxy(t, ctx, cluster.Config, "pod-a", rulesFile, rules.ModeRange)
			checkMetric(t, a.health, `ctrlmesh_proxy_rules_info{generation="1",hash="u1",mode="range",shard="0"} 1`)
			operatorConfig := noRetries(a.config)
			jsonConfig, protoConfig := rest.CopyConfig(operatorConfig), rest.CopyConfig(operatorConfig)
			jsonConfig.ContentType = "application/json"
			protoConfig.ContentType = "application/vnd.kubernetes.protobuf"
			meta, err := metadata.NewForConfig(operatorConfig)
			if err != nil {
				t.Fatal(err)
			}
			proxied, err := client.New(operatorConfig, client.Options{Scheme: cluster.Client.Scheme()})
			if err != nil {
				t.Fatal(err)
			}
			configMaps := func(cfg *rest.Config, selector string) func() ([]string, error) {
				return func() ([]string, error) {
					list, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: selector})
					if err != nil {
						return nil, err
					}
					var out []string
					for _, cm := range list.Items {
						out = append(out, cm.Namespace)
					}
					return out, nil
				}
			}
			if resp := rawList(t, ctx, cluster.Config, "size=big"); resp.Header.Get("Content-Encoding") != "gzip" {
				t.Fatalf("kube-apiserver answers the list of big ConfigMaps with Content-Encoding %q: the gzip case would not be tested", resp.Header.Get("Content-Encoding"))
			}

			lists := []struct {
				name string
				list func() ([]string, error)
			}{
				{"JSON", configMaps(jsonConfig, "size!=big")},
				{"protobuf", configMaps(protoConfig, "size!=big")},
				{"gzip", configMaps(jsonConfig, "size=big")},
				{"metadata only", func() ([]string, error) {
					list, err := meta.Resource(corev1.SchemeGroupVersion.WithResource("configmaps")).List(ctx, metav1.ListOptions{})
					if err != nil {
						return nil, err
					}
					var out []string
					for _, item := range list.Items {
						out = append(out, item.Namespace)
					}
					return out, nil
				}},
				{"custom resources", func() ([]string, error) {
					var list ctrlmeshv1alpha1.ShardRouteList
					if err := proxied.List(ctx, &list); err != nil {
						return nil, err
					}
					var out []string
					for _, item := range list.Items {
						out = append(out, item.Namespace)
					}
					return out, nil
				}},
			}
			for _, l := range lists {
				got, err := l.list()
				if !tc.sharded {
					if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "did not apply this pod's shardSelector") {
						t.Errorf("%s list from a server without the gate: %d objects, error %v; want 503 saying the shardSelector was not applied", l.name, len(got), err)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s list: %v", l.name, err)
					continue
				}
				if len(got) == 0 {
					t.Errorf("%s list is empty: the shard's objects are missing", l.name)
				}
				for _, ns := range got {
					if !mustParse(t, "0-15").HasNamespace(ns) {
						t.Errorf("%s list holds an object of namespace %s, outside the shard", l.name, ns)
					}
				}
			}

			for _, cfg := range []*rest.Config{jsonConfig, protoConfig} {
				checkShardedWatch(t, ctx, cfg, tc.sharded)
			}
			if !tc.sharded {
				for _, verb := range []string{"list", "watch"} {
					checkMetric(t, a.health, fmt.Sprintf(`ctrlmesh_proxy_unsharded_responses_total{verb=%q}`, verb))
				}
			}
		})
	}
}

// checkShardedWatch watches ConfigMaps through the proxy from the current
// state (initial ADDED events, then the bookmark that ends them): every
// object delivered must be of the shard. Without the gate the watch must end
// with an ERROR event (503) before the first object of another shard.
func checkShardedWatch(t *testing.T, ctx context.Context, cfg *rest.Config, sharded bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	w, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps("").Watch(ctx, metav1.ListOptions{
		SendInitialEvents: ptrTo(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true,
	})
	if err != nil {
		t.Fatalf("%s watch: %v", cfg.ContentType, err)
	}
	defer w.Stop()
	var seen []string
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Error:
			status, _ := ev.Object.(*metav1.Status)
			if sharded || status == nil || status.Code != http.StatusServiceUnavailable || !strings.Contains(status.Message, "did not apply this pod's shardSelector") {
				t.Fatalf("%s watch ended with %v after %d objects", cfg.ContentType, ev.Object, len(seen))
			}
			return
		case watch.Bookmark:
			if !sharded {
				t.Fatalf("%s watch of a server without the gate delivered its initial events without refusing any: %v", cfg.ContentType, seen)
			}
			want := owned("0-15")
			sort.Strings(seen)
			if !slices.Contains(seen, want[0]) {
				t.Fatalf("%s watch delivered %v, missing the shard's %s", cfg.ContentType, seen, want[0])
			}
			return
		default:
			cm := ev.Object.(*corev1.ConfigMap)
			if !mustParse(t, "0-15").HasNamespace(cm.Namespace) {
				t.Fatalf("%s watch delivered %s %s/%s, outside the shard", cfg.ContentType, ev.Type, cm.Namespace, cm.Name)
			}
			seen = append(seen, cm.Namespace)
		}
	}
	t.Fatalf("%s watch closed after %d objects without an ERROR event or the initial-events bookmark", cfg.ContentType, len(seen))
}

// bigConfigMaps adds ConfigMaps of 32 KiB, labeled size=big, in six of
// pod-a's namespaces and two of pod-b's: a list of them is large enough for
// kube-apiserver to compress. They are deleted when the test ends: the
// other tests of this package compare what their informers see.
func bigConfigMaps(t *testing.T, ctx context.Context, admin kubernetes.Interface) {
	t.Helper()
	big := strings.Repeat("x", 32<<10)
	for _, ns := range append(owned("0-15")[:6], owned("16-31")[:2]...) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: ns, Labels: map[string]string{
			"app": "demo", "size": "big",
			ctrlmeshv1alpha1.ShardingHashLabel: sharding.LabelValue(scheme32.Bucket(ns)), ctrlmeshv1alpha1.NamespaceLabel: ns,
		}}, Data: map[string]string{"x": big}}
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().ConfigMaps(ns).Delete(context.Background(), "big", metav1.DeleteOptions{}) })
	}
}

// rawList lists ConfigMaps straight from the API server, asking for gzip.
func rawList(t *testing.T, ctx context.Context, cfg *rest.Config, selector string) *http.Response {
	t.Helper()
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/api/v1/configmaps?labelSelector="+selector, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := transport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("listing ConfigMaps from the API server: %s", resp.Status)
	}
	return resp
}

// noRetries returns cfg for a client that returns the proxy's 503s at once:
// client-go retries a 503 with Retry-After (the proxy sets it: its 503s are
// worth retrying) up to ten times, a second apart, within one call.
func noRetries(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if resp != nil {
				resp.Header.Del("Retry-After")
			}
			return resp, err
		})
	}
	return c
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
