// Package labeler is the ctrlmesh agent's labeler for label mode. In label
// mode the ctrlmesh proxy narrows an operator's lists and watches by label
// selectors, so every object of a sharded resource must carry
//
//	ctrlmesh.io/sharding-hash=<bucket of its namespace>
//	ctrlmesh.io/namespace=<its namespace>
//	ctrlmesh.io/control=true
//
// The labeler keeps them there by two means: a mutating admission webhook
// (Handler, WebhookConfiguration) labels objects as they are created or
// updated, and a Labeler sweeps every existing object now and every period,
// patching those the webhook missed (created before it was registered, while
// it was down, or updated past its object selector).
//
// In range mode (KEP-5866 server-side sharded list and watch) objects need no
// labels: the caller then neither runs a Labeler nor registers the webhook.
package labeler

import (
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// controlValue is the value of ctrlmeshv1alpha1.ControlLabel on labeled
// objects.
const controlValue = "true"

// namespaceNameLabel is the label kube-apiserver puts on every namespace,
// holding its name.
const namespaceNameLabel = "kubernetes.io/metadata.name"

// Targets say which objects the labeler labels: those of Resources in the
// namespaces NamespaceSelector selects.
type Targets struct {
	// Resources are the namespaced resources to label, such as
	// {Version: "v1", Resource: "configmaps"}. Subresources are not resources.
	Resources []schema.GroupVersionResource
	// Space computes the bucket of a namespace.
	Space sharding.Space
	// NamespaceSelector selects the controlled namespaces by their labels.
	// Nil or empty selects every namespace. ctrlmeshv1alpha1.SystemNamespaces are excluded
	// either way.
	NamespaceSelector *metav1.LabelSelector
}

// Validate reports whether the targets can be used.
func (r Targets) Validate() error {
	if len(r.Resources) == 0 {
		return errors.New("labeler: no resources to label")
	}
	if r.Space.Buckets() == 0 {
		return errors.New("labeler: no bucket space")
	}
	seen := map[schema.GroupVersionResource]bool{}
	for _, gvr := range r.Resources {
		if gvr.Version == "" || gvr.Resource == "" {
			return fmt.Errorf("labeler: resource %q needs a version and a resource name", resourceName(gvr))
		}
		if seen[gvr] {
			return fmt.Errorf("labeler: resource %q listed twice", resourceName(gvr))
		}
		seen[gvr] = true
	}
	if _, err := r.namespaceSelector(); err != nil {
		return err
	}
	return nil
}

// namespaceSelector is NamespaceSelector as a labels.Selector.
func (r Targets) namespaceSelector() (labels.Selector, error) {
	if r.NamespaceSelector == nil {
		return labels.Everything(), nil
	}
	sel, err := metav1.LabelSelectorAsSelector(r.NamespaceSelector)
	if err != nil {
		return nil, fmt.Errorf("labeler: namespace selector: %w", err)
	}
	return sel, nil
}

// hasResource reports whether gvr is one of the targets' resources.
func (r Targets) hasResource(gvr schema.GroupVersionResource) bool {
	for _, res := range r.Resources {
		if res == gvr {
			return true
		}
	}
	return false
}

// isSystemNamespace reports whether ns is one of ctrlmeshv1alpha1.SystemNamespaces.
func isSystemNamespace(ns string) bool {
	for _, s := range ctrlmeshv1alpha1.SystemNamespaces() {
		if ns == s {
			return true
		}
	}
	return false
}

// DesiredLabels are the labels every controlled object of namespace ns must
// carry under space.
func DesiredLabels(space sharding.Space, ns string) map[string]string {
	return map[string]string{
		ctrlmeshv1alpha1.ShardingHashLabel: sharding.LabelValue(space.Bucket(ns)),
		ctrlmeshv1alpha1.NamespaceLabel:    ns,
		ctrlmeshv1alpha1.ControlLabel:      controlValue,
	}
}

// needsLabels reports whether have lacks any of want or holds another value.
func needsLabels(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return true
		}
	}
	return false
}
