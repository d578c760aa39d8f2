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
	"sigs.k8s.io/controller-runtime/pkg/predicate"

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

	mu sync.Mutex
	// recorded holds the UID of the pod of each name that has its Event; a
	// pod recreated under the same name has another UID and gets its own.
	recorded map[types.NamespacedName]types.UID
}

// SetupWithManager registers the reconciler with mgr, reading pods from its
// cache and recording Events with its recorder.
func (r *EventReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.client = mgr.GetClient()
	r.recorder = mgr.GetEventRecorderFor(ctrlmeshv1alpha1.AgentComponent)
	r.recorded = map[types.NamespacedName]types.UID{}
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
			r.mu.Lock()
			delete(r.recorded, req.NamespacedName)
			r.mu.Unlock()
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("inject: reading pod %s: %w", req.NamespacedName, err)
	}
	if !isSkipped(&pod) {
		return ctrl.Result{}, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.recorded[req.NamespacedName] == pod.UID {
		return ctrl.Result{}, nil
	}
	r.recorder.Event(&pod, corev1.EventTypeWarning, ctrlmeshv1alpha1.ReasonProxyNotInjected,
		"ctrlmesh proxy not injected: "+pod.Annotations[ctrlmeshv1alpha1.ProxyInjectionReasonAnnotation])
	r.recorded[req.NamespacedName] = pod.UID
	return ctrl.Result{}, nil
}
