package proxy_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// TestProtocolFeaturesPassThrough: what clients rely on keeps working through
// the proxy, narrowed to the shard — paginated lists with continue tokens,
// gzip-compressed lists (in range mode the proxy decodes a list's first
// bytes to check it, and hands it on compressed), streaming lists (sendInitialEvents with their
// closing bookmark) — and the legacy ConfigMap lock is renamed like a Lease.
func TestProtocolFeaturesPassThrough(t *testing.T) {
	for _, name := range []string{"range", "label"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cluster := fleet.Cluster(name)
			admin := kubernetes.NewForConfigOrDie(cluster.Config)
			seed(t, ctx, admin)
			// Large ConfigMaps in pod-a's namespaces, so that a list of them
			// is big enough for kube-apiserver to compress.
			big := strings.Repeat("x", 32<<10)
			// The other tests of this package share the cluster: leave nothing
			// behind that their views would see.
			t.Cleanup(func() {
				for _, ns := range owned("0-15")[:8] {
					_ = admin.CoreV1().ConfigMaps(ns).Delete(context.Background(), "big", metav1.DeleteOptions{})
				}
				_ = admin.CoreV1().ConfigMaps("operators").Delete(context.Background(), "demo---0", metav1.DeleteOptions{})
			})
			for _, ns := range owned("0-15")[:8] {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: ns, Labels: map[string]string{
					"app": "demo", "size": "big",
					ctrlmeshv1alpha1.ShardingHashLabel: sharding.LabelValue(scheme32.Bucket(ns)), ctrlmeshv1alpha1.NamespaceLabel: ns,
				}}, Data: map[string]string{"x": big}}
				if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					t.Fatal(err)
				}
			}
			rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
			writeRules(t, rulesFile, route("p1", 1, "0-15", "16-31"))
			a := startProxy(t, ctx, cluster.Config, "pod-a", rulesFile, "")
			csA := kubernetes.NewForConfigOrDie(a.config)
			want := owned("0-15")

			// Pagination: pages of 3 with continue tokens cover the shard.
			var paged []string
			opts := metav1.ListOptions{Limit: 3, LabelSelector: "size!=big"}
			pages := 0
			for {
				list, err := csA.CoreV1().ConfigMaps("").List(ctx, opts)
				if err != nil {
					t.Fatalf("page %d: %v", pages, err)
				}
				pages++
				for _, cm := range list.Items {
					paged = append(paged, cm.Namespace)
				}
				if list.Continue == "" {
					break
				}
				opts.Continue = list.Continue
			}
			sort.Strings(paged)
			if !slices.Equal(paged, want) || pages < 2 {
				t.Fatalf("%d pages gave %v, want %v", pages, paged, want)
			}

			// gzip: the compressed body passes through and decodes; in range
			// mode the proxy has decoded its first bytes, proven it by its
			// shardInfo, and hands on the compressed bytes as sent.
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.config.Host+"/api/v1/configmaps?labelSelector=size%3Dbig", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Accept-Encoding", "gzip")
			req.Header.Set("Accept", "application/json")
			resp, err := http.DefaultTransport.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			wantEncoding, body := "gzip", io.Reader(resp.Body)
			if got := resp.Header.Get("Content-Encoding"); got != wantEncoding {
				t.Fatalf("list of %d KiB came back with Content-Encoding %q, want %q", 8*32, got, wantEncoding)
			}
			if wantEncoding == "gzip" {
				if body, err = gzip.NewReader(resp.Body); err != nil {
					t.Fatal(err)
				}
			}
			var bigList corev1.ConfigMapList
			if err := json.NewDecoder(body).Decode(&bigList); err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if len(bigList.Items) != 8 {
				t.Fatalf("gzip list has %d items, want 8", len(bigList.Items))
			}

			// Streaming list: initial events of the shard only, then the
			// bookmark that ends them.
			q := url.Values{
				"watch": {"true"}, "sendInitialEvents": {"true"}, "resourceVersionMatch": {"NotOlderThan"},
				"allowWatchBookmarks": {"true"}, "labelSelector": {"size!=big"},
			}
			req, err = http.NewRequestWithContext(ctx, http.MethodGet, a.config.Host+"/api/v1/configmaps?"+q.Encode(), nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Accept", "application/json")
			resp, err = http.DefaultTransport.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			if resp.StatusCode != http.StatusOK {
				body, _ := io.ReadAll(resp.Body)
				t.Fatalf("streaming list: %d %s", resp.StatusCode, body)
			}
			var initial []string
			dec := json.NewDecoder(bufio.NewReader(resp.Body))
			for {
				var ev struct {
					Type   string `json:"type"`
					Object struct {
						Metadata metav1.ObjectMeta `json:"metadata"`
					} `json:"object"`
				}
				if err := dec.Decode(&ev); err != nil {
					t.Fatalf("streaming list after %d events: %v", len(initial), err)
				}
				if ev.Type == "BOOKMARK" && ev.Object.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
					break
				}
				if ev.Type != "ADDED" {
					t.Fatalf("unexpected %s event before the initial-events bookmark", ev.Type)
				}
				initial = append(initial, ev.Object.Metadata.Namespace)
			}
			sort.Strings(initial)
			if !slices.Equal(initial, want) {
				t.Fatalf("initial events %v, want %v", initial, want)
			}

			// The legacy ConfigMap lock is renamed in the rules' namespace,
			// whichever shard serves it: the operator leads there.
			const lockNS = "operators"
			if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lockNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
			lock := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: lockNS}}
			created, err := csA.CoreV1().ConfigMaps(lockNS).Create(ctx, lock, metav1.CreateOptions{})
			if err != nil || created.Name != "demo---0" {
				t.Fatalf("ConfigMap lock via pod-a: %v, %v", err, created)
			}
			if _, err := csA.CoreV1().ConfigMaps(lockNS).Get(ctx, "demo", metav1.GetOptions{}); err != nil {
				t.Fatalf("get the ConfigMap lock by its own name: %v", err)
			}
			if _, err := admin.CoreV1().ConfigMaps(lockNS).Get(ctx, "demo", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatal(fmt.Errorf("an unrenamed ConfigMap lock exists: %w", err))
			}
			// In another shard's namespace a ConfigMap named like the lock is
			// that shard's object: fenced, not renamed.
			theirs := owned("16-31")[0]
			if _, err := csA.CoreV1().ConfigMaps(theirs).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: theirs}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
				t.Fatalf("a ConfigMap named like the lock in another shard's namespace %s via pod-a: %v, want 403", theirs, err)
			}
		})
	}
}
