package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Subset is a named group of the operator's pods (ControllerMesh's subsets
// with route rules), picked by their labels, that serves exactly what its
// rules name: whole buckets, single namespaces by name, and the namespaces
// whose labels match namespaceSelector and whose name matches
// namespaceRegex (PerCluster scope: each member's agent reports which of
// its namespaces match, and the hub moves them as it moves any namespace). Its pods form one
// shard, whose ID is the subset's name (one pod leads, the others stand by);
// what no subset names is sharded among the other pods as without subsets.
// A subset whose pods are all gone or unready gives its buckets and
// namespaces back to the other shards. Every move between a subset and the
// other shards is revoke-before-grant, as any bucket move.
//
// The canary (spec.canary) is a subset too, named "canary", whose rules are
// the step in force.
// +kubebuilder:validation:XValidation:rule="has(self.buckets) || (has(self.namespaces) && size(self.namespaces) > 0) || has(self.namespaceSelector) || (has(self.namespaceRegex) && size(self.namespaceRegex) > 0)",message="a subset must name buckets, namespaces, a namespaceSelector or a namespaceRegex for its pods to serve"
// +kubebuilder:validation:XValidation:rule="!has(self.buckets) || !self.buckets.matches('^[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*$') || self.buckets.split(',').all(r, r.split('-').size() == 1 || int(r.split('-')[0]) <= int(r.split('-')[1]))",message="subset buckets: a range must run from low to high, such as 4-7"
type Subset struct {
	// Name of the subset, and the ID of its shard: a DNS label starting
	// with a letter (the other shards are numbered), not "canary".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self != 'canary'",message="subset name \"canary\" is the canary's: use spec.canary for it, or another name"
	Name string `json:"name"`
	// Selector picks the subset's pods among the operator's pods, such as
	// matchLabels: {version: v2}. A pod several subsets select belongs to
	// the first of them; a canary pod to the canary.
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="a subset's selector must not be empty: it would put every operator pod in the subset"
	Selector metav1.LabelSelector `json:"selector"`
	// Buckets the subset serves, in compact notation ("0-3,12").
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*$`
	// +optional
	Buckets string `json:"buckets,omitempty"`
	// Namespaces the subset serves exactly, carved out of whichever shard
	// owns their bucket.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
	// NamespaceSelector on the labels of the members' Namespace objects:
	// the subset also serves the namespaces it matches (and namespaceRegex,
	// when set), except those another subset or the canary names by name,
	// or an earlier subset matches. At most 64 namespaces in all per member.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// NamespaceRegex is an RE2 regular expression on namespace names, such
	// as "^canary-": the subset also serves the namespaces it matches (and
	// namespaceSelector, when set). Not anchored unless it says so.
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self == '' || self.matches(self) || !self.matches(self)",message="namespaceRegex must be a valid RE2 regular expression, such as ^canary-"
	// +optional
	NamespaceRegex string `json:"namespaceRegex,omitempty"`
}

// RouteSubset tells the agent which pods form a subset, so that it reports
// each candidate pod's subset to the hub.
type RouteSubset struct {
	// Name of the subset.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=40
	Name string `json:"name"`
	// Selector picks the subset's pods.
	Selector metav1.LabelSelector `json:"selector"`
	// NamespaceSelector and NamespaceRegex are the subset's rules on
	// namespaces, which the agent resolves against the member's Namespaces.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// +kubebuilder:validation:MaxLength=256
	// +optional
	NamespaceRegex string `json:"namespaceRegex,omitempty"`
}

// RouteSubsetStatus is what the agent found of a subset's namespace rules
// in its member.
type RouteSubsetStatus struct {
	// Name of the subset.
	Name string `json:"name"`
	// Namespaces of the member that match the subset's namespaceSelector
	// and namespaceRegex, sorted.
	// +optional
	// +listType=set
	Namespaces []string `json:"namespaces,omitempty"`
}
