package propagation

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/http"
	"sync/atomic"
	"time"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	kjson "sigs.k8s.io/json"
)

// CacheOptions are the options of the hub's cache for Works: cached
// without their managedFields and manifests (CacheTransform), and decoded
// without them (NewInformer). Other objects lose their managedFields only.
// The hub caches every Work: these options, and those the hub adds, select
// no namespace, label or field of Works, which the Works' ListWatch would
// not apply (NewInformer).
func CacheOptions(cfg *rest.Config, s *runtime.Scheme) (cache.Options, error) {
	// The cache's connections, the Works' watch among them.
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return cache.Options{}, fmt.Errorf("a client of the hub cluster: %w", err)
	}
	cached := &cachedWorks{}
	newInformer, err := informerConstructor(cfg, httpClient, s, cached)
	if err != nil {
		return cache.Options{}, err
	}
	return cache.Options{Scheme: s, HTTPClient: httpClient, DefaultTransform: transformDecoded, NewInformer: newInformer}, nil
}

// informerConstructor is the hub cache's informer constructor
// (cache.Options.NewInformer). It lists and watches Works through a client
// of their own that decodes them without their manifests and managedFields
// (leanCodecs), which the cache drops anyway (CacheTransform), and that
// hands on the cache's own Work for a watched Work the cache holds at the
// same resourceVersion (cached); every other object is listed and watched
// as controller-runtime does.
//
// Why: a watched Work decoded whole takes 1.6x the time and 1.4x the
// garbage of one decoded without what the cache drops
// (BenchmarkDecodeWork), at every report of every member. And when the
// Works' watch is cut off, the informer streams every Work again and holds
// what it streamed beside the cache until the stream ends: at 1000 members
// x 100 configs under the chart's memory limit, first 110 MB of decoded
// manifests, then a second copy of every cached Work (687 MB live in all)
// were in flight during such a stream (make bench-scale).
//
// The hub caches every Work: controller-runtime's list and watch options
// for the Works' informer carry no selector, so this ListWatch applies
// none. httpClient is the cache's (cache.Options.HTTPClient), so that the
// Works' watch shares its connections.
//
// The Works' informer keeps no index by namespace, which
// controller-runtime gives every informer for lists within one namespace:
// the hub lists Works in every namespace (Writer.List), and that index held
// each Work's key once more, 36 bytes a Work (BenchmarkNamespaceIndexBytes).
// A list of Works within one namespace through the cache fails.
func informerConstructor(cfg *rest.Config, httpClient *http.Client, s *runtime.Scheme, cached *cachedWorks) (func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer, error) {
	works, err := leanWorks(cfg, httpClient, s, cached)
	if err != nil {
		return nil, err
	}
	return func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
		if _, ok := obj.(*workv1alpha1.Work); !ok {
			return toolscache.NewSharedIndexInformer(lw, obj, resync, indexers)
		}
		indexers = maps.Clone(indexers)
		delete(indexers, toolscache.NamespaceIndex)
		informer := toolscache.NewSharedIndexInformer(works, obj, resync, indexers)
		cached.set(informer.GetIndexer())
		return informer
	}, nil
}

// cachedWorks finds, for a watched Work, the one the hub's cache holds at
// the same resourceVersion, once the Works' informer exists.
//
// A Work streamed again (the informer's watch cut off and restarted) is
// most often unchanged: handing on the cache's own Work for it, rather
// than one decoded, keeps one copy of each Work, not two, while the
// stream lasts, and costs no decoding (held). The cache's Works are
// shared with its readers, so nothing may write them: the decoder hands on
// Works as the cache holds them (CacheTransform), and the cache's
// transform leaves Works as they are (transformDecoded).
type cachedWorks struct {
	indexer atomic.Pointer[toolscache.Indexer]
}

func (c *cachedWorks) set(indexer toolscache.Indexer) { c.indexer.Store(&indexer) }

// held is the cache's own Work of the UID data, a watched object as JSON,
// names in its metadata, and whether the cache holds it at data's
// resourceVersion: then that Work's content is data's. Only data's
// identity is read (workIdentityOf), not the rest of it: a Work streamed
// again unchanged was decoded whole, status and all, and dropped, 8.9 KB
// of allocations against 0.9 KB for its identity
// (BenchmarkDecodeHeldWork), for each of 100,000 Works at every stream at
// 1000 members x 100 configs. A Work held at another resourceVersion has
// changed: it is decoded, and takes the held Work's copy of its UID
// (Decode), which the Writer's record of the Work holds too
// (Writer.Known), so it stays the one copy as the Work changes.
func (c *cachedWorks) held(data []byte) (work *workv1alpha1.Work, unchanged bool) {
	indexer := c.indexer.Load()
	if indexer == nil {
		return nil, false
	}
	id, ok := workIdentityOf(data)
	if !ok {
		return nil, false
	}
	obj, exists, err := (*indexer).GetByKey(toolscache.ObjectName{Namespace: id.Namespace, Name: id.Name}.String())
	work, isWork := obj.(*workv1alpha1.Work)
	if err != nil || !exists || !isWork || work.UID != id.UID {
		return nil, false
	}
	return work, id.ResourceVersion != "" && work.ResourceVersion == id.ResourceVersion
}

// workIdentity is what workIdentityOf reads of a Work as JSON.
type workIdentity struct {
	Namespace       string    `json:"namespace"`
	Name            string    `json:"name"`
	UID             types.UID `json:"uid"`
	ResourceVersion string    `json:"resourceVersion"`
}

// workIdentityOf reads the identity of the Work data holds as JSON, as
// the Work's decoding reads it (case-sensitively, the last of keys
// repeated), and nothing else of it: the rest is scanned, not copied. ok
// is false when data is no Work as JSON.
func workIdentityOf(data []byte) (id workIdentity, ok bool) {
	var work struct {
		APIVersion string       `json:"apiVersion"`
		Kind       string       `json:"kind"`
		Metadata   workIdentity `json:"metadata"`
	}
	if kjson.UnmarshalCaseSensitivePreserveInts(data, &work) != nil || work.APIVersion != workKind.GroupVersion().String() || work.Kind != workKind.Kind {
		return workIdentity{}, false
	}
	return work.Metadata, true
}

// transformDecoded is the cache's transform
// (cache.Options.DefaultTransform). Works arrive from their decoder
// (leanDecoder) as the cache holds them, some of them the cache's own
// (cachedWorks), which nothing may write while its readers may be reading
// them: they pass unchanged. Other objects go through CacheTransform.
func transformDecoded(obj any) (any, error) {
	if _, ok := obj.(*workv1alpha1.Work); ok {
		return obj, nil
	}
	return CacheTransform(obj)
}

// leanWorks lists and watches all Works, decoded by leanCodecs, as
// controller-runtime's informers list and watch typed objects (with
// bookmarks).
func leanWorks(cfg *rest.Config, httpClient *http.Client, s *runtime.Scheme, cached *cachedWorks) (*toolscache.ListWatch, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.GroupVersion = &workv1alpha1.SchemeGroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = leanCodecs{NegotiatedSerializer: serializer.WithoutConversionCodecFactory{CodecFactory: serializer.NewCodecFactory(s)}, cached: cached}
	// Works are custom resources: the API server serves them as JSON, the
	// only encoding the lean decoding reads.
	cfg.ContentType, cfg.AcceptContentTypes = runtime.ContentTypeJSON, runtime.ContentTypeJSON
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	client, err := rest.RESTClientForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("a client of the Works: %w", err)
	}
	return &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list := &workv1alpha1.WorkList{}
			if err := client.Get().Resource("works").VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(list); err != nil {
				return nil, err
			}
			return list, nil
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.Watch, opts.AllowWatchBookmarks = true, true
			return client.Get().Resource("works").VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
		},
	}, nil
}

// leanCodecs decodes Works and WorkLists served as JSON without the
// Works' manifests and managedFields: their bytes are scanned, never
// copied nor decoded. Every Work comes out as the cache holds it
// (CacheTransform), its route status decoded among the rest: a Work
// waiting for the cache, as each does while the informer streams every
// Work again, holds no raw status (about 1 KB a Work at 1000 members x 100
// configs, make bench-scale). Every other object, and any Work the lean
// decoding refuses, is decoded by the codecs it wraps (a Work
// then through CacheTransform too).
type leanCodecs struct {
	runtime.NegotiatedSerializer
	// cached, when not nil, hands on the cache's own Work for a watched
	// Work it holds unchanged.
	cached *cachedWorks
}

func (c leanCodecs) DecoderToVersion(d runtime.Decoder, gv runtime.GroupVersioner) runtime.Decoder {
	return leanDecoder{full: c.NegotiatedSerializer.DecoderToVersion(d, gv), cached: c.cached}
}

// leanDecoder decodes as full does, but Works without their manifests and
// managedFields. Like full (runtime.WithoutVersionDecoder), it leaves the
// object it returns without its kind.
type leanDecoder struct {
	full   runtime.Decoder
	cached *cachedWorks
}

var (
	workKind     = workv1alpha1.SchemeGroupVersion.WithKind("Work")
	workListKind = workv1alpha1.SchemeGroupVersion.WithKind("WorkList")
)

func (d leanDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	// A Work decoded into a caller's object is the caller's: only a
	// watched one may be the cache's own.
	var held *workv1alpha1.Work
	if into == nil && d.cached != nil {
		var unchanged bool
		if held, unchanged = d.cached.held(data); unchanged {
			gvk := workKind
			return held, &gvk, nil
		}
	}
	obj, gvk, err := d.decode(data, defaults, into)
	if err != nil {
		return obj, gvk, err
	}
	switch obj := obj.(type) {
	case *workv1alpha1.Work:
		if held != nil && held.UID == obj.UID {
			obj.UID = held.UID
		}
		cacheWork(obj)
	case *workv1alpha1.WorkList:
		for i := range obj.Items {
			cacheWork(&obj.Items[i])
		}
	}
	return obj, gvk, nil
}

// decode decodes data as full does, but a Work or WorkList as JSON
// without the Works' manifests and managedFields.
func (d leanDecoder) decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if !bytes.HasPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte("{")) {
		return d.full.Decode(data, defaults, into)
	}
	switch into := into.(type) {
	case nil:
		// A watch event's object: most often a Work.
		if work, ok := d.decodeWork(data, &workv1alpha1.Work{}); ok {
			return work, &workKind, nil
		}
		return d.full.Decode(data, defaults, nil)
	case *workv1alpha1.Work:
		if work, ok := d.decodeWork(data, into); ok {
			return work, &workKind, nil
		}
		*into = workv1alpha1.Work{}
		return d.full.Decode(data, defaults, into)
	case *workv1alpha1.WorkList:
		var lean leanWorkList
		if kjson.UnmarshalCaseSensitivePreserveInts(data, &lean) != nil || lean.GroupVersionKind() != workListKind {
			return d.full.Decode(data, defaults, into)
		}
		*into = workv1alpha1.WorkList{ListMeta: lean.ListMeta, Items: make([]workv1alpha1.Work, len(lean.Items))}
		for i, item := range lean.Items {
			into.Items[i] = workv1alpha1.Work{TypeMeta: item.TypeMeta, ObjectMeta: item.Metadata.ObjectMeta, Spec: item.Spec.WorkSpec, Status: item.Status}
		}
		return into, &workListKind, nil
	default:
		return d.full.Decode(data, defaults, into)
	}
}

// decodeWork decodes data into work, replacing what it held, when data is
// a Work as JSON the lean decoding reads.
func (leanDecoder) decodeWork(data []byte, work *workv1alpha1.Work) (*workv1alpha1.Work, bool) {
	*work = workv1alpha1.Work{}
	if kjson.UnmarshalCaseSensitivePreserveInts(data, leanOf(work)) != nil || work.GroupVersionKind() != workKind {
		return nil, false
	}
	work.TypeMeta = metav1.TypeMeta{}
	return work, true
}

// leanOf decodes a Work as JSON into work, but for its manifests and
// managedFields: the fields named in leanWorkRef take the place of the
// embedded ones of the same JSON name (encoding/json's rule for the
// shallower field), and the others decode into work itself.
func leanOf(work *workv1alpha1.Work) *leanWorkRef {
	return &leanWorkRef{TypeMeta: &work.TypeMeta, Metadata: leanMetadataRef{ObjectMeta: &work.ObjectMeta}, Spec: leanSpecRef{WorkSpec: &work.Spec}, Status: &work.Status}
}

type leanWorkRef struct {
	*metav1.TypeMeta `json:",inline"`
	Metadata         leanMetadataRef          `json:"metadata"`
	Spec             leanSpecRef              `json:"spec"`
	Status           *workv1alpha1.WorkStatus `json:"status"`
}

type leanMetadataRef struct {
	*metav1.ObjectMeta `json:",inline"`
	ManagedFields      skipped `json:"managedFields"`
}

type leanSpecRef struct {
	*workv1alpha1.WorkSpec `json:",inline"`
	Workload               skipped `json:"workload"`
}

// leanWork is a Work of a list as JSON without its manifests and
// managedFields, as leanWorkRef, by value: the decoder makes the items.
type leanWork struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        leanMetadata            `json:"metadata"`
	Spec            leanSpec                `json:"spec"`
	Status          workv1alpha1.WorkStatus `json:"status"`
}

type leanMetadata struct {
	metav1.ObjectMeta `json:",inline"`
	ManagedFields     skipped `json:"managedFields"`
}

type leanSpec struct {
	workv1alpha1.WorkSpec `json:",inline"`
	Workload              skipped `json:"workload"`
}

// skipped takes a JSON value and keeps nothing of it.
type skipped struct{}

func (*skipped) UnmarshalJSON([]byte) error { return nil }

type leanWorkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []leanWork `json:"items"`
}
