package propagation

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
	"github.com/ctrlmesh/ctrlmesh/pkg/scheme"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// servedWork is the JSON of a Work as the hub's informer receives it: as
// the Writer writes it for config and cluster (labels, annotations,
// manifests), with the metadata the API server adds (managedFields of the
// hub and of the member) and the status a member reports for 4 pods, as
// make bench-scale's load agents report it.
func servedWork(b testing.TB, config types.NamespacedName, cluster string) []byte {
	b.Helper()
	hash := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return hex.EncodeToString(sum[:])
	}
	rulesHash := hash(config.String() + cluster)
	route := &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: config.Name, Generation: 1},
		Spec:       ctrlmeshv1alpha1.ShardRouteSpec{Cluster: cluster, RoutingGeneration: 3, Scope: ctrlmeshv1alpha1.ScopePerCluster, Buckets: 32, RulesHash: rulesHash},
	}
	for i := range 4 {
		route.Spec.Shards = append(route.Spec.Shards, ctrlmeshv1alpha1.RouteShard{ID: fmt.Sprint(i), Buckets: fmt.Sprintf("%d-%d", 8*i, 8*i+7),
			Pods: []ctrlmeshv1alpha1.RoutePod{{Name: fmt.Sprintf("%s-%d", config.Name, i), Address: fmt.Sprintf("10.0.0.%d", i+1)}}})
	}
	work := routework.NewWork(routework.WorkKey(cluster, config.Namespace, config.Name))
	work.UID = uuid.NewUUID()
	work.ResourceVersion = "123456789"
	work.Generation = 1
	work.CreationTimestamp = metav1.NewTime(time.Unix(1800000000, 0))
	work.Labels[ctrlmeshv1alpha1.WorkConfigNamespaceLabel] = config.Namespace
	work.Labels[ctrlmeshv1alpha1.WorkConfigNameLabel] = config.Name
	work.Annotations = map[string]string{ctrlmeshv1alpha1.WorkRulesHashAnnotation: rulesHash, ctrlmeshv1alpha1.WorkAgentNamespaceAnnotation: "ctrlmesh-system"}
	rbac, _ := routework.NewLabelerRBAC(config.Namespace, config.Name, nil, "ctrlmesh-system")
	if err := routework.SetManifests(work, route, rbac); err != nil {
		b.Fatal(err)
	}
	fields := metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:annotations":{".":{},"f:ctrlmesh.io/rules-hash":{}},"f:labels":{".":{}}},"f:spec":{"f:workload":{".":{},"f:manifests":{}}}}`)}
	work.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "ctrlmesh-hub", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "work.karmada.io/v1alpha1", Time: &work.CreationTimestamp, FieldsType: "FieldsV1", FieldsV1: &fields},
		{Manager: "ctrlmesh-agent", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "work.karmada.io/v1alpha1", Time: &work.CreationTimestamp, FieldsType: "FieldsV1", FieldsV1: &fields, Subresource: "status"},
	}
	route.Status.ObservedGeneration, route.Status.ObservedRoutingGeneration = 1, 3
	for i, shard := range route.Spec.Shards {
		pod := shard.Pods[0]
		route.Status.Pods = append(route.Status.Pods, ctrlmeshv1alpha1.PodRouteStatus{Name: pod.Name, Address: pod.Address, Ready: true, Shard: fmt.Sprint(i), AppliedRulesHash: rulesHash})
		route.Status.Leaders = append(route.Status.Leaders, ctrlmeshv1alpha1.ShardLeader{Shard: shard.ID, Pod: pod.Name})
	}
	at := metav1.NewTime(time.Unix(1800000060, 0))
	meta.SetStatusCondition(&route.Status.Conditions, metav1.Condition{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue,
		Reason: ctrlmeshv1alpha1.ReasonRulesValid, Message: "the proxies can enforce the rules", ObservedGeneration: 1, LastTransitionTime: at})
	meta.SetStatusCondition(&route.Status.Conditions, metav1.Condition{Type: ctrlmeshv1alpha1.ConditionProxiesReady, Status: metav1.ConditionTrue,
		Reason: ctrlmeshv1alpha1.ReasonProxiesApplied, Message: "all 4 candidate pods report rules " + rulesHash, ObservedGeneration: 1, LastTransitionTime: at})
	work.Status.Conditions = []metav1.Condition{{Type: workv1alpha1.WorkApplied, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonWorkAppliedSuccessful,
		Message: "Manifest has been successfully applied", ObservedGeneration: 1, LastTransitionTime: at}}
	work.Status.ManifestStatuses = []workv1alpha1.ManifestStatus{routework.ManifestStatus(route)}
	work.APIVersion, work.Kind = workv1alpha1.SchemeGroupVersion.String(), "Work"
	raw, err := json.Marshal(work)
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

// TestCacheTransformSharesStrings: Works decoded apart, as the informer
// decodes them, hold one copy of what they repeat once through the
// transform (the config's labels, the conditions, the pods the members
// report, the rules hash a Work carries and each pod of its member
// acknowledges), and read as they read raw, but for the route's
// conditions: RulesApplied alone is kept, the one the hub reads.
func TestCacheTransformSharesStrings(t *testing.T) {
	s, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	decoder := serializer.NewCodecFactory(s).UniversalDeserializer()
	config := types.NamespacedName{Namespace: "operators", Name: "op"}
	var works [2]*workv1alpha1.Work
	for i, cluster := range []string{"m1", "m2"} {
		obj, _, err := decoder.Decode(servedWork(t, config, cluster), nil, &workv1alpha1.Work{})
		if err != nil {
			t.Fatal(err)
		}
		raw := obj.(*workv1alpha1.Work).DeepCopy()
		want, err := routework.ReadStatus(raw)
		if err != nil {
			t.Fatal(err)
		}
		if len(want.Route.Conditions) != 2 {
			t.Fatalf("%s: the served route status has conditions %v, want RulesApplied and ProxiesReady", cluster, want.Route.Conditions)
		}
		want.Route.Conditions = []metav1.Condition{*meta.FindStatusCondition(want.Route.Conditions, ctrlmeshv1alpha1.ConditionRulesApplied)}
		kept, err := CacheTransform(obj)
		if err != nil {
			t.Fatal(err)
		}
		works[i] = kept.(*workv1alpha1.Work)
		if got, err := routework.ReadStatus(works[i]); err != nil || !equality.Semantic.DeepEqual(got, want) {
			t.Errorf("%s: the cached Work reads %+v, %v; want %+v", cluster, got, err, want)
		}
		if works[i].Spec.Workload.Manifests != nil || works[i].ManagedFields != nil {
			t.Errorf("%s: the cached Work keeps its manifests or managedFields", cluster)
		}
	}
	a, b := works[0], works[1]
	pods := func(w *workv1alpha1.Work) []ctrlmeshv1alpha1.PodRouteStatus {
		return w.Status.ManifestStatuses[0].Status.Object.(*routework.DecodedRouteStatus).Pods
	}
	same := func(x, y string) bool { return unsafe.StringData(x) == unsafe.StringData(y) }
	for _, tc := range []struct {
		what string
		x, y string
	}{
		{"the Works' name", a.Name, b.Name},
		{"the config's label", a.Labels[ctrlmeshv1alpha1.WorkConfigNameLabel], b.Labels[ctrlmeshv1alpha1.WorkConfigNameLabel]},
		{"the agent's namespace", a.Annotations[ctrlmeshv1alpha1.WorkAgentNamespaceAnnotation], b.Annotations[ctrlmeshv1alpha1.WorkAgentNamespaceAnnotation]},
		{"the Applied condition's message", a.Status.Conditions[0].Message, b.Status.Conditions[0].Message},
		{"a reported pod's name", pods(a)[0].Name, pods(b)[0].Name},
		{"the rules hash two pods of a member acknowledge", pods(a)[0].AppliedRulesHash, pods(a)[1].AppliedRulesHash},
		{"the rules hash of a Work and that its pods acknowledge", a.Annotations[ctrlmeshv1alpha1.WorkRulesHashAnnotation], pods(a)[0].AppliedRulesHash},
	} {
		if tc.x != tc.y || !same(tc.x, tc.y) {
			t.Errorf("%s: %q and %q are two copies", tc.what, tc.x, tc.y)
		}
	}
}

// BenchmarkCachedWorkBytes reports the live heap one Work holds in the
// hub's cache: decoded as the informer decodes it, through CacheTransform.
// At 1000 members x 100 configs the hub caches 100,000 Works; this is
// their share of its memory.
func BenchmarkCachedWorkBytes(b *testing.B) {
	const configs, clusters = 10, 200
	s, err := scheme.New()
	if err != nil {
		b.Fatal(err)
	}
	decoder := serializer.NewCodecFactory(s).UniversalDeserializer()
	served := make([][]byte, 0, configs*clusters)
	for c := range configs {
		config := types.NamespacedName{Namespace: fmt.Sprintf("operators-%d", c), Name: fmt.Sprintf("operator-%d", c)}
		for m := range clusters {
			served = append(served, servedWork(b, config, fmt.Sprintf("member-%04d", m)))
		}
	}
	// The hub's cache fills over many collections: collected, the Works
	// also decode over 20 of them.
	for _, bc := range []struct {
		name         string
		collectEvery int
	}{{"uncollected", 0}, {"collected", len(served) / 20}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				before := env.LiveHeap()
				cached := make([]any, 0, len(served))
				for i, raw := range served {
					if bc.collectEvery > 0 && i%bc.collectEvery == 0 {
						runtime.GC()
					}
					obj, _, err := decoder.Decode(raw, nil, &workv1alpha1.Work{})
					if err != nil {
						b.Fatal(err)
					}
					kept, err := CacheTransform(obj)
					if err != nil {
						b.Fatal(err)
					}
					cached = append(cached, kept)
				}
				after := env.LiveHeap()
				b.ReportMetric(float64(after-before)/float64(len(served)), "B/work")
				runtime.KeepAlive(cached)
			}
		})
	}
}

// cachedWorksOf is configs x clusters Works as the hub's cache holds them,
// without their status.
func cachedWorksOf(configs, clusters int) []*workv1alpha1.Work {
	works := make([]*workv1alpha1.Work, 0, configs*clusters)
	for c := range configs {
		for m := range clusters {
			work := routework.NewWork(routework.WorkKey(fmt.Sprintf("member-%04d", m), fmt.Sprintf("operators-%d", c), fmt.Sprintf("operator-%d", c)))
			work.Labels[ctrlmeshv1alpha1.WorkConfigNamespaceLabel] = fmt.Sprintf("operators-%d", c)
			work.Labels[ctrlmeshv1alpha1.WorkConfigNameLabel] = fmt.Sprintf("operator-%d", c)
			cacheWork(work)
			works = append(works, work)
		}
	}
	return works
}

// indexBytes is the live heap a client-go indexer of indexers holds for
// works beyond what one without them holds.
func indexBytes(b *testing.B, works []*workv1alpha1.Work, indexers toolscache.Indexers) uint64 {
	b.Helper()
	fill := func(indexers toolscache.Indexers) uint64 {
		before := env.LiveHeap()
		indexer := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, indexers)
		for _, work := range works {
			if err := indexer.Add(work); err != nil {
				b.Fatal(err)
			}
		}
		after := env.LiveHeap()
		runtime.KeepAlive(indexer)
		return after - before
	}
	return fill(indexers) - fill(toolscache.Indexers{})
}

// BenchmarkConfigIndexBytes reports the live heap the index ConfigIndex
// holds for each cached Work: as IndexByConfig indexes Works, under their
// config's value for every namespace, and as controller-runtime's
// IndexField would, under the value for the Work's own namespace too.
func BenchmarkConfigIndexBytes(b *testing.B) {
	works := cachedWorksOf(10, 1000)
	// What controller-runtime's IndexField adds for a namespaced object.
	perNamespaceToo := func(obj any) ([]string, error) {
		values, err := configIndexValues(obj)
		for _, value := range values {
			values = append(values, obj.(*workv1alpha1.Work).Namespace+"/"+strings.TrimPrefix(value, allNamespaces))
		}
		return values, err
	}
	for _, bc := range []struct {
		name  string
		index toolscache.IndexFunc
	}{{"every-namespace", configIndexValues}, {"own-namespace-too", perNamespaceToo}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				held := indexBytes(b, works, toolscache.Indexers{configIndexName: bc.index})
				b.ReportMetric(float64(held)/float64(len(works)), "B/work")
			}
		})
	}
}

// BenchmarkNamespaceIndexBytes reports the live heap the index by
// namespace, which the Works' informer keeps no more
// (informerConstructor), held for each cached Work: 100 Works a namespace,
// as at 1000 members x 100 configs.
func BenchmarkNamespaceIndexBytes(b *testing.B) {
	works := cachedWorksOf(100, 100)
	for b.Loop() {
		held := indexBytes(b, works, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc})
		b.ReportMetric(float64(held)/float64(len(works)), "B/work")
	}
}

// cachedKnownWorks is n Works as the hub's cache holds them.
func cachedKnownWorks(n int) []*workv1alpha1.Work {
	works := make([]*workv1alpha1.Work, 0, n)
	for i := range n {
		work := routework.NewWork(routework.WorkKey(fmt.Sprintf("member-%04d", i%1000), "operators", fmt.Sprintf("operator-%d", i/1000)))
		work.UID, work.Generation = uuid.NewUUID(), 1
		work.Annotations = map[string]string{ctrlmeshv1alpha1.WorkRulesHashAnnotation: fmt.Sprintf("%064d", i), ctrlmeshv1alpha1.WorkAgentNamespaceAnnotation: "ctrlmesh-system"}
		cacheWork(work)
		works = append(works, work)
	}
	return works
}

// BenchmarkKnownBytes reports the live heap the Writer's records of the
// Works it knows hold for each Work: with the UIDs of the API server's
// answers (remember: the same Works, each with its own copy of its
// strings), and once readBack asked the Writer about each Work as cached
// (Known), with the cache's.
func BenchmarkKnownBytes(b *testing.B) {
	const n = 10000
	for _, bc := range []struct {
		name  string
		asked bool
	}{{"answered", false}, {"asked", true}} {
		b.Run(bc.name, func(b *testing.B) {
			// Built once: Works built in each round left the strings the
			// round before interned to the collector, whose cleanup of
			// them varied the figure by 100 bytes a Work.
			cached := cachedKnownWorks(n)
			for b.Loop() {
				before := env.LiveHeap()
				w := &Writer{}
				for _, work := range cached {
					answered := work.DeepCopy()
					answered.UID = types.UID(strings.Clone(string(work.UID)))
					answered.Annotations = maps.Clone(work.Annotations)
					w.remember(client.ObjectKeyFromObject(answered), answered)
				}
				if bc.asked {
					for _, work := range cached {
						if _, ok := w.Known(work); !ok {
							b.Fatalf("Work %s unknown", work.Name)
						}
					}
				}
				after := env.LiveHeap()
				b.ReportMetric((float64(after)-float64(before))/n, "B/work")
				runtime.KeepAlive(w)
				runtime.KeepAlive(cached)
			}
		})
	}
}

// TestReadConditions: the cache keeps a route status's RulesApplied
// condition alone, whatever else the agent wrote beside it.
func TestReadConditions(t *testing.T) {
	rules := metav1.Condition{Type: ctrlmeshv1alpha1.ConditionRulesApplied, Status: metav1.ConditionTrue}
	proxies := metav1.Condition{Type: ctrlmeshv1alpha1.ConditionProxiesReady, Status: metav1.ConditionFalse}
	for _, tc := range []struct {
		name string
		in   []metav1.Condition
		want []metav1.Condition
	}{
		{"none", nil, nil},
		{"RulesApplied alone", []metav1.Condition{rules}, []metav1.Condition{rules}},
		{"both", []metav1.Condition{proxies, rules}, []metav1.Condition{rules}},
		{"without RulesApplied", []metav1.Condition{proxies}, nil},
	} {
		if got := readConditions(tc.in); !equality.Semantic.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
