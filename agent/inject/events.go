package inject

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// EventReconciler records a Warning Event, once per pod, on every pod that
// asked for the proxy and that the Handler skipped, with the reason from the
// pod's annotation. The Handler cannot: at admission a pod may have no name
// yet (generateName) and has no UID for the Event to refer to.
//
// Which pods have had their Event is kept in memory, so an agent restart
// records one more for each skipped pod still running.
type EventReconciler struct {
	client   client.Reader
	recorder record.EventRecorder
	told     podsTold
}

// SetupWithManager registers the reconciler with mgr, reading pods from its
// cache and recording Events with its recorder.
func (r *EventReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.client = mgr.GetClient()
	r.recorder = mgr.GetEventRecorderFor(ctrlmeshv1alpha1.AgentComponent)
	err := ctrl.NewControllerManagedBy(mgr).
		Named("proxy-injection-events").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(isSkipped))).
		Complete(r)
	if err != nil {
		return fmt.Errorf("inject: setting up the event reconciler: %w", err)
	}
	return nil
}

// isSkipped reports whether obj is a pod that asked for the proxy and was
// created without it. Deletions pass too, since the deleted pod carries the
// same marks, so that Reconcile forgets it.
func isSkipped(obj client.Object) bool {
	return obj.GetLabels()[ctrlmeshv1alpha1.EnableProxyLabel] == "true" &&
		obj.GetAnnotations()[ctrlmeshv1alpha1.ProxyInjectionAnnotation] == ctrlmeshv1alpha1.ProxyInjectionSkipped
}

// Reconcile records the Event of one skipped pod, unless it has one.
func (r *EventReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pod corev1.Pod
	if err := r.client.Get(ctx, req.NamespacedName, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			r.told.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("inject: reading pod %s: %w", req.NamespacedName, err)
	}
	if !isSkipped(&pod) {
		return ctrl.Result{}, nil
	}
	if r.told.tell(&pod) {
		r.recorder.Event(&pod, corev1.EventTypeWarning, ctrlmeshv1alpha1.ReasonProxyNotInjected,
			"ctrlmesh proxy not injected: "+pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation])
	}
	return ctrl.Result{}, nil
}

// RouteDeletedReconciler records a Warning Event on every pod whose proxy
// enforces a ShardRoute that was deleted (its ShardingConfig deleted, or the
// cluster deselected): the proxy then refuses the operator's sharded reads
// and writes (proxy.Withdraw), and the Event says how to run the operator
// without ctrlmesh, or to bring the rules back.
//
// It is level-based: a pod whose ShardRoute is missing gets its Event once
// per deletion — kept in memory, so an agent restart records one more; a
// ShardRoute created again under the name arms the next one. Absence in
// the cache is confirmed on the API server, since another replica's cache
// may have admitted the pod with a route this one has not seen yet.
type RouteDeletedReconciler struct {
	cache    client.Reader
	live     client.Reader
	recorder record.EventRecorder
	// told holds the pods that have their Event for the current deletion.
	told podsTold
}

// SetupWithManager registers the reconciler with mgr, reading pods and
// ShardRoutes from its cache, confirming deletions through its API reader
// and recording Events with its recorder.
func (r *RouteDeletedReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.cache = mgr.GetClient()
	r.live = mgr.GetAPIReader()
	r.recorder = mgr.GetEventRecorderFor(ctrlmeshv1alpha1.AgentComponent)
	err := ctrl.NewControllerManagedBy(mgr).
		Named("shardroute-deleted-events").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			pod, ok := obj.(*corev1.Pod)
			if !ok {
				return false
			}
			_, proxied := ProxiedRoute(pod)
			return proxied
		}))).
		Watches(&ctrlmeshv1alpha1.ShardRoute{}, handler.EnqueueRequestsFromMapFunc(r.podsProxying)).
		Complete(r)
	if err != nil {
		return fmt.Errorf("inject: setting up the ShardRoute deletion events: %w", err)
	}
	return nil
}

// podsProxying maps a ShardRoute to the pods of its namespace whose proxies
// enforce it.
func (r *RouteDeletedReconciler) podsProxying(ctx context.Context, obj client.Object) []reconcile.Request {
	var pods corev1.PodList
	if err := r.cache.List(ctx, &pods, client.InNamespace(obj.GetNamespace())); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the pods whose proxies enforce a ShardRoute", "namespace", obj.GetNamespace(), "route", obj.GetName())
		return nil
	}
	var requests []reconcile.Request
	for i := range pods.Items {
		if name, ok := ProxiedRoute(&pods.Items[i]); ok && name == obj.GetName() {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pods.Items[i])})
		}
	}
	return requests
}

// Reconcile records the Event of one pod whose ShardRoute is gone, unless it
// has it.
func (r *RouteDeletedReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pod corev1.Pod
	if err := r.cache.Get(ctx, req.NamespacedName, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			r.told.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("inject: reading pod %s: %w", req.NamespacedName, err)
	}
	name, ok := ProxiedRoute(&pod)
	if !ok || pod.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	routeKey := types.NamespacedName{Namespace: pod.Namespace, Name: name}
	exists, err := r.routeExists(ctx, routeKey)
	if err != nil {
		return ctrl.Result{}, err
	}
	if exists {
		r.told.forget(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	if r.told.tell(&pod) {
		r.recorder.Eventf(&pod, corev1.EventTypeWarning, ctrlmeshv1alpha1.ReasonShardRouteDeleted,
			"ShardRoute %s deleted: the proxy refuses the operator's sharded reads and writes; remove label %s from the pod template and restart, or re-create the ShardingConfig",
			name, ctrlmeshv1alpha1.EnableProxyLabel)
	}
	return ctrl.Result{}, nil
}

// routeExists reports whether the ShardRoute exists, in the cache or, when
// the cache lacks it, on the API server.
func (r *RouteDeletedReconciler) routeExists(ctx context.Context, key types.NamespacedName) (bool, error) {
	for _, reader := range []client.Reader{r.cache, r.live} {
		err := reader.Get(ctx, key, &ctrlmeshv1alpha1.ShardRoute{})
		if err == nil {
			return true, nil
		}
		if !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("inject: reading ShardRoute %s: %w", key, err)
		}
	}
	return false, nil
}

// podsTold remembers, per pod name, the UID of the pod that has had its
// Event, so that each pod gets one and a pod recreated under the name gets
// its own. It is memory only: an agent restart records one more.
type podsTold struct {
	mu     sync.Mutex
	byName map[types.NamespacedName]types.UID
}

// tell reports whether pod has not had its Event yet, and marks it as
// having had it.
func (t *podsTold) tell(pod *corev1.Pod) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	if t.byName[key] == pod.UID {
		return false
	}
	if t.byName == nil {
		t.byName = map[types.NamespacedName]types.UID{}
	}
	t.byName[key] = pod.UID
	return true
}

// forget lets the pod of that name have its Event again.
func (t *podsTold) forget(key types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.byName, key)
}
