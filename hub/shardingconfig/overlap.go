package shardingconfig

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/hub/state"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/routework"
)

// overlap is another ShardingConfig of the same namespace whose pod
// selector selects pods this one's selects, in a cluster both select. Two
// ShardRoutes would then select one pod, and the injector gives such a pod
// no proxy (it enforces one route). Whether two label selectors can select
// one pod is undecidable from the selectors alone in general; the hub
// finds
//
//   - exactly, the pods the agents report under both configs' routes (a
//     route's status lists every pod its selector matches), and
//   - before any pod exists, the selectors of which one implies the other:
//     every requirement of one is a requirement of the other, so every pod
//     the narrower selects the wider selects too.
//
// Of two overlapping configs the one created first (then the one first by
// name) keeps the shared pods; the later one does not place them.
type overlap struct {
	// other is the other config's name, in the same namespace.
	other string
	// earlier: the other config was created first and keeps the shared pods.
	earlier bool
	// clusters both configs select.
	clusters []string
	// pods reported under both configs' routes.
	pods []route.PodID
	// implied: one selector implies the other.
	implied bool
}

// overlaps finds the configs of sc's namespace that overlap sc in the
// clusters of members, sorted by name. The pods another config's members
// report are read from the working model, where that config's own
// reconciles keep them; a config the model holds nothing of yet (none of
// its reconciles since the hub started got as far as its Works) is read
// from its Works. Decoding every other config's Works at every reconcile
// cost each reconcile a status decode per member of every other config of
// the namespace: 99,000 at 1000 members × 100 configs in one namespace.
func (r *Reconciler) overlaps(ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig, snap state.Snapshot, accepted []state.Cluster, members map[string]*member) ([]overlap, error) {
	var configs ctrlmeshv1alpha1.ShardingConfigList
	if err := r.Client.List(ctx, &configs, client.InNamespace(sc.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the ShardingConfigs of namespace %s: %w", sc.Namespace, err)
	}
	var out []overlap
	for i := range configs.Items {
		other := &configs.Items[i]
		// A config being deleted places nothing more, and its routes go.
		if other.Name == sc.Name || !other.DeletionTimestamp.IsZero() {
			continue
		}
		selected, err := selectedClusters(other, accepted)
		if err != nil {
			continue // its own status says so; it places nothing
		}
		common := map[string]bool{}
		for _, c := range selected {
			if _, ok := members[c.Name]; ok {
				common[c.Name] = true
			}
		}
		if len(common) == 0 {
			continue
		}
		o := overlap{other: other.Name, earlier: createdBefore(other, sc), clusters: slices.Sorted(maps.Keys(common)), implied: selectorsImply(&sc.Spec.Selector, &other.Spec.Selector)}
		key := client.ObjectKeyFromObject(other)
		reported := snap.ReportedPods(key)
		if !snap.HoldsConfig(key) {
			if reported, err = r.podsOfWorks(ctx, other); err != nil {
				return nil, err
			}
		}
		o.pods = sharedPods(reported, common, members)
		if o.implied || len(o.pods) > 0 {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b overlap) int { return strings.Compare(a.other, b.other) })
	return out, nil
}

// sharedPods are the pods of reported, by cluster, in the clusters of
// common that the members report for this config too, sorted.
func sharedPods(reported iter.Seq2[string, []state.Pod], common map[string]bool, members map[string]*member) []route.PodID {
	var shared []route.PodID
	for cluster, pods := range reported {
		if !common[cluster] {
			continue
		}
		m := members[cluster]
		for _, p := range pods {
			if _, ok := m.pod(p.Name); ok {
				shared = append(shared, route.PodID{Cluster: cluster, Name: p.Name})
			}
		}
	}
	slices.SortFunc(shared, route.ComparePodIDs)
	return slices.Compact(shared)
}

// podsOfWorks yields the pods other's Works report, by cluster: what the
// model holds of a config once its Works were read back.
func (r *Reconciler) podsOfWorks(ctx context.Context, other *ctrlmeshv1alpha1.ShardingConfig) (iter.Seq2[string, []state.Pod], error) {
	works, err := r.Writer.List(ctx, other)
	if err != nil {
		return nil, err
	}
	return func(yield func(cluster string, pods []state.Pod) bool) {
		for i := range works {
			cluster, err := routework.ClusterOf(&works[i])
			if err != nil {
				continue
			}
			report, err := reportOf(&works[i])
			if err != nil || report == nil {
				continue // unread: nothing known to be shared yet
			}
			if !yield(cluster, report.Pods) {
				return
			}
		}
	}, nil
}

// createdBefore reports whether a was created before b: by creation time,
// then by name.
func createdBefore(a, b *ctrlmeshv1alpha1.ShardingConfig) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// selectorsImply reports whether every requirement of one selector is a
// requirement of the other: the narrower then selects no pod the wider
// does not. Selectors that do not parse imply nothing.
func selectorsImply(a, b *metav1.LabelSelector) bool {
	reqs := func(s *metav1.LabelSelector) (map[string]bool, bool) {
		sel, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			return nil, false
		}
		rs, _ := sel.Requirements()
		out := map[string]bool{}
		for _, r := range rs {
			out[r.String()] = true
		}
		return out, true
	}
	ra, okA := reqs(a)
	rb, okB := reqs(b)
	if !okA || !okB {
		return false
	}
	subset := func(small, big map[string]bool) bool {
		for r := range small {
			if !big[r] {
				return false
			}
		}
		return true
	}
	return subset(ra, rb) || subset(rb, ra)
}

// excludedPods are the pods sc must not place: those it shares with a
// config created earlier.
func excludedPods(overlaps []overlap) map[route.PodID]bool {
	out := map[route.PodID]bool{}
	for _, o := range overlaps {
		if o.earlier {
			for _, p := range o.pods {
				out[p] = true
			}
		}
	}
	return out
}

// overlapMessage says what the overlaps are and what to do, or "".
func overlapMessage(overlaps []overlap) string {
	var parts []string
	for _, o := range overlaps {
		var what string
		if len(o.pods) > 0 {
			names := make([]string, 0, len(o.pods))
			for _, p := range o.pods {
				names = append(names, p.String())
			}
			what = fmt.Sprintf("ShardingConfig %s selects pods this one selects: %s", o.other, listNames(names))
		} else {
			what = fmt.Sprintf("the selectors of ShardingConfig %s and this one select the same pods (one's requirements include the other's) in %s",
				o.other, listNames(o.clusters))
		}
		if o.earlier {
			what += fmt.Sprintf("; %s was created first and keeps them: this one does not place them", o.other)
		} else {
			what += fmt.Sprintf("; this one was created first and keeps them: %s does not place them", o.other)
		}
		parts = append(parts, what)
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, "; ") + ". The proxy injector refuses pods two ShardRoutes select: make the ShardingConfigs' selectors disjoint"
}

// lastTold remembers, per ShardingConfig, the value last told of it —
// the overlap in an Event, the view to the other configs of its namespace
// — so that each new one is told once. Memory only: a restarted hub tells
// again.
type lastTold[V comparable] struct {
	mu   sync.Mutex
	told map[types.NamespacedName]V
}

// news reports whether v is news for config: none was told yet, or another
// value. It remembers v.
func (l *lastTold[V]) news(config types.NamespacedName, v V) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if last, ok := l.told[config]; ok && last == v {
		return false
	}
	if l.told == nil {
		l.told = map[types.NamespacedName]V{}
	}
	l.told[config] = v
	return true
}

// forget drops what was told of a config that is being deleted or gone.
func (l *lastTold[V]) forget(config types.NamespacedName) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.told, config)
}

// peerView is what the other ShardingConfigs of config's namespace read of
// it in overlaps: its spec (through its generation), whether it is being
// deleted, whether the model holds it, and the pods its members report as
// the model holds them; sc is nil for a config that is gone. Each config
// tells the others of its namespace when its view changed (tellPeers),
// rather than every Work's change reconciling every config of the
// namespace: with 100 configs in one namespace, each member's report
// reconciled all 100, each reading the 99 others' reports.
func peerView(config types.NamespacedName, sc *ctrlmeshv1alpha1.ShardingConfig, snap state.Snapshot) uint64 {
	h := fnv.New64a()
	if sc != nil {
		fmt.Fprintf(h, "%d %t %t\x00", sc.Generation, sc.DeletionTimestamp.IsZero(), snap.HoldsConfig(config))
	}
	for cluster, pods := range snap.ReportedPods(config) {
		for _, p := range pods {
			_, _ = io.WriteString(h, cluster+"\x00"+p.Name+"\x00")
		}
	}
	return h.Sum64()
}

// tellPeers reconciles the other ShardingConfigs of config's namespace when
// config's view changed; sc is nil for a config that is gone.
func (r *Reconciler) tellPeers(ctx context.Context, config types.NamespacedName, sc *ctrlmeshv1alpha1.ShardingConfig) {
	if r.peerChanges == nil {
		return // not set up with a manager: no other config is reconciled
	}
	if sc == nil {
		r.peersTold.forget(config)
	} else if !r.peersTold.news(config, peerView(config, sc, r.Store.Snapshot())) {
		return
	}
	select {
	case r.peerChanges <- event.GenericEvent{Object: &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: config.Name}}}:
	case <-ctx.Done():
	}
}

// peerRetry is how long a config whose peers could not be listed waits
// before it tells them again (peers).
const peerRetry = time.Second

// peers is the handler of changed views: it reconciles the other configs
// of the changed config's namespace. Where it cannot list them, it fails
// closed: it forgets the view told, so that it is news again, and
// reconciles the changed config itself after peerRetry, which tells again.
// Its peers may otherwise go on placing a pod that they now share, until
// some other change reaches them.
func (r *Reconciler) peers() handler.TypedEventHandler[client.Object, reconcile.Request] {
	return handler.Funcs{
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			changed := client.ObjectKeyFromObject(e.Object)
			peers, err := r.peersOf(ctx, changed)
			if err != nil {
				logr.FromContextOrDiscard(ctx).Error(err, "Telling the other ShardingConfigs of a namespace failed: telling again",
					"shardingConfig", changed, "after", peerRetry)
				r.peersTold.forget(changed)
				q.AddAfter(reconcile.Request{NamespacedName: changed}, peerRetry)
				return
			}
			for _, peer := range peers {
				q.Add(peer)
			}
		},
	}
}

// peersOf lists the other ShardingConfigs of config's namespace.
func (r *Reconciler) peersOf(ctx context.Context, config types.NamespacedName) ([]reconcile.Request, error) {
	var list ctrlmeshv1alpha1.ShardingConfigList
	if err := r.Client.List(ctx, &list, client.InNamespace(config.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the ShardingConfigs of namespace %s: %w", config.Namespace, err)
	}
	var out []reconcile.Request
	for _, sc := range list.Items {
		if sc.Name != config.Name {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sc)})
		}
	}
	return out, nil
}
