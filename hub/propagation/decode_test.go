package propagation

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/pkg/scheme"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// decoders are the JSON decoders a client of the Works negotiates: the
// scheme's whole decoding (full), as controller-runtime's clients decode,
// and the hub's cache's (lean).
func decoders(t testing.TB) (full, lean runtime.Decoder) {
	t.Helper()
	return decodersWith(t, nil)
}

// decodersWith are decoders, the lean one handing on cached's Works.
func decodersWith(t testing.TB, cached *cachedWorks) (full, lean runtime.Decoder) {
	t.Helper()
	s, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	codecs := serializer.WithoutConversionCodecFactory{CodecFactory: serializer.NewCodecFactory(s)}
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		t.Fatal("the scheme's codecs serve no JSON")
	}
	return codecs.DecoderToVersion(info.Serializer, workv1alpha1.SchemeGroupVersion),
		leanCodecs{NegotiatedSerializer: codecs, cached: cached}.DecoderToVersion(info.Serializer, workv1alpha1.SchemeGroupVersion)
}

// withoutDropped is obj as the lean decoding leaves it: a Work or the
// Works of a list as the cache holds them (cacheWork: without their
// manifests and managedFields, their route status decoded with the
// conditions the hub reads).
func withoutDropped(obj runtime.Object) runtime.Object {
	switch obj := obj.(type) {
	case *workv1alpha1.Work:
		cacheWork(obj)
	case *workv1alpha1.WorkList:
		for i := range obj.Items {
			cacheWork(&obj.Items[i])
		}
	}
	return obj
}

// TestLeanDecode: a Work, a list of Works and a watch's bookmark decode as
// the scheme decodes them, less the manifests and managedFields and with
// the route status decoded; whatever
// is not a Work as JSON, or does not decode as one, decodes as the scheme
// decodes it, errors included.
func TestLeanDecode(t *testing.T) {
	full, lean := decoders(t)
	served := servedWork(t, types.NamespacedName{Namespace: "operators", Name: "op"}, "m1")
	var deleting map[string]any
	if err := json.Unmarshal(served, &deleting); err != nil {
		t.Fatal(err)
	}
	metadata := deleting["metadata"].(map[string]any)
	metadata["deletionTimestamp"] = "2027-01-15T08:00:00Z"
	metadata["finalizers"] = []string{"karmada.io/execution-controller"}
	metadata["ownerReferences"] = []map[string]any{{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "u-1"}}
	deleting["spec"].(map[string]any)["suspendDispatching"] = true
	deleting["spec"].(map[string]any)["preserveResourcesOnDeletion"] = false
	deletingJSON, err := json.Marshal(deleting)
	if err != nil {
		t.Fatal(err)
	}
	list := fmt.Sprintf(`{"apiVersion":"work.karmada.io/v1alpha1","kind":"WorkList","metadata":{"resourceVersion":"42","continue":"c"},"items":[%s,%s,%s]}`,
		served, servedWork(t, types.NamespacedName{Namespace: "operators", Name: "op"}, "m2"), deletingJSON)
	for _, tc := range []struct {
		name string
		data string
		into func() runtime.Object
		// used, when set, is what the lean decoding decodes into: an
		// object holding another, which it replaces whole, as
		// controller-runtime's clients zero theirs.
		used    func() runtime.Object
		wantErr bool
	}{
		{name: "a watched Work", data: string(served)},
		{name: "a Work read into one", data: string(served), into: func() runtime.Object { return &workv1alpha1.Work{} }},
		{name: "into a Work holding another", data: string(served), into: func() runtime.Object { return &workv1alpha1.Work{} }, used: func() runtime.Object {
			return &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{Name: "old", Labels: map[string]string{"old": "yes"}}, Spec: workv1alpha1.WorkSpec{Workload: workv1alpha1.WorkloadTemplate{Manifests: []workv1alpha1.Manifest{{}}}}}
		}},
		{name: "a Work being deleted, owned, suspended", data: string(deletingJSON)},
		{name: "a list of Works", data: list, into: func() runtime.Object { return &workv1alpha1.WorkList{} }},
		{name: "an empty list", data: `{"apiVersion":"work.karmada.io/v1alpha1","kind":"WorkList","metadata":{"resourceVersion":"7"},"items":[]}`, into: func() runtime.Object { return &workv1alpha1.WorkList{} }},
		{name: "a bookmark", data: `{"apiVersion":"work.karmada.io/v1alpha1","kind":"Work","metadata":{"resourceVersion":"99","annotations":{"k8s.io/initial-events-end":"true"}}}`},
		{name: "leading white space", data: "\n\t " + string(served)},
		{name: "a watch's error", data: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (2)","reason":"Expired","code":410}`},
		{name: "a Work of another version", data: strings.Replace(string(served), `"work.karmada.io/v1alpha1"`, `"work.karmada.io/v1alpha2"`, 1), wantErr: true},
		{name: "metadata not an object", data: `{"apiVersion":"work.karmada.io/v1alpha1","kind":"Work","metadata":5}`, wantErr: true},
		{name: "a status of the wrong type", data: `{"apiVersion":"work.karmada.io/v1alpha1","kind":"Work","metadata":{"name":"w"},"status":{"conditions":"none"}}`, wantErr: true},
		{name: "a list of something else", data: `{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"3"},"items":[]}`, into: func() runtime.Object { return &workv1alpha1.WorkList{} }},
		{name: "not JSON", data: "k8s\x00\x0a\x02", wantErr: true},
		{name: "truncated", data: string(served[:len(served)/2]), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			into := func() runtime.Object {
				if tc.into == nil {
					return nil
				}
				return tc.into()
			}
			want, wantGVK, wantErr := full.Decode([]byte(tc.data), nil, into())
			target := into()
			if tc.used != nil {
				target = tc.used()
			}
			got, gotGVK, err := lean.Decode([]byte(tc.data), nil, target)
			if (wantErr != nil) != tc.wantErr {
				t.Fatalf("the scheme decodes it with error %v, want an error: %t", wantErr, tc.wantErr)
			}
			if wantErr != nil {
				if err == nil || err.Error() != wantErr.Error() {
					t.Fatalf("the lean decoding fails with %v, want the scheme's %v", err, wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *gotGVK != *wantGVK {
				t.Errorf("kind %v, want %v", gotGVK, wantGVK)
			}
			if !equality.Semantic.DeepEqual(got, withoutDropped(want)) {
				t.Errorf("decoded\n%#v\nwant\n%#v", got, want)
			}
			if w, ok := got.(*workv1alpha1.Work); ok && (w.Spec.Workload.Manifests != nil || w.ManagedFields != nil) {
				t.Errorf("the lean Work keeps its manifests or managedFields")
			}
			if w, ok := got.(*workv1alpha1.Work); ok && len(w.Status.ManifestStatuses) > 0 {
				if st := w.Status.ManifestStatuses[0].Status; st.Raw != nil || st.Object == nil {
					t.Errorf("the lean Work holds its route status raw (%d bytes)", len(st.Raw))
				}
			}
		})
	}
}

// FuzzLeanDecode: whatever the scheme decodes, watched or read into a Work
// or a list of Works, the lean decoding decodes too, and to the same but
// for the Works' manifests and managedFields, which it may drop (it drops
// them from Works as the API server serves them: TestLeanDecode).
func FuzzLeanDecode(f *testing.F) {
	served := servedWork(f, types.NamespacedName{Namespace: "operators", Name: "op"}, "m1")
	f.Add(served, uint8(0))
	f.Add(served, uint8(1))
	f.Add([]byte(`{"apiVersion":"work.karmada.io/v1alpha1","kind":"WorkList","metadata":{},"items":[`+string(served)+`]}`), uint8(2))
	f.Add([]byte(`{"apiVersion":"work.karmada.io/v1alpha1","kind":"Work","metadata":{"resourceVersion":"1","managedFields":[{"manager":"m"}]},"spec":{"workload":{"manifests":[{"a":1}]}}}`), uint8(0))
	f.Add([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","code":410}`), uint8(0))
	full, lean := decoders(f)
	f.Fuzz(func(t *testing.T, data []byte, target uint8) {
		into := func() runtime.Object {
			switch target % 3 {
			case 1:
				return &workv1alpha1.Work{}
			case 2:
				return &workv1alpha1.WorkList{}
			}
			return nil
		}
		want, wantGVK, err := full.Decode(data, nil, into())
		if err != nil {
			return
		}
		got, gotGVK, err := lean.Decode(data, nil, into())
		if err != nil {
			t.Fatalf("the scheme decodes %q, the lean decoding fails: %v", data, err)
		}
		if *gotGVK != *wantGVK || !equality.Semantic.DeepEqual(withoutDropped(got), withoutDropped(want)) {
			t.Fatalf("%q decodes to %v %#v, want %v %#v", data, gotGVK, got, wantGVK, want)
		}
	})
}

// TestCacheOptionsMatchServer: the hub's cache of Works (CacheOptions),
// listing and watching them decoded lean, holds each Work as the API
// server serves it through CacheTransform: one listed when the cache
// started, one created, reported on and deleted since.
func TestCacheOptionsMatchServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	direct := &Writer{Client: writerClient(t)}
	config := testConfig(unique("team-decode"), ctrlmeshv1alpha1.ScopePerCluster)
	listed, watched := newCluster(t, ctx, "listed"), newCluster(t, ctx, "watched")
	if err := direct.Sync(ctx, config, listed, singleShardRoute(t, config, listed, 1)); err != nil {
		t.Fatal(err)
	}
	lean, _ := startCache(t, ctx, hubCache(t), nil)
	matches := func(cluster string) func() error {
		return func() error {
			key := routework.WorkKey(cluster, config.Namespace, config.Name)
			var served, cached workv1alpha1.Work
			if err := hub.Client.Get(ctx, key, &served); err != nil {
				return err
			}
			if err := lean.Get(ctx, key, &cached); err != nil {
				return err
			}
			if cached.ResourceVersion != served.ResourceVersion {
				return fmt.Errorf("cached resourceVersion %s, want %s", cached.ResourceVersion, served.ResourceVersion)
			}
			if len(served.Spec.Workload.Manifests) == 0 || len(served.ManagedFields) == 0 {
				t.Fatalf("the served Work %s has no manifests or no managedFields: nothing for the cache to drop", key)
			}
			want, err := CacheTransform(&served)
			if err != nil {
				return err
			}
			want.(*workv1alpha1.Work).TypeMeta = cached.TypeMeta
			if !equality.Semantic.DeepEqual(&cached, want) {
				t.Fatalf("the cache holds Work %s as\n%#v\nwant, as served through CacheTransform,\n%#v", key, &cached, want)
			}
			return nil
		}
	}
	env.Eventually(t, time.Minute, "the listed Work cached as served", matches(listed))

	if err := direct.Sync(ctx, config, watched, singleShardRoute(t, config, watched, 1)); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, time.Minute, "the created Work cached as served", matches(watched))
	work := getWork(t, ctx, config, watched)
	reported := singleShardRoute(t, config, watched, 1)
	reported.Generation, reported.Status.ObservedGeneration = 1, 1
	reported.Status.Pods = []ctrlmeshv1alpha1.PodRouteStatus{{Name: "op-0", Address: "10.0.0.1", Ready: true, Shard: "0", AppliedRulesHash: reported.Spec.RulesHash}}
	meta.SetStatusCondition(&work.Status.Conditions, metav1.Condition{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: "AppliedSuccessful"})
	work.Status.ManifestStatuses = []workv1alpha1.ManifestStatus{routework.ManifestStatus(reported)}
	if err := hub.Client.Status().Update(ctx, work, client.FieldOwner("member-agent")); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, time.Minute, "the reported Work cached as served", matches(watched))

	if err := hub.Client.Delete(ctx, work); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, time.Minute, "the deleted Work gone from the cache", func() error {
		var cached workv1alpha1.Work
		if err := lean.Get(ctx, client.ObjectKeyFromObject(work), &cached); !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading the deleted Work from the cache: %v, want not found", err)
		}
		return nil
	})
}

// BenchmarkDecodeWork is the hub's cache taking in one Work of 4 pods as a
// watch serves it: decoded whole, as controller-runtime's informers decode
// it, or lean (CacheOptions), then through CacheTransform. The garbage it
// makes is the collector's work at every member's report.
func BenchmarkDecodeWork(b *testing.B) {
	full, lean := decoders(b)
	served := servedWork(b, types.NamespacedName{Namespace: "operators", Name: "op"}, "m1")
	for _, bc := range []struct {
		name    string
		decoder runtime.Decoder
	}{{"full", full}, {"lean", lean}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				obj, _, err := bc.decoder.Decode(served, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := CacheTransform(obj); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeHeldWork decodes a watched Work the cache holds: at
// another resourceVersion (changed: decoded whole, as every Work was
// before the cache's own was handed on for one it holds unchanged), and at
// the same one (held: only its identity is read).
func BenchmarkDecodeHeldWork(b *testing.B) {
	full, _ := decoders(b)
	served := servedWork(b, types.NamespacedName{Namespace: "operators", Name: "op"}, "m1")
	obj, _, err := full.Decode(served, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		held func(*workv1alpha1.Work)
	}{
		{"changed", func(w *workv1alpha1.Work) { w.ResourceVersion += "0" }},
		{"held", func(*workv1alpha1.Work) {}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			held := obj.(*workv1alpha1.Work).DeepCopy()
			cacheWork(held)
			bc.held(held)
			lean := leanHolding(b, held)
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := lean.Decode(served, nil, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestWorkIdentityOf: the identity of a Work as JSON is read from its
// apiVersion, kind and metadata wherever they stand, as its decoding reads
// them; anything else is no Work's.
func TestWorkIdentityOf(t *testing.T) {
	meta := `"metadata":{"namespace":"karmada-es-m1","name":"w","uid":"u1","resourceVersion":"7","labels":{"a":"b"}}`
	w := workIdentity{Namespace: "karmada-es-m1", Name: "w", UID: "u1", ResourceVersion: "7"}
	for _, tc := range []struct {
		name, data string
		want       workIdentity
		ok         bool
	}{
		{"as the API server writes it", `{"apiVersion":"work.karmada.io/v1alpha1","kind":"Work",` + meta + `,"spec":{},"status":{}}`, w, true},
		{"metadata first", `{` + meta + `,"status":{"x":[1,2]},"kind":"Work","apiVersion":"work.karmada.io/v1alpha1"}`, w, true},
		{"metadata repeated: the last", `{"apiVersion":"work.karmada.io/v1alpha1","kind":"Work","metadata":{"name":"x"},` + meta + `}`, w, true},
		{"no metadata", `{"apiVersion":"work.karmada.io/v1alpha1","kind":"Work"}`, workIdentity{}, true},
		{"keys of another case: none", `{"apiVersion":"work.karmada.io/v1alpha1","kind":"Work","Metadata":{"name":"w"}}`, workIdentity{}, true},
		{"another kind", `{"apiVersion":"work.karmada.io/v1alpha1","kind":"WorkList",` + meta + `}`, workIdentity{}, false},
		{"another group", `{"apiVersion":"v1","kind":"Work",` + meta + `}`, workIdentity{}, false},
		{"a Status", `{"kind":"Status","apiVersion":"v1","status":"Failure","code":410}`, workIdentity{}, false},
		{"no object", `[1]`, workIdentity{}, false},
		{"cut short", `{"apiVersion":"work.karmada.io/v1alpha1","kind":"Work",` + meta + `,"status":{`, workIdentity{}, false},
	} {
		if got, ok := workIdentityOf([]byte(tc.data)); ok != tc.ok || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzWorkIdentity: the identity read of a Work as JSON is the one its
// decoding holds, whatever the JSON.
func FuzzWorkIdentity(f *testing.F) {
	f.Add(servedWork(f, types.NamespacedName{Namespace: "operators", Name: "op"}, "m1"))
	f.Add([]byte(`{"apiVersion":"work.karmada.io/v1alpha1","kind":"Work","metadata":{"name":"a\\u0062","resourceVersion":"1"},"metadata":{"uid":"u"}}`))
	f.Add([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","code":410}`))
	full, _ := decoders(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		id, ok := workIdentityOf(data)
		obj, _, err := full.Decode(data, nil, nil)
		work, isWork := obj.(*workv1alpha1.Work)
		if err != nil || !isWork {
			return
		}
		want := workIdentity{Namespace: work.Namespace, Name: work.Name, UID: work.UID, ResourceVersion: work.ResourceVersion}
		if !ok || id != want {
			t.Fatalf("the identity of %q: %+v, %v; want %+v", data, id, ok, want)
		}
	})
}
