package inject

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/metricsutil"
)

// DefaultPace is the Replacer's least time between two evictions of one
// owner's pods.
const DefaultPace = 30 * time.Second

// Retry delays of an eviction that was refused (a PodDisruptionBudget's
// 429), doubling from the first to the last.
const (
	firstEvictionRetry = time.Second
	lastEvictionRetry  = 2 * time.Minute
)

// Eviction outcomes, the values of the metric's outcome label.
const (
	outcomeEvicted = "evicted"
	outcomeBlocked = "blocked"
	outcomeFailed  = "failed"
)

// Replacer makes the order of onboarding irrelevant: a pod that asked for the
// proxy but was created before a ShardRoute selected it (or while the
// injection webhook was not registered) runs without the proxy for good — it
// reconciles every shard's objects and is never a candidate for any. Once
// exactly one ShardRoute of its namespace selects it, and the Handler would
// inject a proxy into the same pod created now, the Replacer evicts it
// (policy/v1 Eviction, so PodDisruptionBudgets hold: a refusal is retried
// with backoff, never forced) and its controller recreates it, this time with
// the proxy.
//
// Per owner (the pod's controller) it evicts one pod at a time: the next only
// once the evicted pod is gone, the owner has as many pods as before (its
// replacement arrived; after ten paces it goes on without, in case the
// owner was scaled down), every pod of the owner that has the proxy is
// ready (the replacement started), and Pace has passed. A pod no controller
// owns would not come back: it gets a Warning Event saying to recreate it.
// Pods that have the proxy are never evicted; the check is made on the pod
// read from the API server, and the eviction is bound to that pod's UID.
type Replacer struct {
	// Pace is the least time between two evictions of one owner's pods; zero
	// for DefaultPace.
	Pace time.Duration
	// Registerer registers the eviction metric; nil for none.
	Registerer prometheus.Registerer

	cache    client.Reader
	live     client.Reader
	pods     client.SubResourceClient
	recorder record.EventRecorder
	// evictions counts evictions by outcome.
	evictions *prometheus.CounterVec

	mu sync.Mutex
	// owners holds the evictions of each owner, by the owner's UID.
	owners map[types.UID]*ownerEvictions
	// retries holds the next retry delay of each pod whose eviction was
	// refused.
	retries map[types.NamespacedName]time.Duration
	// warned holds the UID of each pod of a name that has its
	// ReasonRecreateForProxy Event.
	warned map[types.NamespacedName]types.UID
}

// ownerEvictions is the Replacer's record of one owner.
type ownerEvictions struct {
	// last is when the last eviction was done.
	last time.Time
	// evicted is the pod of the last eviction, which must be gone before the
	// next.
	evicted types.UID
	// pods is how many pods the owner had then, the evicted one included:
	// the next eviction waits until it has as many again (its replacement
	// arrived), or replacementWait passed (the owner was scaled down).
	pods int
}

// replacementWait is how many paces the Replacer waits at most for the
// replacement of an evicted pod before it evicts the owner's next pod.
const replacementWait = 10

// SetupWithManager registers the Replacer with mgr: pods and ShardRoutes
// from its cache, pods checked again through its API reader, Events by its
// recorder. It runs only on the elected leader when mgr has leader election
// on.
func (r *Replacer) SetupWithManager(mgr ctrl.Manager) error {
	if r.Pace <= 0 {
		r.Pace = DefaultPace
	}
	r.cache = mgr.GetClient()
	r.live = mgr.GetAPIReader()
	r.pods = mgr.GetClient().SubResource("eviction")
	r.recorder = mgr.GetEventRecorderFor(ctrlmeshv1alpha1.AgentComponent)
	r.owners = map[types.UID]*ownerEvictions{}
	r.retries = map[types.NamespacedName]time.Duration{}
	r.warned = map[types.NamespacedName]types.UID{}
	r.evictions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ctrlmesh_agent_proxy_evictions_total",
		Help: "Evictions of pods created without the proxy a ShardRoute now gives them, by outcome: evicted, blocked (refused, such as by a PodDisruptionBudget; retried), failed.",
	}, []string{"outcome"})
	if r.Registerer != nil {
		var err error
		if r.evictions, err = metricsutil.Register(r.Registerer, r.evictions); err != nil {
			return err
		}
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("proxy-replacement").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			pod, ok := obj.(*corev1.Pod)
			return ok && MissesProxy(pod)
		}))).
		Watches(&ctrlmeshv1alpha1.ShardRoute{}, handler.EnqueueRequestsFromMapFunc(r.podsSelected)).
		Complete(r)
	if err != nil {
		return fmt.Errorf("inject: setting up the replacer: %w", err)
	}
	return nil
}

// podsSelected maps a ShardRoute to the pods of its namespace it selects
// that miss the proxy.
func (r *Replacer) podsSelected(ctx context.Context, obj client.Object) []reconcile.Request {
	route, ok := obj.(*ctrlmeshv1alpha1.ShardRoute)
	if !ok {
		return nil
	}
	sel, err := metav1.LabelSelectorAsSelector(&route.Spec.Selector)
	if err != nil {
		return nil
	}
	var pods corev1.PodList
	if err := r.cache.List(ctx, &pods, client.InNamespace(route.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the pods a ShardRoute selects", "namespace", route.Namespace, "route", route.Name)
		return nil
	}
	var requests []reconcile.Request
	for i := range pods.Items {
		if MissesProxy(&pods.Items[i]) {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pods.Items[i])})
		}
	}
	return requests
}

// Reconcile replaces one pod that misses its proxy, when its turn has come.
func (r *Replacer) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	var cached corev1.Pod
	if err := r.cache.Get(ctx, req.NamespacedName, &cached); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("inject: reading pod %s: %w", req.NamespacedName, err)
	}
	if !MissesProxy(&cached) || cached.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	var routes ctrlmeshv1alpha1.ShardRouteList
	if err := r.cache.List(ctx, &routes, client.InNamespace(req.Namespace)); err != nil {
		return ctrl.Result{}, fmt.Errorf("inject: listing the ShardRoutes of namespace %s: %w", req.Namespace, err)
	}
	// No route selects the pod yet, or several do: created again, it would
	// be skipped again (the ProxyNotInjected Event of its creation says why).
	if route, _ := selectRoute(&cached, req.Namespace, routes.Items); route == nil {
		return ctrl.Result{}, nil
	}
	// Its turn first, from the cache: a pod waiting for it is not read
	// again from the API server at every requeue.
	var live int
	cachedOwner := metav1.GetControllerOf(&cached)
	if cachedOwner != nil {
		var wait time.Duration
		var why string
		if wait, why, live = r.ownerWait(ctx, &cached, cachedOwner.UID); wait > 0 {
			log.V(1).Info("Waiting to replace a pod without the proxy", "pod", req.NamespacedName, "owner", cachedOwner.Name, "for", wait, "reason", why)
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}
	// The cache holds no pod specs; the decision is made on the whole pod.
	var pod corev1.Pod
	if err := r.live.Get(ctx, req.NamespacedName, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("inject: reading pod %s: %w", req.NamespacedName, err)
	}
	if pod.UID != cached.UID || !MissesProxy(&pod) || pod.DeletionTimestamp != nil {
		// Another pod under the name, or one going away: its own events
		// bring it here.
		return ctrl.Result{}, nil
	}
	route, reason := injectionFor(&pod, req.Namespace, routes.Items)
	if route == nil {
		log.V(1).Info("Not replacing a pod without the proxy: created again it would not get one either", "pod", req.NamespacedName, "reason", reason)
		return ctrl.Result{}, nil
	}
	owner := metav1.GetControllerOf(&pod)
	switch {
	case owner == nil:
		r.warnBare(&pod, route.Name)
		return ctrl.Result{}, nil
	case cachedOwner == nil || cachedOwner.UID != owner.UID:
		// An owner the cache does not show yet: its update reconciles
		// again, and its turn is judged then.
		return ctrl.Result{}, nil
	}
	return r.evict(ctx, &pod, owner, live, route.Name)
}

// ownerWait returns how long the next eviction of the owner's pods must
// wait, and why; zero when pod may be evicted now, with the number of the
// owner's live pods.
func (r *Replacer) ownerWait(ctx context.Context, pod *corev1.Pod, owner types.UID) (wait time.Duration, why string, live int) {
	r.mu.Lock()
	record := r.owners[owner]
	r.mu.Unlock()
	if record != nil {
		if wait := time.Until(record.last.Add(r.Pace)); wait > 0 {
			return wait, "the owner's last eviction was recent", 0
		}
	}
	var pods corev1.PodList
	if err := r.cache.List(ctx, &pods, client.InNamespace(pod.Namespace)); err != nil {
		return r.Pace, "cannot list the owner's pods: " + err.Error(), 0
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if record != nil && p.UID == record.evicted {
			return r.Pace, fmt.Sprintf("pod %s, evicted before, is not gone yet", p.Name), 0
		}
		if c := metav1.GetControllerOf(p); c == nil || c.UID != owner || p.DeletionTimestamp != nil {
			continue
		}
		live++
		if hasProxy(p) && !isReady(p) {
			return r.Pace, fmt.Sprintf("pod %s, which has the proxy, is not ready yet", p.Name), 0
		}
	}
	if record != nil && live < record.pods && time.Since(record.last) < replacementWait*r.Pace {
		return r.Pace, fmt.Sprintf("the owner has %d pods, %d before the last eviction: waiting for the replacement", live, record.pods), 0
	}
	if record != nil {
		// Served: the next eviction, if any, records its own.
		r.mu.Lock()
		if r.owners[owner] == record {
			delete(r.owners, owner)
		}
		r.mu.Unlock()
	}
	return 0, "", live
}

// evict evicts pod, bound to its UID, and records the outcome; the owner has
// ownerPods live pods, pod included.
func (r *Replacer) evict(ctx context.Context, pod *corev1.Pod, owner *metav1.OwnerReference, ownerPods int, route string) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	eviction := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}},
	}
	err := r.pods.Create(ctx, pod, eviction)
	switch {
	case err == nil:
		r.evictions.WithLabelValues(outcomeEvicted).Inc()
		r.mu.Lock()
		r.owners[owner.UID] = &ownerEvictions{last: time.Now(), evicted: pod.UID, pods: ownerPods}
		delete(r.retries, client.ObjectKeyFromObject(pod))
		r.mu.Unlock()
		log.Info("Evicted a pod created without the proxy, for its controller to recreate it with the proxy", "pod", client.ObjectKeyFromObject(pod), "owner", owner.Kind+"/"+owner.Name, "route", route)
		r.recorder.Eventf(pod, corev1.EventTypeNormal, ctrlmeshv1alpha1.ReasonEvictedForProxy,
			"evicted: the pod was created without the ctrlmesh proxy and ShardRoute %q now selects it; %s %s recreates it with the proxy", route, owner.Kind, owner.Name)
		return ctrl.Result{}, nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// Gone, or another pod under the name now: that one is its own case.
		return ctrl.Result{}, nil
	case apierrors.IsTooManyRequests(err):
		r.evictions.WithLabelValues(outcomeBlocked).Inc()
		retry := r.nextRetry(client.ObjectKeyFromObject(pod))
		log.Info("Eviction of a pod without the proxy refused; retrying", "pod", client.ObjectKeyFromObject(pod), "in", retry, "error", err.Error())
		r.recorder.Eventf(pod, corev1.EventTypeWarning, ctrlmeshv1alpha1.ReasonProxyEvictionBlocked,
			"the pod runs without the ctrlmesh proxy that ShardRoute %q gives it; evicting it was refused, retrying later: %s", route, refusal(err))
		return ctrl.Result{RequeueAfter: retry}, nil
	default:
		r.evictions.WithLabelValues(outcomeFailed).Inc()
		return ctrl.Result{}, fmt.Errorf("inject: evicting pod %s, created without the proxy: %w", client.ObjectKeyFromObject(pod), err)
	}
}

// refusal is the message of a refused eviction: the disruption budget's
// cause when there is one.
func refusal(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil {
		for _, cause := range status.Status().Details.Causes {
			if cause.Type == policyv1.DisruptionBudgetCause && cause.Message != "" {
				return cause.Message
			}
		}
	}
	return err.Error()
}

// nextRetry returns the delay before the pod's eviction is tried again, and
// doubles the next one.
func (r *Replacer) nextRetry(pod types.NamespacedName) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	retry := r.retries[pod]
	if retry == 0 {
		retry = firstEvictionRetry
	}
	r.retries[pod] = min(2*retry, lastEvictionRetry)
	return retry
}

// warnBare records, once per pod, that the pod must be recreated by hand.
func (r *Replacer) warnBare(pod *corev1.Pod, route string) {
	key := client.ObjectKeyFromObject(pod)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.warned[key] == pod.UID {
		return
	}
	r.recorder.Eventf(pod, corev1.EventTypeWarning, ctrlmeshv1alpha1.ReasonRecreateForProxy,
		"the pod runs without the ctrlmesh proxy that ShardRoute %q gives it, and no controller would recreate it if evicted: delete it and create it again to get the proxy", route)
	r.warned[key] = pod.UID
}

// forget drops what the Replacer holds of a deleted pod.
func (r *Replacer) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.retries, key)
	delete(r.warned, key)
}

// isReady reports whether the pod's Ready condition is True.
func isReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
