// Package routework is how a ShardRoute rides in a Karmada Work and how its
// status comes back, in Karmada's conventions, so that either Karmada's
// execution and work-status controllers or the ctrlmesh agent in standalone
// mode (agent/workapply) can apply the Works the hub writes (hub/propagation).
//
//   - WorkKey, NewWork and ClusterOf: where the Work of a ShardRoute lives.
//   - SetManifest and Decode: the ShardRoute as the Work's one manifest.
//   - AppliedLabels, AppliedAnnotations and AppliedFrom: Karmada's label and
//     annotations that tie the ShardRoute in the member to its Work.
//   - ManifestStatus and ReadStatus: the applied ShardRoute's status and
//     health in the Work's status, written by the member's side and read by
//     the hub.
package routework

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	workv1alpha2 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha2"
	"github.com/karmada-io/karmada/pkg/util"
	"github.com/karmada-io/karmada/pkg/util/names"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	strictjson "sigs.k8s.io/json"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

var shardRouteGVK = ctrlmeshv1alpha1.ShardRouteGVK

// WorkKey is where the Work carrying the ShardRoute namespace/name to
// cluster lives: in the cluster's execution namespace karmada-es-<cluster>,
// under Karmada's name for the Work of that ShardRoute. ClusterOf reads the
// cluster back.
func WorkKey(cluster, namespace, name string) types.NamespacedName {
	return types.NamespacedName{
		Namespace: names.GenerateExecutionSpaceName(cluster),
		Name:      names.GenerateWorkName(shardRouteGVK.Kind, name, namespace),
	}
}

// NewWork is a Work at key with nothing in it but a new permanent ID label.
// Where Karmada runs, its Work webhook sets that ID; in standalone mode there
// is no webhook, so the writer of a Work sets it, and the agent copies it
// onto the ShardRoute (AppliedLabels) as Karmada's execution controller does.
func NewWork(key types.NamespacedName) *workv1alpha1.Work {
	return &workv1alpha1.Work{ObjectMeta: metav1.ObjectMeta{
		Namespace: key.Namespace, Name: key.Name,
		Labels: map[string]string{workv1alpha2.WorkPermanentIDLabel: string(uuid.NewUUID())},
	}}
}

// ClusterOf is the member cluster of a Work, from its execution namespace
// (karmada-es-<cluster>).
func ClusterOf(work *workv1alpha1.Work) (string, error) {
	cluster, err := names.GetClusterName(work.Namespace)
	if err != nil || cluster == "" {
		return "", fmt.Errorf("work %s/%s is not in an execution namespace (%s<cluster>)", work.Namespace, work.Name, names.ExecutionSpacePrefix)
	}
	return cluster, nil
}

// AppliedLabels are the labels the ShardRoute of work carries, in its
// manifest and in the member: Karmada's managed label and the Work's
// permanent ID, when it has one.
func AppliedLabels(work *workv1alpha1.Work) map[string]string {
	labels := map[string]string{util.ManagedByKarmadaLabel: util.ManagedByKarmadaLabelValue}
	if id := work.Labels[workv1alpha2.WorkPermanentIDLabel]; id != "" {
		labels[workv1alpha2.WorkPermanentIDLabel] = id
	}
	return labels
}

// AppliedAnnotations are the annotations that name work on the ShardRoute it
// carries, in its manifest and in the member.
func AppliedAnnotations(work *workv1alpha1.Work) map[string]string {
	return map[string]string{
		workv1alpha2.WorkNamespaceAnnotation: work.Namespace,
		workv1alpha2.WorkNameAnnotation:      work.Name,
	}
}

// AppliedFrom reads back the Work an object names in its annotations, and
// whether it carries Karmada's managed label: whether it was applied from a
// Work at all.
func AppliedFrom(obj metav1.Object) (work types.NamespacedName, managed bool) {
	annotations := obj.GetAnnotations()
	work = types.NamespacedName{Namespace: annotations[workv1alpha2.WorkNamespaceAnnotation], Name: annotations[workv1alpha2.WorkNameAnnotation]}
	return work, obj.GetLabels()[util.ManagedByKarmadaLabel] == util.ManagedByKarmadaLabelValue
}

// SetManifest makes route the one manifest of work, with the labels and
// annotations Karmada's CreateOrUpdateWork and Work webhook put on a
// manifest: AppliedLabels, AppliedAnnotations and the records of the keys it
// manages. Karmada's resource template UID annotation is left out: a
// ShardRoute comes from no resource template. Set work's name, namespace and
// labels first.
func SetManifest(work *workv1alpha1.Work, route *ctrlmeshv1alpha1.ShardRoute) error {
	labels := AppliedLabels(work)
	annotations := AppliedAnnotations(work)
	annotations[workv1alpha2.ManagedLabels] = strings.Join(slices.Sorted(maps.Keys(labels)), ",")
	managed := append(slices.Collect(maps.Keys(annotations)), workv1alpha2.ManagedAnnotation)
	slices.Sort(managed)
	annotations[workv1alpha2.ManagedAnnotation] = strings.Join(managed, ",")

	manifest := &ctrlmeshv1alpha1.ShardRoute{
		TypeMeta: metav1.TypeMeta{APIVersion: shardRouteGVK.GroupVersion().String(), Kind: shardRouteGVK.Kind},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: route.Namespace, Name: route.Name, Labels: labels, Annotations: annotations,
		},
		Spec: route.Spec,
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(manifest)
	if err != nil {
		return fmt.Errorf("converting ShardRoute %s/%s: %w", route.Namespace, route.Name, err)
	}
	// What Karmada prunes from manifests: a null creationTimestamp and an
	// empty status would only be noise.
	unstructured.RemoveNestedField(obj, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(obj, "status")
	data, err := json.Marshal(obj)
	if err != nil {
		return fmt.Errorf("encoding ShardRoute %s/%s: %w", route.Namespace, route.Name, err)
	}
	work.Spec.Workload.Manifests = []workv1alpha1.Manifest{{RawExtension: runtime.RawExtension{Raw: data}}}
	return nil
}

// Decode returns the one manifest of a Work as a ShardRoute. Decoding is
// strict: unknown and duplicate fields are refused rather than dropped, so
// that nothing the hub wrote is silently lost on the way to the member, and
// a manifest the hub did not write is an error rather than a half-read
// route. Errors do not name the Work: the hub names it, and the agent writes
// them into the Work's own status.
func Decode(work *workv1alpha1.Work) (*ctrlmeshv1alpha1.ShardRoute, error) {
	manifests := work.Spec.Workload.Manifests
	if len(manifests) != 1 {
		return nil, fmt.Errorf("the Work has %d manifests; a ctrlmesh Work carries exactly one, a %s", len(manifests), shardRouteGVK.Kind)
	}
	raw := manifests[0].Raw
	// The kind first, so that another object is named as such rather than
	// refused for its fields.
	var typeMeta metav1.TypeMeta
	if err := json.Unmarshal(raw, &typeMeta); err != nil {
		return nil, fmt.Errorf("manifest 0 is not a Kubernetes object: %w", err)
	}
	if gvk := typeMeta.GroupVersionKind(); gvk != shardRouteGVK {
		return nil, fmt.Errorf("manifest 0 is a %q of %q; a ctrlmesh Work carries a %s of %s",
			gvk.Kind, gvk.GroupVersion(), shardRouteGVK.Kind, shardRouteGVK.GroupVersion())
	}
	var route ctrlmeshv1alpha1.ShardRoute
	strict, err := strictjson.UnmarshalStrict(raw, &route)
	if err == nil {
		err = errors.Join(strict...)
	}
	if err != nil {
		return nil, fmt.Errorf("manifest 0 is not a valid ShardRoute: %w", err)
	}
	if route.Namespace == "" || route.Name == "" {
		return nil, fmt.Errorf("manifest 0, a ShardRoute, needs both metadata.namespace and metadata.name (has %q and %q)", route.Namespace, route.Name)
	}
	return &route, nil
}

// Targets returns "namespace/name" of every ShardRoute the Work's manifests
// name, valid or not: the member objects the Work may conflict with.
func Targets(work *workv1alpha1.Work) []string {
	var targets []string
	for _, m := range work.Spec.Workload.Manifests {
		var obj metav1.PartialObjectMetadata
		if json.Unmarshal(m.Raw, &obj) == nil && obj.GroupVersionKind() == shardRouteGVK {
			targets = append(targets, types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}.String())
		}
	}
	return targets
}
