package propagation

import (
	"context"
	"fmt"
	"testing"
	"time"
	"unsafe"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestRestreamHandsOnTheCachedWorks: when the Works' informer streams
// every Work again (its watch cut off, as at 1000 members x 100 configs),
// each Work its cache holds unchanged comes out of the decoder as the
// cache's own, not as a second copy held beside it until the stream ends.
// The stream is the informer's own ListWatch's watch with initial events,
// as client-go's reflector opens it (WatchListClient, as the hub ships),
// from the real API server.
func TestRestreamHandsOnTheCachedWorks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	direct := &Writer{Client: writerClient(t)}
	config := testConfig(unique("team-restream"), "PerCluster")
	var keys []types.NamespacedName
	for _, base := range []string{"restream-a", "restream-b", "restream-c"} {
		cluster := newCluster(t, ctx, base)
		if err := direct.Sync(ctx, config, cluster, singleShardRoute(t, config, cluster, 1)); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, routework.WorkKey(cluster, config.Namespace, config.Name))
	}

	// The Works' informer as the hub's cache makes it.
	httpClient, err := rest.HTTPClientFor(hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	cached := &cachedWorks{}
	newInformer, err := informerConstructor(hub.Config, httpClient, fleet.Scheme, cached)
	if err != nil {
		t.Fatal(err)
	}
	informer := newInformer(nil, &workv1alpha1.Work{}, 0, toolscache.Indexers{})
	if err := informer.SetTransform(transformDecoded); err != nil {
		t.Fatal(err)
	}
	go informer.Run(ctx.Done())
	held := map[types.NamespacedName]*workv1alpha1.Work{}
	env.Eventually(t, time.Minute, "the Works cached", func() error {
		for _, key := range keys {
			obj, ok, err := informer.GetIndexer().GetByKey(key.String())
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("Work %s not cached yet", key)
			}
			held[key] = obj.(*workv1alpha1.Work)
		}
		return nil
	})
	for key, work := range held {
		if work.Spec.Workload.Manifests != nil || work.ManagedFields != nil {
			t.Fatalf("the cache holds Work %s with its manifests or managedFields", key)
		}
	}

	// The stream the reflector opens when its watch was cut off.
	lw, err := leanWorks(hub.Config, httpClient, fleet.Scheme, cached)
	if err != nil {
		t.Fatal(err)
	}
	w, err := lw.WatchWithContext(ctx, metav1.ListOptions{SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	streamed := map[types.NamespacedName]*workv1alpha1.Work{}
	timeout := time.After(time.Minute)
	for ended := false; !ended; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the stream ended before its initial events did")
			}
			work, isWork := ev.Object.(*workv1alpha1.Work)
			if !isWork {
				t.Fatalf("streamed a %T", ev.Object)
			}
			switch ev.Type {
			case watch.Added:
				streamed[types.NamespacedName{Namespace: work.Namespace, Name: work.Name}] = work
			case watch.Bookmark:
				ended = work.Annotations[metav1.InitialEventsAnnotationKey] == "true"
			}
		case <-timeout:
			t.Fatal("the initial events did not end within a minute")
		}
	}
	if len(held) != len(keys) {
		t.Fatalf("%d Works cached, want %d", len(held), len(keys))
	}
	for key, work := range held {
		if streamed[key] != work {
			t.Errorf("Work %s streamed again as a copy of the cached one (resourceVersion %s, cached %s), not as the cache's own", key, streamed[key].ResourceVersion, work.ResourceVersion)
		}
	}
}

// TestRestreamDecodesChangedWorks: a streamed Work the cache holds at
// another resourceVersion, or another UID (deleted and created again), or
// does not hold, is decoded afresh, as the cache holds Works
// (CacheTransform); one at the same UID and resourceVersion is the cache's
// own.
func TestRestreamDecodesChangedWorks(t *testing.T) {
	full, _ := decoders(t)
	served := servedWork(t, types.NamespacedName{Namespace: "operators", Name: "op"}, "m1")
	fresh, _, err := full.Decode(served, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	transformed, err := CacheTransform(fresh)
	if err != nil {
		t.Fatal(err)
	}
	want := transformed.(*workv1alpha1.Work)
	for _, tc := range []struct {
		name   string
		held   func(*workv1alpha1.Work)
		handed bool
		// heldUID: the Work decoded afresh takes the cache's copy of its
		// UID.
		heldUID bool
	}{
		{"same resourceVersion and UID", func(*workv1alpha1.Work) {}, true, false},
		{"another resourceVersion", func(w *workv1alpha1.Work) { w.ResourceVersion += "0" }, false, true},
		{"another UID", func(w *workv1alpha1.Work) { w.UID += "x" }, false, false},
		{"not held", nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var held *workv1alpha1.Work
			if tc.held != nil {
				held = want.DeepCopy()
				tc.held(held)
			}
			obj, _, err := leanHolding(t, held).Decode(served, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := obj.(*workv1alpha1.Work)
			if handed := held != nil && got == held; handed != tc.handed {
				t.Fatalf("handed on the cache's own Work: %v, want %v", handed, tc.handed)
			}
			if !tc.handed && !equality.Semantic.DeepEqual(got, want) {
				t.Fatalf("decoded\n%#v\nwant, as the cache holds it,\n%#v", got, want)
			}
			if tc.heldUID && unsafe.StringData(string(got.UID)) != unsafe.StringData(string(held.UID)) {
				t.Errorf("the Work decoded afresh holds a copy of its UID of its own, not the cache's")
			}
		})
	}
}

// TestWorksInformerKeepsNoNamespaceIndex: the Works' informer of the hub's
// cache keeps no index by namespace, which held each Work's key once more;
// the informers of other objects keep it, as controller-runtime makes them.
func TestWorksInformerKeepsNoNamespaceIndex(t *testing.T) {
	httpClient, err := rest.HTTPClientFor(hub.Config)
	if err != nil {
		t.Fatal(err)
	}
	newInformer, err := informerConstructor(hub.Config, httpClient, fleet.Scheme, &cachedWorks{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		obj  runtime.Object
		want bool
	}{{&workv1alpha1.Work{}, false}, {&corev1.ConfigMap{}, true}} {
		indexers := toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc}
		informer := newInformer(&toolscache.ListWatch{}, tc.obj, 0, indexers)
		if _, got := informer.GetIndexer().GetIndexers()[toolscache.NamespaceIndex]; got != tc.want {
			t.Errorf("the informer of %T keeps the index by namespace: %v, want %v", tc.obj, got, tc.want)
		}
		if len(indexers) != 1 {
			t.Errorf("the informer of %T changed controller-runtime's indexers", tc.obj)
		}
	}
}

// leanHolding is the lean decoder of a hub whose cache holds held, or no
// Work when held is nil.
func leanHolding(t testing.TB, held *workv1alpha1.Work) runtime.Decoder {
	t.Helper()
	indexer := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	if held != nil {
		if err := indexer.Add(held); err != nil {
			t.Fatal(err)
		}
	}
	cached := &cachedWorks{}
	cached.set(indexer)
	_, lean := decodersWith(t, cached)
	return lean
}
