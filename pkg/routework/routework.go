// Package routework is how a ShardRoute rides in a Karmada Work and how its
// status comes back, in Karmada's conventions, so that either Karmada's
// execution and work-status controllers or the ctrlmesh agent in standalone
// mode (agent/workapply) can apply the Works the hub writes (hub/propagation).
//
//   - WorkKey, NewWork and ClusterOf: where the Work of a ShardRoute lives.
//   - SetManifests, Decode and DecodeAll: the ShardRoute as the Work's first
//     manifest, and the labeler's ClusterRole and binding (NewLabelerRBAC)
//     after it.
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
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

// SetManifests makes route the first manifest of work and, when rbac is not
// nil, its ClusterRole and ClusterRoleBinding the second and third, each
// with the labels and annotations Karmada's CreateOrUpdateWork and Work
// webhook put on a manifest: AppliedLabels and the records of the keys it
// manages, and, on the route only, AppliedAnnotations. Karmada's resource
// template UID annotation is left out: they come from no resource
// template. Set work's name, namespace and labels first.
//
// The RBAC manifests do not name the Work: Karmada's work-status
// controller reflects a member object into the Work those annotations
// name, and (v1.16) replaces the Work's whole manifestStatuses with that
// one object's status, since Karmada itself writes one manifest per Work.
// Named, the labeler's ClusterRole, updated whenever the limits change,
// replaced the ShardRoute's status in the Work; the hub then read no pods
// in the member and took every shard from them until the route's next
// status came back. Karmada applies and deletes the RBAC all the same (it
// goes by the managed label); what it does not do for them is what it does
// by those annotations: report their status, which the hub does not read,
// and restore them at once when someone changes them in the member (it
// restores them at the Work's next change).
func SetManifests(work *workv1alpha1.Work, route *ctrlmeshv1alpha1.ShardRoute, rbac *LabelerRBAC) error {
	labels := AppliedLabels(work)
	annotations := managedRecords(labels, AppliedAnnotations(work))

	objects := []runtime.Object{&ctrlmeshv1alpha1.ShardRoute{
		TypeMeta: metav1.TypeMeta{APIVersion: shardRouteGVK.GroupVersion().String(), Kind: shardRouteGVK.Kind},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: route.Namespace, Name: route.Name, Labels: labels, Annotations: annotations,
		},
		Spec: route.Spec,
	}}
	if rbac != nil {
		if err := rbac.Check(); err != nil {
			return fmt.Errorf("the labeler RBAC of ShardRoute %s/%s: %w", route.Namespace, route.Name, err)
		}
		role, binding := rbac.Role.DeepCopy(), rbac.Binding.DeepCopy()
		role.Labels, role.Annotations = merged(role.Labels, labels), managedRecords(labels, nil)
		binding.Labels, binding.Annotations = merged(binding.Labels, labels), managedRecords(labels, nil)
		objects = append(objects, role, binding)
	}
	manifests := make([]workv1alpha1.Manifest, 0, len(objects))
	for _, object := range objects {
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(object)
		if err != nil {
			return fmt.Errorf("converting the manifests of ShardRoute %s/%s: %w", route.Namespace, route.Name, err)
		}
		// What Karmada prunes from manifests: a null creationTimestamp and an
		// empty status would only be noise.
		unstructured.RemoveNestedField(obj, "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(obj, "status")
		data, err := json.Marshal(obj)
		if err != nil {
			return fmt.Errorf("encoding the manifests of ShardRoute %s/%s: %w", route.Namespace, route.Name, err)
		}
		manifests = append(manifests, workv1alpha1.Manifest{RawExtension: runtime.RawExtension{Raw: data}})
	}
	work.Spec.Workload.Manifests = manifests
	return nil
}

// managedRecords returns annotations with the records Karmada keeps on a
// manifest of the label and annotation keys it manages, so that it removes
// from the member object the ones a later manifest drops.
func managedRecords(labels, annotations map[string]string) map[string]string {
	out := maps.Clone(annotations)
	if out == nil {
		out = map[string]string{}
	}
	out[workv1alpha2.ManagedLabels] = strings.Join(slices.Sorted(maps.Keys(labels)), ",")
	managed := append(slices.Collect(maps.Keys(out)), workv1alpha2.ManagedAnnotation)
	slices.Sort(managed)
	out[workv1alpha2.ManagedAnnotation] = strings.Join(managed, ",")
	return out
}

// merged returns the union of maps, later ones winning.
func merged(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

// Manifests are what a ctrlmesh Work carries: its ShardRoute and, when the
// hub granted the labeler rights, their ClusterRole and binding.
type Manifests struct {
	Route *ctrlmeshv1alpha1.ShardRoute
	// Labeler is nil when the Work carries no labeler RBAC.
	Labeler *LabelerRBAC
}

// Decode returns the ShardRoute of a Work: DecodeAll's Route.
func Decode(work *workv1alpha1.Work) (*ctrlmeshv1alpha1.ShardRoute, error) {
	m, err := DecodeAll(work)
	if err != nil {
		return nil, err
	}
	return m.Route, nil
}

// DecodeAll returns the manifests of a Work. A ctrlmesh Work carries a
// ShardRoute as manifest 0 and nothing else, or also a labeler ClusterRole
// as manifest 1 and its ClusterRoleBinding as manifest 2, which must pass
// LabelerRBAC.Check. Decoding is strict: unknown and duplicate fields are
// refused rather than dropped, so that nothing the hub wrote is silently
// lost on the way to the member, and a manifest the hub did not write is an
// error rather than a half-read route or a role granting what the hub did
// not mean. Errors do not name the Work: the hub names it, and the agent
// writes them into the Work's own status.
func DecodeAll(work *workv1alpha1.Work) (Manifests, error) {
	manifests := work.Spec.Workload.Manifests
	if n := len(manifests); n != 1 && n != 3 {
		return Manifests{}, fmt.Errorf("the Work has %d manifests; a ctrlmesh Work carries a %s, and maybe a labeler %s and %s", n,
			shardRouteGVK.Kind, clusterRoleGVK.Kind, clusterRoleBindingGVK.Kind)
	}
	var m Manifests
	m.Route = &ctrlmeshv1alpha1.ShardRoute{}
	if err := decodeManifest(manifests, 0, shardRouteGVK, m.Route); err != nil {
		return Manifests{}, err
	}
	if m.Route.Namespace == "" || m.Route.Name == "" {
		return Manifests{}, fmt.Errorf("manifest 0, a ShardRoute, needs both metadata.namespace and metadata.name (has %q and %q)", m.Route.Namespace, m.Route.Name)
	}
	if len(manifests) == 1 {
		return m, nil
	}
	m.Labeler = &LabelerRBAC{Role: &rbacv1.ClusterRole{}, Binding: &rbacv1.ClusterRoleBinding{}}
	if err := decodeManifest(manifests, 1, clusterRoleGVK, m.Labeler.Role); err != nil {
		return Manifests{}, err
	}
	if err := decodeManifest(manifests, 2, clusterRoleBindingGVK, m.Labeler.Binding); err != nil {
		return Manifests{}, err
	}
	if err := m.Labeler.Check(); err != nil {
		return Manifests{}, fmt.Errorf("manifests 1 and 2 are not the labeler's RBAC: %w", err)
	}
	return m, nil
}

// decodeManifest decodes manifest i, which must be of kind gvk, strictly
// into into.
func decodeManifest(manifests []workv1alpha1.Manifest, i int, gvk schema.GroupVersionKind, into any) error {
	raw := manifests[i].Raw
	// The kind first, so that another object is named as such rather than
	// refused for its fields.
	var typeMeta metav1.TypeMeta
	if err := json.Unmarshal(raw, &typeMeta); err != nil {
		return fmt.Errorf("manifest %d is not a Kubernetes object: %w", i, err)
	}
	if got := typeMeta.GroupVersionKind(); got != gvk {
		return fmt.Errorf("manifest %d is a %q of %q; there a ctrlmesh Work carries a %s of %s",
			i, got.Kind, got.GroupVersion(), gvk.Kind, gvk.GroupVersion())
	}
	strict, err := strictjson.UnmarshalStrict(raw, into)
	if err == nil {
		err = errors.Join(strict...)
	}
	if err != nil {
		return fmt.Errorf("manifest %d is not a valid %s: %w", i, gvk.Kind, err)
	}
	return nil
}

// Targets returns Target of every object the Work's manifests name that
// the Work applies — ShardRoutes, and ClusterRoles and ClusterRoleBindings
// for the labeler — valid or not: the member objects the Work may conflict
// with.
func Targets(work *workv1alpha1.Work) []string {
	var targets []string
	for _, m := range work.Spec.Workload.Manifests {
		var obj metav1.PartialObjectMetadata
		if json.Unmarshal(m.Raw, &obj) != nil {
			continue
		}
		switch gvk := obj.GroupVersionKind(); gvk {
		case shardRouteGVK, clusterRoleGVK, clusterRoleBindingGVK:
			targets = append(targets, Target(gvk.Kind, obj.Namespace, obj.Name))
		}
	}
	return targets
}

// Target names a member object of kind as Targets does:
// "<kind>/<namespace>/<name>", the namespace empty for cluster-scoped
// objects.
func Target(kind, namespace, name string) string {
	return kind + "/" + namespace + "/" + name
}
