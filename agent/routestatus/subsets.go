package routestatus

import (
	"context"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// namespaceRules compiles a subset's rules on namespaces, nil when it has
// none. They mean what an isolation's do (a selector on the Namespace's
// labels and a regex on its name, both to match), so they compile alike.
func namespaceRules(s *ctrlmeshv1alpha1.RouteSubset) (*rules.Isolation, error) {
	if s.NamespaceSelector == nil && s.NamespaceRegex == "" {
		return nil, nil
	}
	return rules.CompileIsolation(&ctrlmeshv1alpha1.NamespaceIsolation{NamespaceSelector: s.NamespaceSelector, NamespaceRegex: s.NamespaceRegex})
}

// subsetStatuses resolves the route's subsets' namespace rules against the
// member's Namespaces: the hub gives each subset the namespaces found, and
// moves them revoke-before-grant when they change. Rules that do not
// compile match nothing (RulesApplied says why).
func (r *Reconciler) subsetStatuses(ctx context.Context, route *ctrlmeshv1alpha1.ShardRoute) ([]ctrlmeshv1alpha1.RouteSubsetStatus, error) {
	if !hasNamespaceRules(route) {
		return nil, nil
	}
	var namespaces corev1.NamespaceList
	if err := r.client.List(ctx, &namespaces); err != nil {
		return nil, fmt.Errorf("listing the namespaces for the subsets' rules: %w", err)
	}
	var out []ctrlmeshv1alpha1.RouteSubsetStatus
	for i := range route.Spec.Subsets {
		s := &route.Spec.Subsets[i]
		match, err := namespaceRules(s)
		if err != nil || match == nil {
			continue
		}
		status := ctrlmeshv1alpha1.RouteSubsetStatus{Name: s.Name}
		for _, ns := range namespaces.Items {
			if ns.DeletionTimestamp == nil && match.Admits(ns.Name, ns.Labels) {
				status.Namespaces = append(status.Namespaces, ns.Name)
			}
		}
		slices.Sort(status.Namespaces)
		out = append(out, status)
	}
	return out, nil
}

func hasNamespaceRules(route *ctrlmeshv1alpha1.ShardRoute) bool {
	return slices.ContainsFunc(route.Spec.Subsets, func(s ctrlmeshv1alpha1.RouteSubset) bool {
		return s.NamespaceSelector != nil || s.NamespaceRegex != ""
	})
}

// routesWithNamespaceRules maps a Namespace's change to the routes whose
// subsets have namespace rules.
func (r *Reconciler) routesWithNamespaceRules(ctx context.Context, _ client.Object) []reconcile.Request {
	var routes ctrlmeshv1alpha1.ShardRouteList
	if err := r.client.List(ctx, &routes); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range routes.Items {
		if hasNamespaceRules(&routes.Items[i]) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&routes.Items[i])})
		}
	}
	return out
}

// namespaceChanged passes what can change a namespace's match: its
// creation and deletion, its labels, and the start of its deletion.
var namespaceChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) || (e.ObjectOld.GetDeletionTimestamp() == nil) != (e.ObjectNew.GetDeletionTimestamp() == nil)
	},
}
