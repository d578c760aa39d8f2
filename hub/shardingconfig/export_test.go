package shardingconfig

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// AllConfigs, PeersOf and ConfigOfWork are the event mappers, for the
// package's external tests.
func (r *Reconciler) AllConfigs(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.allConfigs(ctx, obj)
}

func (r *Reconciler) PeersOf(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.peersOf(ctx, obj)
}

var ConfigOfWork = configOfWork

// NewsIn is newsIn, for the package's external tests.
var NewsIn = newsIn

// SetConditions is setConditions, for the package's external tests.
var SetConditions = setConditions
