package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NamespaceIsolation is a hard limit on the namespaces every pod of the
// operator sees and writes, on top of sharding (ControllerMesh's "global
// limits"): a namespace is inside when its labels match namespaceSelector
// and its name matches namespaceRegex (each when set). Every proxy follows
// the Namespaces' labels: a namespace relabelled out leaves the operator's
// view (its watches relist without it) and its writes are refused; one
// relabelled in appears. A proxy that cannot confirm a namespace's labels
// treats it as outside.
// +kubebuilder:validation:XValidation:rule="has(self.namespaceSelector) || (has(self.namespaceRegex) && size(self.namespaceRegex) > 0)",message="isolation must set namespaceSelector (labels of the Namespaces the operator may use) or namespaceRegex (a pattern on their names), or both"
type NamespaceIsolation struct {
	// NamespaceSelector on the labels of Namespace objects. An empty
	// selector ({}) matches every namespace.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// NamespaceRegex is an RE2 regular expression a namespace's name must
	// match, such as "^team-a-". It is not anchored unless it says so.
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self == '' || self.matches(self) || !self.matches(self)",message="namespaceRegex must be a valid RE2 regular expression, such as ^team-a-"
	// +optional
	NamespaceRegex string `json:"namespaceRegex,omitempty"`
}
