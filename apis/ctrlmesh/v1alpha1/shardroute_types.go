package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RoutePod is one operator pod of a shard.
type RoutePod struct {
	// Name of the pod.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Address (IP or host name) the pod's proxy serves webhooks on, so that
	// peers can forward admission requests for this shard's objects.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Address string `json:"address,omitempty"`
}

// RouteShard is one shard of the rules: the buckets its pods serve now, and
// those they will serve once the previous owner has let them go.
// +kubebuilder:validation:XValidation:rule="has(self.buckets) || has(self.pendingBuckets) || (has(self.namespaces) && size(self.namespaces) > 0) || (has(self.pendingNamespaces) && size(self.pendingNamespaces) > 0)",message="a shard must be given buckets, pending buckets, namespaces or pending namespaces"
type RouteShard struct {
	// ID of the shard; the leader-election lock becomes "<name>---<id>".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=50
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	ID string `json:"id"`
	// Buckets the shard's pods may serve now, in compact notation ("0-7,12").
	// +kubebuilder:validation:MaxLength=16384
	// +kubebuilder:validation:Pattern=`^[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*$`
	// +optional
	Buckets string `json:"buckets,omitempty"`
	// PendingBuckets are granted to the shard but not yet to be served: the
	// hub moves them into buckets once their previous owner enforces rules
	// without them (revoke before grant).
	// +kubebuilder:validation:MaxLength=16384
	// +kubebuilder:validation:Pattern=`^[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*$`
	// +optional
	PendingBuckets string `json:"pendingBuckets,omitempty"`
	// Namespaces the shard serves exactly, whatever their bucket (canary).
	// Every other shard excludes them.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
	// PendingNamespaces are granted to the shard exactly but not yet to be
	// served: the hub moves them into namespaces once their previous owner
	// enforces rules without them. Meanwhile their buckets are pending too,
	// so nobody serves them.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	// +optional
	PendingNamespaces []string `json:"pendingNamespaces,omitempty"`
	// Canary is true for the canary shard.
	// +optional
	Canary bool `json:"canary,omitempty"`
	// Subset is the name of the subset whose pods serve the shard, if any.
	// +kubebuilder:validation:MaxLength=40
	// +optional
	Subset string `json:"subset,omitempty"`
	// Pods of the shard in this cluster. A shard with no pods here runs in
	// another cluster (Fleet scope) and is listed for its namespaces.
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	// +optional
	Pods []RoutePod `json:"pods,omitempty"`
}

// ShardRouteSpec is the rules for one ShardingConfig in one member cluster.
type ShardRouteSpec struct {
	// Cluster is the member cluster these rules are for.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=48
	Cluster string `json:"cluster"`
	// RoutingGeneration increases with every change of the rules the hub
	// publishes; it never goes back, so old rules can be told from new.
	// +kubebuilder:validation:Minimum=1
	RoutingGeneration int64 `json:"routingGeneration"`
	// RulesHash identifies the rules; proxies report the hash they enforce.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	RulesHash string `json:"rulesHash"`
	// Scope of the ShardingConfig.
	Scope ShardingScope `json:"scope"`
	// ValiditySeconds bounds how long a proxy serves these rules without
	// a renewal. Set in Fleet scope only, where the hub may grant a lost
	// member's buckets to pods in another member: each proxy asks for
	// renewals (status.pods[].renewalRequest), the agent grants them
	// (renewalGranted) only after a heartbeat the hub saw and a fresh read
	// of the hub's Work, and a proxy whose last granted request was sent
	// longer ago than this on its own clock stops serving. The hub gives a
	// lost member's buckets elsewhere only after the bound has surely
	// passed on its clock. Absent: the rules hold until replaced.
	// +kubebuilder:validation:Minimum=5
	// +kubebuilder:validation:Maximum=3600
	// +optional
	ValiditySeconds int32 `json:"validitySeconds,omitempty"`
	// Buckets is the total number of buckets.
	// +kubebuilder:validation:XValidation:rule="self in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]",message="buckets must be a power of two from 1 to 4096"
	Buckets int32 `json:"buckets"`
	// Selector selects the operator's pods.
	Selector metav1.LabelSelector `json:"selector"`
	// CanarySelector marks which of the selected pods are canary pods (the
	// ShardingConfig's canary.selector); the agent reports them as such, so
	// that the hub gives them only what the canary step names.
	// +optional
	CanarySelector *metav1.LabelSelector `json:"canarySelector,omitempty"`
	// Subsets name the groups of the selected pods that serve subsets (the
	// ShardingConfig's subsets, without their rules); the agent reports
	// each pod's subset, so that the hub gives it what its subset names.
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	// +optional
	Subsets []RouteSubset `json:"subsets,omitempty"`
	// Controller configures the operator's leader election.
	// +optional
	Controller *ControllerConfig `json:"controller,omitempty"`
	// Webhook configures the operator's admission webhook server.
	// +optional
	Webhook *WebhookConfig `json:"webhook,omitempty"`
	// Limits are the sharded resources.
	Limits Limits `json:"limits"`
	// Interception of the ShardingConfig: how the injector points the
	// operator containers at the proxy; unset is Kubeconfig.
	// +optional
	Interception Interception `json:"interception,omitempty"`
	// Isolation is the ShardingConfig's namespace isolation, enforced by
	// every proxy on top of its shard.
	// +optional
	Isolation *NamespaceIsolation `json:"isolation,omitempty"`
	// Shards and the pods that serve them.
	// +kubebuilder:validation:MaxItems=4096
	// +listType=map
	// +listMapKey=id
	// +optional
	Shards []RouteShard `json:"shards,omitempty"`
	// Policies are the traffic policies bound to the ShardingConfig
	// (CircuitBreakers, FaultInjections), enforced by every proxy.
	// Schemaless in the ShardRoute CRD: the hub copies them from
	// CircuitBreakers and FaultInjections its API server validated, and
	// every proxy compiles them again, refusing the whole route (keeping
	// its last good rules) if one does not compile; repeating their
	// schema here would only grow the member's CRD (and each of its
	// copies) by a thousand lines.
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	// +optional
	Policies *RoutePolicies `json:"policies,omitempty"`
}

// PodRouteStatus is what the agent sees of one candidate pod.
type PodRouteStatus struct {
	// Name of the pod.
	Name string `json:"name"`
	// Address is the pod's IP.
	// +optional
	Address string `json:"address,omitempty"`
	// Ready is the pod's Ready condition, as the agent sees it. Optional so
	// that a proxy can server-side-apply its own appliedRulesHash alone.
	// +optional
	Ready bool `json:"ready,omitempty"`
	// Canary is true when the pod matches the canary selector.
	// +optional
	Canary bool `json:"canary,omitempty"`
	// Subset is the first subset whose selector matches the pod, unless
	// it is a canary pod.
	// +optional
	Subset string `json:"subset,omitempty"`
	// Shard the pod serves under the current rules, if any.
	// +optional
	Shard string `json:"shard,omitempty"`
	// AppliedRulesHash is the rules hash the pod's proxy reports enforcing;
	// the proxy writes it by server-side apply, field manager
	// "ctrlmesh-proxy/<pod>".
	// +optional
	AppliedRulesHash string `json:"appliedRulesHash,omitempty"`
	// RenewalRequest is the proxy's latest request to renew the rules'
	// validity, a number it picks and remembers with the time it sent it;
	// written with appliedRulesHash by the proxy's server-side apply.
	// +optional
	RenewalRequest int64 `json:"renewalRequest,omitempty"`
	// RenewalGranted is the request the agent granted last: one the
	// agent read before a heartbeat that the hub saw. The proxy's rules
	// are then valid for spec.validitySeconds from when it sent it.
	// +optional
	RenewalGranted int64 `json:"renewalGranted,omitempty"`
	// Breakers are the proxy's breakers that are not closed; written with
	// appliedRulesHash by the proxy's server-side apply.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Breakers []PodBreakerStatus `json:"breakers,omitempty"`
}

// ShardLeader is the holder of one shard's renamed leader-election lock.
type ShardLeader struct {
	// Shard ID.
	Shard string `json:"shard"`
	// Pod holding the lock.
	Pod string `json:"pod"`
}

// ShardRouteStatus is written by the member's agent; Karmada (or the agent in
// standalone mode) reflects it into the Work's status for the hub to read.
type ShardRouteStatus struct {
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// ObservedRoutingGeneration is the spec.routingGeneration the status describes.
	// +optional
	ObservedRoutingGeneration int64 `json:"observedRoutingGeneration,omitempty"`
	// Pods are the candidate pods the agent sees: those the selector matches.
	// +optional
	// +listType=map
	// +listMapKey=name
	Pods []PodRouteStatus `json:"pods,omitempty"`
	// Leaders of the shards.
	// +optional
	// +listType=map
	// +listMapKey=shard
	Leaders []ShardLeader `json:"leaders,omitempty"`
	// Subsets lists, per subset with namespace rules, the member's
	// namespaces they match.
	// +optional
	// +listType=map
	// +listMapKey=name
	Subsets []RouteSubsetStatus `json:"subsets,omitempty"`
	// Conditions: RulesApplied, ProxiesReady.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ShardRoute carries the rules of one ShardingConfig to one member cluster.
// The hub writes it into a Karmada Work; it lands in the member under the
// ShardingConfig's namespace and name, where proxies read it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=shr,categories=ctrlmesh
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.cluster`
// +kubebuilder:printcolumn:name="Generation",type=integer,JSONPath=`.spec.routingGeneration`
// +kubebuilder:printcolumn:name="Hash",type=string,JSONPath=`.spec.rulesHash`,priority=1
// +kubebuilder:printcolumn:name="Applied",type=string,JSONPath=`.status.conditions[?(@.type=="RulesApplied")].status`
// +kubebuilder:printcolumn:name="Proxies-Ready",type=string,JSONPath=`.status.conditions[?(@.type=="ProxiesReady")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ShardRoute struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ShardRouteSpec   `json:"spec"`
	Status ShardRouteStatus `json:"status,omitempty"`
}

// ShardRouteList is a list of ShardRoutes.
// +kubebuilder:object:root=true
type ShardRouteList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ShardRoute `json:"items"`
}
