package shardingconfig

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// AllConfigs, PeersOf and ConfigOfWork are the event mappers, for the
// package's external tests.
func (r *Reconciler) AllConfigs(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.allConfigs(ctx, obj)
}

func (r *Reconciler) PeersOf(ctx context.Context, config types.NamespacedName) ([]reconcile.Request, error) {
	return r.peersOf(ctx, config)
}

// TellPeers runs the handler of changed views for config's change on q.
func (r *Reconciler) TellPeers(ctx context.Context, config types.NamespacedName, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	r.peers().Generic(ctx, event.GenericEvent{Object: &ctrlmeshv1alpha1.ShardingConfig{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: config.Name}}}, q)
}

// ViewNews reports whether view is news for config's peers, and remembers
// it as told.
func (r *Reconciler) ViewNews(config types.NamespacedName, view uint64) bool {
	return r.peersTold.news(config, view)
}

var ConfigOfWork = configOfWork

// NewsIn is newsIn, for the package's external tests.
var NewsIn = newsIn

// SetConditions is setConditions, for the package's external tests.
var SetConditions = setConditions
