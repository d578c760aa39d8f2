package shardingconfig

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/route"
)

// boundPolicies are the CircuitBreakers and FaultInjections naming sc, as
// its ShardRoutes carry them. Too many is an invalid spec: the rules stay
// as published until the user merges some.
func (r *Reconciler) boundPolicies(ctx context.Context, sc *ctrlmeshv1alpha1.ShardingConfig) (*ctrlmeshv1alpha1.RoutePolicies, error) {
	var cbs ctrlmeshv1alpha1.CircuitBreakerList
	if err := r.Client.List(ctx, &cbs, client.InNamespace(sc.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the CircuitBreakers of %s: %w", sc.Namespace, err)
	}
	var fis ctrlmeshv1alpha1.FaultInjectionList
	if err := r.Client.List(ctx, &fis, client.InNamespace(sc.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the FaultInjections of %s: %w", sc.Namespace, err)
	}
	p, err := route.BoundPolicies(sc, cbs.Items, fis.Items)
	if err != nil {
		return nil, &invalidError{err}
	}
	return p, nil
}

// configsOfPolicy maps a CircuitBreaker or FaultInjection to every
// ShardingConfig of its namespace: the one it names now and any it named
// before (which must drop it).
func (r *Reconciler) configsOfPolicy(ctx context.Context, obj client.Object) []reconcile.Request {
	var configs ctrlmeshv1alpha1.ShardingConfigList
	if err := r.Client.List(ctx, &configs, client.InNamespace(obj.GetNamespace())); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(configs.Items))
	for _, sc := range configs.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sc)})
	}
	return out
}
