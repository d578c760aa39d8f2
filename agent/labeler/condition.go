package labeler

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// routeResources maps each route the targets serve (not deleted, not
// refused, limits that compile) to the target resources its limits name.
func routeResources(routes []ctrlmeshv1alpha1.ShardRoute, refused []Refusal, resources []schema.GroupVersionResource, scopes rules.Scopes) map[types.NamespacedName][]schema.GroupVersionResource {
	out := map[types.NamespacedName][]schema.GroupVersionResource{}
	for i := range routes {
		route := &routes[i]
		if route.DeletionTimestamp != nil || slices.ContainsFunc(refused, func(r Refusal) bool { return r.Route.UID == route.UID }) {
			continue
		}
		limits, err := rules.CompileLimits(route.Spec.Limits, scopes)
		if err != nil {
			continue
		}
		var named []schema.GroupVersionResource
		for _, gvr := range resources {
			if slices.ContainsFunc(limits, func(l rules.Limit) bool { return l.Matches(gvr.GroupResource()) }) {
				named = append(named, gvr)
			}
		}
		if len(named) > 0 {
			out[client.ObjectKeyFromObject(route)] = named
		}
	}
	return out
}

// labeledCondition is the Labeled condition of a route whose limits name
// resources, after the sweep res: True when every one of them was swept
// without error, else False, LabelerForbidden when the API server refused
// the agent some of them.
func labeledCondition(resources []schema.GroupVersionResource, res SweepResult) metav1.Condition {
	var forbidden, failed []string
	for _, gvr := range resources {
		err, bad := res.Failed[gvr]
		switch {
		case !bad && slices.Contains(res.Swept, gvr):
		case !bad:
			failed = append(failed, resourceName(gvr)+": not swept")
		case apierrors.IsForbidden(err):
			forbidden = append(forbidden, resourceName(gvr))
		default:
			failed = append(failed, fmt.Sprintf("%s: %v", resourceName(gvr), err))
		}
	}
	switch {
	case len(forbidden) > 0:
		return metav1.Condition{Type: ctrlmeshv1alpha1.ConditionLabeled, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonLabelerForbidden,
			Message: fmt.Sprintf("the agent may not list, watch or patch %s, so their objects may be unlabeled and seen by no shard; the hub grants these rights with the ShardingConfig's Work (ClusterRole %s<namespace>.<name>) for the resources its limits name, not for \"*\": name the resources, or wait for the role to land. Retrying",
				strings.Join(forbidden, ", "), ctrlmeshv1alpha1.LabelerRBACPrefix)}
	case len(failed) > 0:
		return metav1.Condition{Type: ctrlmeshv1alpha1.ConditionLabeled, Status: metav1.ConditionFalse, Reason: ctrlmeshv1alpha1.ReasonLabelingFailed,
			Message: "labeling failed, so some objects may be unlabeled and seen by no shard: " + strings.Join(failed, "; ") + ". Retrying"}
	default:
		return metav1.Condition{Type: ctrlmeshv1alpha1.ConditionLabeled, Status: metav1.ConditionTrue, Reason: ctrlmeshv1alpha1.ReasonObjectsLabeled,
			Message: "every object of the resources the limits name is labeled"}
	}
}

// reportSweep writes the Labeled condition of every route the sweep served,
// when it changed.
func (s *labelSweeper) reportSweep(ctx context.Context, routes map[types.NamespacedName][]schema.GroupVersionResource, res SweepResult) {
	for key, resources := range routes {
		cond := labeledCondition(resources, res)
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var route ctrlmeshv1alpha1.ShardRoute
			if err := s.routesReader.Get(ctx, key, &route); err != nil {
				return err
			}
			c := cond
			c.ObservedGeneration = route.Generation
			if !meta.SetStatusCondition(&route.Status.Conditions, c) {
				return nil
			}
			return s.routes.Status().Update(ctx, &route)
		})
		if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
			s.log.Error(err, "Writing the Labeled condition failed; the next sweep writes it", "shardRoute", key)
		}
	}
}
