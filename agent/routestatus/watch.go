package routestatus

import (
	"context"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// CacheByObject is the cache configuration the controller expects of its
// manager (cache.Options.ByObject):
//
//   - no managedFields on any of its objects: it never reads them, and its
//     status Update without them leaves the server's as they are;
//   - Pods cut down to what the status reports (name, labels, phase, IP,
//     Ready condition), their ctrlmesh.io/ annotations, owner references and
//     the proxy container's name and arguments: pod specs are most of a
//     pod's size. Other users of the same manager's cache see these
//     cut-down Pods too: the injection's Events and its Replacer, which ask
//     whether a pod has its proxy and for which ShardRoute;
//   - no Leases of kube-node-lease, where every node renews its lease every
//     few seconds and no operator elects its leader.
func CacheByObject() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&ctrlmeshv1alpha1.ShardRoute{}: {Transform: cache.TransformStripManagedFields()},
		&corev1.Pod{}:                  {Transform: leanPod},
		&corev1.Namespace{}:            {Transform: cache.TransformStripManagedFields()},
		&coordinationv1.Lease{}: {
			Field:     fields.OneTermNotEqualSelector("metadata.namespace", corev1.NamespaceNodeLease),
			Transform: cache.TransformStripManagedFields(),
		},
	}
}

// leanPod keeps what the status reports of a pod, and what the injection
// asks of it: its owners, and its proxy container by name and arguments.
func leanPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	lean := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			Labels: pod.Labels, Annotations: ctrlmeshAnnotations(pod.Annotations), DeletionTimestamp: pod.DeletionTimestamp,
			OwnerReferences: pod.OwnerReferences,
		},
		Spec: corev1.PodSpec{
			InitContainers: proxyContainers(pod.Spec.InitContainers),
			Containers:     proxyContainers(pod.Spec.Containers),
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase, PodIP: pod.Status.PodIP},
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			lean.Status.Conditions = []corev1.PodCondition{c}
		}
	}
	return lean, nil
}

// proxyContainers keeps the name and arguments of the ctrlmesh proxy
// containers among cs.
func proxyContainers(cs []corev1.Container) []corev1.Container {
	var out []corev1.Container
	for _, c := range cs {
		if c.Name == ctrlmeshv1alpha1.ProxyContainerName {
			out = append(out, corev1.Container{Name: c.Name, Args: c.Args})
		}
	}
	return out
}

// ctrlmeshAnnotations keeps the ctrlmesh.io/ annotations, such as the proxy
// injection's outcome, which the agent's injection Events read from the same
// cache.
func ctrlmeshAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	for k, v := range in {
		if strings.HasPrefix(k, ctrlmeshv1alpha1.GroupVersion.Group+"/") {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// podChanged passes pod updates that can change a status: container and
// other condition churn cannot.
var podChanged = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	before, okBefore := e.ObjectOld.(*corev1.Pod)
	after, okAfter := e.ObjectNew.(*corev1.Pod)
	if !okBefore || !okAfter {
		return true
	}
	return !equality.Semantic.DeepEqual(before.Labels, after.Labels) ||
		before.Status.Phase != after.Status.Phase ||
		before.Status.PodIP != after.Status.PodIP ||
		isReady(before) != isReady(after)
}}

// leaseChanged records every lease event in renewals, and passes those
// that can change a status. A holder renews its lease every few seconds;
// renewing a live lease changes no leader, and the reconcile queued for the
// lease's old expiry time finds it renewed. Renewing an expired lease brings
// its holder back.
func leaseChanged(renewals *renewals) predicate.Funcs {
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool {
			if lease, ok := e.Object.(*coordinationv1.Lease); ok {
				renewals.observe(lease)
			}
			return true
		},
		UpdateFunc: func(e event.UpdateEvent) bool {
			before, okBefore := e.ObjectOld.(*coordinationv1.Lease)
			after, okAfter := e.ObjectNew.(*coordinationv1.Lease)
			if !okBefore || !okAfter {
				return true
			}
			expiredBefore := renewals.expired(before)
			renewals.observe(after)
			return expiredBefore || !equality.Semantic.DeepEqual(before.Spec.HolderIdentity, after.Spec.HolderIdentity) ||
				!equality.Semantic.DeepEqual(before.Spec.LeaseDurationSeconds, after.Spec.LeaseDurationSeconds)
		},
		DeleteFunc: func(e event.DeleteEvent) bool {
			if lease, ok := e.Object.(*coordinationv1.Lease); ok {
				renewals.forget(lease)
			}
			return true
		},
	}
}

// routesSelecting maps a pod to the routes of its namespace that select it.
// Updates map both the old and the new pod, so a pod whose labels stop
// matching still reaches its route.
func (r *Reconciler) routesSelecting(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.routesIn(ctx, obj.GetNamespace(), func(route *ctrlmeshv1alpha1.ShardRoute) bool {
		selector, err := metav1.LabelSelectorAsSelector(&route.Spec.Selector)
		return err == nil && selector.Matches(labels.Set(obj.GetLabels()))
	})
}

// routesLockedBy maps a lease to the routes of its namespace whose shard
// locks it may be.
func (r *Reconciler) routesLockedBy(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.routesIn(ctx, obj.GetNamespace(), func(route *ctrlmeshv1alpha1.ShardRoute) bool {
		return route.Spec.Controller != nil && strings.HasPrefix(obj.GetName(), shardLockName(route, ""))
	})
}

func (r *Reconciler) routesIn(ctx context.Context, namespace string, wanted func(*ctrlmeshv1alpha1.ShardRoute) bool) []reconcile.Request {
	var routes ctrlmeshv1alpha1.ShardRouteList
	if err := r.client.List(ctx, &routes, client.InNamespace(namespace)); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the ShardRoutes to map an event to", "namespace", namespace)
		return nil
	}
	var requests []reconcile.Request
	for i := range routes.Items {
		if wanted(&routes.Items[i]) {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&routes.Items[i])})
		}
	}
	return requests
}
