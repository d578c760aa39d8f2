package labeler

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// Refusal is a ShardRoute the labels cannot serve, and why.
type Refusal struct {
	Route   *ctrlmeshv1alpha1.ShardRoute
	Reason  string
	Message string
}

// TargetsForRoutes returns the labeling targets the member's ShardRoutes imply:
// every served resource that a limit of some route names (wildcards
// expanded against served), with buckets counted as the oldest route counts
// them. The label holds one bucket number per object, so routes with another
// bucket count cannot be served in label mode: they are refused, as are
// routes whose limits do not compile (the status controller reports those).
// With no usable route, the targets have no resources and ok is false.
func TargetsForRoutes(routes []ctrlmeshv1alpha1.ShardRoute, served []schema.GroupVersionResource, scopes rules.Scopes) (r Targets, ok bool, refused []Refusal) {
	ordered := make([]*ctrlmeshv1alpha1.ShardRoute, 0, len(routes))
	for i := range routes {
		if routes[i].DeletionTimestamp == nil {
			ordered = append(ordered, &routes[i])
		}
	}
	// Oldest first, so that a newer route never changes the labels of the
	// objects an older one already serves.
	slices.SortFunc(ordered, func(a, b *ctrlmeshv1alpha1.ShardRoute) int {
		return cmp.Or(
			a.CreationTimestamp.Compare(b.CreationTimestamp.Time),
			cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Name, b.Name))
	})
	var limits []rules.Limit
	for _, route := range ordered {
		compiled, err := rules.CompileLimits(route.Spec.Limits, scopes)
		if err != nil {
			continue
		}
		if r.Space.Buckets() == 0 {
			space, err := sharding.NewSpace(int(route.Spec.Buckets))
			if err != nil {
				continue
			}
			r.Space = space
		} else if int(route.Spec.Buckets) != r.Space.Buckets() {
			refused = append(refused, Refusal{Route: route, Reason: ctrlmeshv1alpha1.ReasonBucketCountConflict, Message: fmt.Sprintf(
				"label mode writes one bucket number per object, counted in %d buckets as the oldest ShardRoute in this cluster counts them; this route counts %d, so its proxies would select the wrong objects: give its ShardingConfig %d buckets",
				r.Space.Buckets(), route.Spec.Buckets, r.Space.Buckets())})
			continue
		}
		limits = append(limits, compiled...)
	}
	for _, gvr := range served {
		if slices.ContainsFunc(limits, func(l rules.Limit) bool { return l.Matches(gvr.GroupResource()) }) {
			r.Resources = append(r.Resources, gvr)
		}
	}
	return r, len(r.Resources) > 0, refused
}

// ServedResources lists the namespaced resources, in their preferred
// versions, that the labeler can work on: those the API server lists,
// watches and patches. Groups that fail discovery are left out; the error
// says which, and the caller may use the rest.
func ServedResources(d discovery.DiscoveryInterface) ([]schema.GroupVersionResource, error) {
	lists, err := d.ServerPreferredNamespacedResources()
	if err != nil && len(lists) == 0 {
		return nil, fmt.Errorf("labeler: discovering resources: %w", err)
	}
	var out []schema.GroupVersionResource
	for _, list := range lists {
		gv, perr := schema.ParseGroupVersion(list.GroupVersion)
		if perr != nil {
			continue
		}
		for _, res := range list.APIResources {
			if strings.Contains(res.Name, "/") || !hasVerbs(res, "list", "watch", "patch") {
				continue
			}
			out = append(out, gv.WithResource(res.Name))
		}
	}
	slices.SortFunc(out, func(a, b schema.GroupVersionResource) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Resource, b.Resource))
	})
	if err != nil {
		return out, fmt.Errorf("labeler: discovering resources (some groups left out): %w", err)
	}
	return out, nil
}

func hasVerbs(res metav1.APIResource, verbs ...string) bool {
	for _, v := range verbs {
		if !slices.Contains(res.Verbs, v) {
			return false
		}
	}
	return true
}
