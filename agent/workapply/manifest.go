package workapply

import (
	"bytes"
	"encoding/json"
	"fmt"

	workv1alpha1 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// shardRouteGVK is the one kind the agent applies: its member RBAC covers
// ShardRoutes only.
var shardRouteGVK = ctrlmeshv1alpha1.ShardRouteGVK

// decodeManifest returns the Work's one manifest as a ShardRoute. Unknown
// fields are refused rather than dropped, so that nothing the hub wrote is
// silently lost on the way to the member.
func decodeManifest(work *workv1alpha1.Work) (*ctrlmeshv1alpha1.ShardRoute, error) {
	manifests := work.Spec.Workload.Manifests
	if len(manifests) != 1 {
		return nil, fmt.Errorf("the Work has %d manifests; the ctrlmesh agent applies Works of exactly one, a %s", len(manifests), shardRouteGVK.Kind)
	}
	raw := manifests[0].Raw
	var typeMeta metav1.TypeMeta
	if err := json.Unmarshal(raw, &typeMeta); err != nil {
		return nil, fmt.Errorf("manifest 0 is not a Kubernetes object: %w", err)
	}
	if gvk := typeMeta.GroupVersionKind(); gvk != shardRouteGVK {
		return nil, fmt.Errorf("manifest 0 is a %q of %q; the ctrlmesh agent applies only %s of %s",
			gvk.Kind, gvk.GroupVersion(), shardRouteGVK.Kind, shardRouteGVK.GroupVersion())
	}
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.DisallowUnknownFields()
	var route ctrlmeshv1alpha1.ShardRoute
	if err := decoder.Decode(&route); err != nil {
		return nil, fmt.Errorf("manifest 0 is not a valid ShardRoute: %w", err)
	}
	if route.Namespace == "" || route.Name == "" {
		return nil, fmt.Errorf("manifest 0, a ShardRoute, needs both metadata.namespace and metadata.name (has %q and %q)", route.Namespace, route.Name)
	}
	return &route, nil
}

// manifestTargets returns "namespace/name" of every ShardRoute the Work's
// manifests name, valid or not, for targetIndex.
func manifestTargets(work *workv1alpha1.Work) []string {
	var targets []string
	for _, m := range work.Spec.Workload.Manifests {
		var obj metav1.PartialObjectMetadata
		if json.Unmarshal(m.Raw, &obj) == nil && obj.GroupVersionKind() == shardRouteGVK {
			targets = append(targets, client.ObjectKeyFromObject(&obj).String())
		}
	}
	return targets
}
