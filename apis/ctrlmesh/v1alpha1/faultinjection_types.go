package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FaultDelay holds a matched request back before the proxy forwards it.
type FaultDelay struct {
	// Milliseconds the request is held back.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=60000
	Milliseconds int32 `json:"milliseconds"`
}

// FaultAbort answers a matched request itself, without forwarding it.
type FaultAbort struct {
	// StatusCode of the answer, such as 500 or 503 (an API request gets a
	// Status with it; an external one a plain-text body).
	// +kubebuilder:validation:Minimum=400
	// +kubebuilder:validation:Maximum=599
	StatusCode int32 `json:"statusCode"`
}

// FaultWindow is when a fault is in force, on each proxy's clock.
// +kubebuilder:validation:XValidation:rule="!has(self.start) || !has(self.end) || self.end > self.start",message="window.end must be after window.start"
// +kubebuilder:validation:XValidation:rule="has(self.start) || has(self.end)",message="a window needs a start, an end or both"
type FaultWindow struct {
	// Start of the window; absent, the fault is in force until the end.
	// +optional
	Start *metav1.Time `json:"start,omitempty"`
	// End of the window; absent, the fault stays in force from the start.
	// +optional
	End *metav1.Time `json:"end,omitempty"`
}

// Fault is one injected fault: a delay, an abort or both (the delay
// first), on a percentage of the matched requests.
// +kubebuilder:validation:XValidation:rule="has(self.delay) || has(self.abort)",message="a fault needs a delay, an abort or both"
// +kubebuilder:validation:XValidation:rule="!has(self.shards) || !has(self.canaryOnly) || !self.canaryOnly",message="set shards or canaryOnly, not both: canaryOnly already names the canary shard"
type Fault struct {
	// Name of the fault, unique in the FaultInjection; the proxies count
	// every injected fault under it (ctrlmesh_proxy_faults_injected_total).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Match selects the requests the fault may hit.
	Match TrafficMatch `json:"match"`
	// Percent of the matched requests the fault hits, each drawn at random.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Percent int32 `json:"percent"`
	// Delay, if set, holds the hit requests back.
	// +optional
	Delay *FaultDelay `json:"delay,omitempty"`
	// Abort, if set, answers the hit requests with an error.
	// +optional
	Abort *FaultAbort `json:"abort,omitempty"`
	// Window, if set, limits the fault to a time span.
	// +optional
	Window *FaultWindow `json:"window,omitempty"`
	// Shards, if set, limits the fault to the proxies of the pods serving
	// these shard IDs.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=50
	// +listType=set
	// +optional
	Shards []string `json:"shards,omitempty"`
	// CanaryOnly limits the fault to the proxies of the canary shard's pods.
	// +optional
	CanaryOnly bool `json:"canaryOnly,omitempty"`
}

// FaultInjectionSpec is a set of faults injected into an operator's
// requests.
type FaultInjectionSpec struct {
	// ShardingConfig whose operator pods get the faults.
	ShardingConfig ShardingConfigReference `json:"shardingConfig"`
	// Faults to inject. A request matched by several gets the first that
	// hits it.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	Faults []Fault `json:"faults"`
}

// FaultInjection injects delays and errors into an operator's requests at
// every proxy of the ShardingConfig it names, so that the operator's
// reconcile logic can be tested under faults without changing it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=fi,categories=ctrlmesh
// +kubebuilder:printcolumn:name="ShardingConfig",type=string,JSONPath=`.spec.shardingConfig.name`
// +kubebuilder:printcolumn:name="Enforced",type=string,JSONPath=`.status.conditions[?(@.type=="Enforced")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FaultInjection struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   FaultInjectionSpec `json:"spec"`
	Status PolicyStatus       `json:"status,omitempty"`
}

// FaultInjectionList is a list of FaultInjections.
// +kubebuilder:object:root=true
type FaultInjectionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FaultInjection `json:"items"`
}
