package routework

import (
	"encoding/json"
	"fmt"
	"reflect"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// ManifestStatus is what Karmada's work-status controller reports of an
// applied ShardRoute, the Work's one manifest: its identity, its whole
// status and its health.
func ManifestStatus(route *ctrlmeshv1alpha1.ShardRoute) workv1alpha1.ManifestStatus {
	ms := workv1alpha1.ManifestStatus{
		Identifier: workv1alpha1.ResourceIdentifier{
			Ordinal:   0,
			Group:     shardRouteGVK.Group,
			Version:   shardRouteGVK.Version,
			Kind:      shardRouteGVK.Kind,
			Resource:  "shardroutes",
			Namespace: route.Namespace,
			Name:      route.Name,
		},
		Health: health(route),
	}
	// Like Karmada, no status stays nil rather than an empty object.
	if !reflect.DeepEqual(route.Status, ctrlmeshv1alpha1.ShardRouteStatus{}) {
		// Marshalling a struct of strings, numbers and times cannot fail.
		raw, _ := json.Marshal(route.Status)
		ms.Status = &runtime.RawExtension{Raw: raw}
	}
	return ms
}

// health is Healthy when the route's status describes its current spec and
// says the rules are applied and every proxy enforces them; Unhealthy when
// it describes the current spec and says either is not so; Unknown before
// the agent's status controller has caught up.
func health(route *ctrlmeshv1alpha1.ShardRoute) workv1alpha1.ResourceHealth {
	if route.Status.ObservedGeneration != route.Generation {
		return workv1alpha1.ResourceUnknown
	}
	conditions := route.Status.Conditions
	switch rules, proxies := meta.FindStatusCondition(conditions, ctrlmeshv1alpha1.ConditionRulesApplied), meta.FindStatusCondition(conditions, ctrlmeshv1alpha1.ConditionProxiesReady); {
	case rules != nil && rules.Status == metav1.ConditionFalse, proxies != nil && proxies.Status == metav1.ConditionFalse:
		return workv1alpha1.ResourceUnhealthy
	case rules != nil && rules.Status == metav1.ConditionTrue && proxies != nil && proxies.Status == metav1.ConditionTrue:
		return workv1alpha1.ResourceHealthy
	default:
		return workv1alpha1.ResourceUnknown
	}
}

// Report is what a member reflected into a Work's status.
type Report struct {
	// Cluster the Work is for.
	Cluster string
	// Applied is the Work's Applied condition; nil until the member reports
	// one. Its observedGeneration tells whether it describes the Work's
	// current spec (Current).
	Applied *metav1.Condition
	// Current is true when Applied is True for the Work's current
	// generation: the member holds the ShardRoute the Work carries now.
	Current bool
	// Health of the member's ShardRoute: Healthy when its status describes
	// its spec, the rules are applied and every proxy enforces them;
	// Unknown until the member reports.
	Health workv1alpha1.ResourceHealth
	// Route is the member ShardRoute's status as the member's agent wrote it:
	// candidate pods with their readiness, canary mark, address and
	// appliedRulesHash, the shards' leaders, the routing generation it
	// describes and its conditions. Zero until reported.
	Route ctrlmeshv1alpha1.ShardRouteStatus
}

// ReadStatus decodes a Work's status as Karmada's work-status controller, or
// the agent in standalone mode (ManifestStatus), writes it: the Applied
// condition and, in the manifest status of ordinal 0, the ShardRoute's
// identity, health and raw status. Fields the status has and ShardRouteStatus has not are
// ignored, so that a newer agent's report still reads. The report shares
// nothing with work.
func ReadStatus(work *workv1alpha1.Work) (Report, error) {
	report, err := ViewStatus(work)
	if err != nil {
		return Report{}, err
	}
	report.Route = *report.Route.DeepCopy()
	return report, nil
}

// ViewStatus is ReadStatus without copying a decoded status
// (DecodeStatus): the report's route status shares its slices with work's,
// and must not be modified. The hub reads each Work of a cache, whose
// objects nobody modifies, into its working model once per version of it;
// a copy for each doubled what a member's report cost the hub.
func ViewStatus(work *workv1alpha1.Work) (Report, error) {
	cluster, err := ClusterOf(work)
	if err != nil {
		return Report{}, err
	}
	report := Report{Cluster: cluster, Health: workv1alpha1.ResourceUnknown}
	if applied := meta.FindStatusCondition(work.Status.Conditions, workv1alpha1.WorkApplied); applied != nil {
		report.Applied = applied.DeepCopy()
		report.Current = applied.Status == metav1.ConditionTrue && applied.ObservedGeneration == work.Generation
	}
	// Karmada reports every manifest; the ShardRoute's status is the one
	// the hub reads, and those of the labeler's RBAC (manifests 1 and 2,
	// which have no status) are only checked for being what they are.
	var route *workv1alpha1.ManifestStatus
	for i := range work.Status.ManifestStatuses {
		ms := &work.Status.ManifestStatuses[i]
		switch id := ms.Identifier; {
		case isRoute(id) && route == nil:
			route = ms
		case id.Ordinal == 1 && id.Group == clusterRoleGVK.Group && id.Kind == clusterRoleGVK.Kind,
			id.Ordinal == 2 && id.Group == clusterRoleBindingGVK.Group && id.Kind == clusterRoleBindingGVK.Kind:
		default:
			return Report{}, fmt.Errorf("the status of Work %s/%s reports manifest %d, a %q of group %q; a ctrlmesh Work's manifest 0 is a %s of group %s, 1 and 2 the labeler's %s and %s",
				work.Namespace, work.Name, id.Ordinal, id.Kind, id.Group, shardRouteGVK.Kind, shardRouteGVK.Group, clusterRoleGVK.Kind, clusterRoleBindingGVK.Kind)
		}
	}
	if route == nil {
		return report, nil
	}
	ms := *route
	id := ms.Identifier
	switch ms.Health {
	case workv1alpha1.ResourceHealthy, workv1alpha1.ResourceUnhealthy, workv1alpha1.ResourceUnknown:
		report.Health = ms.Health
	case "":
	default:
		return Report{}, fmt.Errorf("the status of Work %s/%s reports health %q, not one of %s, %s, %s", work.Namespace, work.Name, ms.Health,
			workv1alpha1.ResourceHealthy, workv1alpha1.ResourceUnhealthy, workv1alpha1.ResourceUnknown)
	}
	switch {
	case ms.Status == nil:
	case len(ms.Status.Raw) > 0:
		if err := json.Unmarshal(ms.Status.Raw, &report.Route); err != nil {
			return Report{}, fmt.Errorf("the status of Work %s/%s: the reflected status of ShardRoute %s/%s is not a ShardRoute status: %w",
				work.Namespace, work.Name, id.Namespace, id.Name, err)
		}
	case ms.Status.Object != nil:
		decoded, ok := ms.Status.Object.(*DecodedRouteStatus)
		if !ok {
			return Report{}, fmt.Errorf("the status of Work %s/%s: the reflected status of ShardRoute %s/%s holds a %T, not a decoded ShardRoute status",
				work.Namespace, work.Name, id.Namespace, id.Name, ms.Status.Object)
		}
		report.Route = *(*ctrlmeshv1alpha1.ShardRouteStatus)(decoded)
	}
	return report, nil
}

// DecodedRouteStatus is a member ShardRoute's status as a Work's manifest
// status reflects it, decoded: what a cache of Works may hold in place of
// the raw status (DecodeStatus). It encodes as the raw status did.
type DecodedRouteStatus ctrlmeshv1alpha1.ShardRouteStatus

// GetObjectKind is empty: the status is no object of its own.
func (*DecodedRouteStatus) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the status whole.
func (d *DecodedRouteStatus) DeepCopyObject() runtime.Object {
	return (*DecodedRouteStatus)((*ctrlmeshv1alpha1.ShardRouteStatus)(d).DeepCopy())
}

// DecodeStatus decodes the ShardRoute status work's status reflects in
// place (DecodedRouteStatus), and returns it; nil when there is none. The
// raw status is dropped: ReadStatus reads either. A status that does not
// decode is left raw, for ReadStatus to report. A status decoded already
// is returned as it is.
func DecodeStatus(work *workv1alpha1.Work) *DecodedRouteStatus {
	for i := range work.Status.ManifestStatuses {
		ms := &work.Status.ManifestStatuses[i]
		if !isRoute(ms.Identifier) {
			continue
		}
		if ms.Status == nil {
			return nil
		}
		if len(ms.Status.Raw) == 0 {
			decoded, _ := ms.Status.Object.(*DecodedRouteStatus)
			return decoded
		}
		decoded := &DecodedRouteStatus{}
		if json.Unmarshal(ms.Status.Raw, (*ctrlmeshv1alpha1.ShardRouteStatus)(decoded)) != nil {
			return nil
		}
		ms.Status = &runtime.RawExtension{Object: decoded}
		return decoded
	}
	return nil
}

// isRoute reports whether id names a Work's ShardRoute: its manifest 0.
func isRoute(id workv1alpha1.ResourceIdentifier) bool {
	return id.Ordinal == 0 && id.Group == shardRouteGVK.Group && id.Kind == shardRouteGVK.Kind
}
