package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// watchListGates are client-go's feature gates with WatchListClient on, as
// client-go v0.35 has them by default.
type watchListGates struct{ clientfeatures.Gates }

func (g watchListGates) Enabled(f clientfeatures.Feature) bool {
	return f == clientfeatures.WatchListClient || g.Gates.Enabled(f)
}

// TestStreamedListSettles: an operator whose informers stream their lists
// (client-go's WatchListClient: a watch with sendInitialEvents, no LIST)
// has taken up a rules change once the API server's initial-events-end
// bookmark has passed its proxy, as read from the API server's own frames,
// JSON and protobuf, in both modes: the rules are reported applied (within
// eventually's 20 s, before the 30 s settle timeout would count them
// applied anyway) and the informers hold the new selection.
func TestStreamedListSettles(t *testing.T) {
	for _, tc := range []struct {
		cluster     string
		mode        rules.Mode
		contentType string
	}{
		{"range", rules.ModeRange, "application/json"},
		{"label", rules.ModeLabel, "application/vnd.kubernetes.protobuf"},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cluster := fleet.Cluster(tc.cluster)
			seed(t, ctx, kubernetes.NewForConfigOrDie(cluster.Config))
			rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
			writeRules(t, rulesFile, route("s1", 1, "0-15", "16-31"))
			a := startProxy(t, ctx, cluster.Config, "pod-a", rulesFile, tc.mode)
			checkMetric(t, a.health, fmt.Sprintf(`ctrlmesh_proxy_rules_info{generation="1",hash="s1",mode="%s",shard="0"} 1`, tc.mode))

			var lists, streamed atomic.Int32
			c := rest.CopyConfig(a.config)
			c.ContentType = tc.contentType
			c.Wrap(func(rt http.RoundTripper) http.RoundTripper {
				return roundTripFunc(func(r *http.Request) (*http.Response, error) {
					switch q := r.URL.Query(); {
					case q.Get("sendInitialEvents") == "true":
						streamed.Add(1)
					case q.Get("watch") != "true":
						lists.Add(1)
					}
					return rt.RoundTrip(r)
				})
			})
			previous := clientfeatures.FeatureGates()
			clientfeatures.ReplaceFeatureGates(watchListGates{previous})
			factory := informers.NewSharedInformerFactory(kubernetes.NewForConfigOrDie(c), 0)
			inf := factory.Core().V1().ConfigMaps().Informer()
			factory.Start(ctx.Done())
			synced := toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
			// The reflector read the gates as it was made.
			clientfeatures.ReplaceFeatureGates(previous)
			if !synced {
				t.Fatal("informer did not sync")
			}
			// The seeded namespaces only: other tests of the package leave
			// objects of their own.
			seeded := map[string]bool{}
			for i := range namespaces {
				seeded[nsName(i)] = true
			}
			view := func() []string {
				var out []string
				for _, obj := range inf.GetStore().List() {
					if ns := obj.(*corev1.ConfigMap).Namespace; seeded[ns] {
						out = append(out, ns)
					}
				}
				slices.Sort(out)
				return out
			}
			if got, want := view(), owned("0-15"); !slices.Equal(got, want) {
				t.Fatalf("pod-a sees %v, want %v", got, want)
			}

			writeRules(t, rulesFile, route("s2", 2, "8-15", "0-7,16-31"))
			checkMetric(t, a.health, fmt.Sprintf(`ctrlmesh_proxy_rules_info{generation="2",hash="s2",mode="%s",shard="0"} 1`, tc.mode))
			eventually(t, "pod-a's informer under s2", func() (bool, string) {
				got := view()
				return slices.Equal(got, owned("8-15")), fmt.Sprintf("pod-a sees %v, want %v", got, owned("8-15"))
			})
			if lists.Load() != 0 || streamed.Load() < 2 {
				t.Fatalf("the informer sent %d lists and %d watches streaming their list, want none and at least 2: it did not stream its lists", lists.Load(), streamed.Load())
			}
		})
	}
}
