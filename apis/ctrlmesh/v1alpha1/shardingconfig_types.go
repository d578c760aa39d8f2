package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Limits are the sharded resources of an operator. A resource may be named by
// only one limit, otherwise a pod's view of it would depend on which limit
// the proxy happened to match first.
//
// The rule below checks that every limit overlaps with exactly one limit: itself.
// Two limits overlap when some group and some resource of one also stand in the
// other, "*" matching everything.
// +kubebuilder:validation:MinItems=1
// +kubebuilder:validation:MaxItems=8
// +kubebuilder:validation:XValidation:rule="self.all(a, self.filter(b, a.relateResources.exists(ra, b.relateResources.exists(rb, (ra.apiGroups.exists(g, g == '*' || g in rb.apiGroups) || rb.apiGroups.exists(g, g == '*')) && (ra.resources.exists(r, r == '*' || r in rb.resources) || rb.resources.exists(r, r == '*'))))).size() == 1)",message="a resource may be listed in only one limit (\"*\" matches every group or resource): merge the limits that name the same resource into one"
type Limits []Limit

// ClusterSelection picks the member clusters that run the operator, by name,
// by labels on their ManagedCluster, or both (a cluster matching either is
// selected).
// +kubebuilder:validation:XValidation:rule="(has(self.names) && size(self.names) > 0) || has(self.selector)",message="clusters must list cluster names or set a selector on ManagedCluster labels; an empty clusters selects nothing"
type ClusterSelection struct {
	// Names of member clusters, as registered on the hub.
	// +optional
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MaxLength=48
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	Names []string `json:"names,omitempty"`
	// Selector on the labels of the hub's ManagedCluster objects.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}

// ShardingLayout says how many buckets there are and how pods form shards.
// +kubebuilder:validation:XValidation:rule="!has(self.shards) || self.shards <= self.buckets",message="sharding.shards cannot exceed sharding.buckets: every shard needs at least one bucket"
type ShardingLayout struct {
	// Buckets is the number of hash buckets the namespaces fall into: a power
	// of two from 1 to 4096. A namespace's bucket is the top log2(buckets) bits
	// of the 64-bit FNV-1a hash of its name.
	// It cannot change: every bucket would change its meaning while pods
	// serve it.
	// +kubebuilder:default=32
	// +kubebuilder:validation:XValidation:rule="self in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]",message="sharding.buckets must be a power of two from 1 to 4096, such as 32"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="sharding.buckets cannot change: every bucket would change its meaning while pods serve it; delete the ShardingConfig and create it again with the new count"
	// +optional
	Buckets int32 `json:"buckets,omitempty"`
	// Shards fixes the number of shards: per cluster in PerCluster scope,
	// across the fleet in Fleet scope. When unset, every podsPerShard ready
	// candidate pods form one shard.
	// +kubebuilder:validation:Minimum=1
	// +optional
	Shards *int32 `json:"shards,omitempty"`
	// PodsPerShard is how many pods serve one shard: one leads through the
	// shard's renamed leader-election lock, the others are hot standbys.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	// +optional
	PodsPerShard int32 `json:"podsPerShard,omitempty"`
}

// CanaryStep is what the canary pods serve at one step: whole buckets, single
// namespaces, or both. Steps are cumulative: each lists all the canary serves.
// +kubebuilder:validation:XValidation:rule="has(self.buckets) || (has(self.namespaces) && size(self.namespaces) > 0)",message="a canary step must name buckets or namespaces for the canary pods to serve"
// +kubebuilder:validation:XValidation:rule="!has(self.buckets) || !self.buckets.matches('^[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*$') || self.buckets.split(',').all(r, r.split('-').size() == 1 || int(r.split('-')[0]) <= int(r.split('-')[1]))",message="canary step buckets: a range must run from low to high, such as 4-7"
type CanaryStep struct {
	// Buckets in compact notation: comma-separated numbers and inclusive
	// ranges, such as "0-3,12".
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*$`
	// +optional
	Buckets string `json:"buckets,omitempty"`
	// Namespaces the canary serves exactly, carved out of whichever shard
	// owns their bucket.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
}

// CanarySpec sends part of the traffic to canary pods, step by step.
type CanarySpec struct {
	// Selector marks which of the operator's pods are canary pods.
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="canary.selector must not be empty: it would make every operator pod a canary"
	Selector metav1.LabelSelector `json:"selector"`
	// Steps the canary goes through. The canary serves exactly what the
	// current step names and nothing else; the hub moves to the next step only
	// while the canary shard is healthy, and has been for minHealthySeconds.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	Steps []CanaryStep `json:"steps"`
	// MinHealthySeconds the canary shard must stay healthy before the next step.
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinHealthySeconds int32 `json:"minHealthySeconds,omitempty"`
}

// ShardingConfigSpec describes one operator to shard across a fleet.
//
// The CEL rules on bucket strings skip strings that do not match the compact
// notation pattern, so that a malformed string gets the pattern's message
// alone rather than a CEL conversion error as well.
// +kubebuilder:validation:XValidation:rule="!has(self.subsets) || self.subsets.all(x, !has(x.buckets) || !x.buckets.matches('^[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*$') || x.buckets.split(',').all(r, r.split('-').all(b, int(b) < self.sharding.buckets)))",message="subset buckets must be below sharding.buckets: buckets are numbered from 0 to sharding.buckets - 1"
// +kubebuilder:validation:XValidation:rule="!has(self.subsets) || self.scope != 'Fleet' || self.subsets.all(x, !has(x.namespaceSelector) && (!has(x.namespaceRegex) || size(x.namespaceRegex) == 0))",message="in Fleet scope a subset names its namespaces by name: their labels are on the API server the operator's objects live on, which the members' agents do not watch"
// +kubebuilder:validation:XValidation:rule="!has(self.subsets) || self.subsets.all(a, self.subsets.all(b, a.name == b.name || !has(a.namespaces) || !has(b.namespaces) || !a.namespaces.exists(n, n in b.namespaces)))",message="a namespace may be named by only one subset: each namespace is served by one shard"
// +kubebuilder:validation:XValidation:rule="!has(self.canary) || self.canary.steps.all(s, !has(s.buckets) || !s.buckets.matches('^[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*$') || s.buckets.split(',').all(r, r.split('-').all(b, int(b) < self.sharding.buckets)))",message="canary step buckets must be below sharding.buckets: buckets are numbered from 0 to sharding.buckets - 1"
type ShardingConfigSpec struct {
	// Selector selects the operator's pods in the member clusters.
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="selector must not be empty: select the operator's pods by their labels, such as matchLabels: {app: my-operator}"
	Selector metav1.LabelSelector `json:"selector"`
	// Controller configures the operator's leader election.
	// +optional
	Controller *ControllerConfig `json:"controller,omitempty"`
	// Webhook configures the operator's admission webhook server.
	// +optional
	Webhook *WebhookConfig `json:"webhook,omitempty"`
	// Limits are the resources whose list and watch are sharded.
	Limits Limits `json:"limits"`
	// Interception says how the injected proxy takes the operator's API
	// requests: Kubeconfig (default: $KUBECONFIG), Environment
	// (KUBERNETES_SERVICE_HOST/PORT, for operators that use in-cluster
	// configuration) or Iptables (netfilter redirection of the API server's
	// Service, needs the NET_ADMIN capability in an init container). It
	// applies to pods created after it is set.
	// +optional
	Interception Interception `json:"interception,omitempty"`
	// Clusters are the member clusters that run the operator.
	Clusters ClusterSelection `json:"clusters"`
	// Scope says whose objects are sharded: each cluster's own (PerCluster) or
	// one API server's, across the pods of all clusters (Fleet). It cannot
	// change: the pods would switch between per-cluster and fleet-wide
	// buckets while serving them.
	// +kubebuilder:default=PerCluster
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="scope cannot change: the pods would switch between per-cluster and fleet-wide buckets while serving them; delete the ShardingConfig and create it again with the new scope"
	// +optional
	Scope ShardingScope `json:"scope,omitempty"`
	// Sharding sets the bucket count and how pods form shards.
	// +kubebuilder:default={}
	// +optional
	Sharding ShardingLayout `json:"sharding,omitempty"`
	// Canary sends chosen buckets or namespaces to canary pods.
	// +optional
	Canary *CanarySpec `json:"canary,omitempty"`
	// Subsets are named groups of the operator's pods, each serving what
	// its rules name; the rest is sharded among the other pods.
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	// +optional
	Subsets []Subset `json:"subsets,omitempty"`
	// Isolation limits every pod of the operator to the namespaces it
	// selects, whatever its shard: reads, watches and writes elsewhere are
	// refused or narrowed away by its proxy.
	// +optional
	Isolation *NamespaceIsolation `json:"isolation,omitempty"`
}

// ShardState is where a shard is in its life.
// +kubebuilder:validation:Enum=Pending;Serving;Draining
type ShardState string

const (
	// ShardPending: buckets are assigned, but not yet served (the previous
	// owner has not released them, or no proxy enforces the rules yet).
	ShardPending ShardState = "Pending"
	// ShardServing: the shard's proxies enforce the rules that grant its buckets.
	ShardServing ShardState = "Serving"
	// ShardDraining: the shard is giving its buckets up.
	ShardDraining ShardState = "Draining"
)

// ShardHealth is the health of a shard as its member's agent reports it.
// +kubebuilder:validation:Enum=Healthy;Unhealthy;Unknown
type ShardHealth string

const (
	// ShardHealthy: a ready pod leads the shard and enforces the current rules.
	ShardHealthy ShardHealth = "Healthy"
	// ShardUnhealthy: no ready pod leads the shard, or it enforces old rules.
	ShardUnhealthy ShardHealth = "Unhealthy"
	// ShardHealthUnknown: the shard's cluster has not reported.
	ShardHealthUnknown ShardHealth = "Unknown"
)

// ShardPlacement is where one shard runs and what it serves.
type ShardPlacement struct {
	// Shard is the shard's ID, unique within the ShardingConfig.
	Shard string `json:"shard"`
	// Cluster is the member cluster the shard's pods run in.
	Cluster string `json:"cluster"`
	// Pods serving the shard.
	// +optional
	// +listType=set
	Pods []string `json:"pods,omitempty"`
	// Leader is the pod holding the shard's leader-election lock.
	// +optional
	Leader string `json:"leader,omitempty"`
	// Buckets the shard serves, in compact notation ("0-7,12").
	// +optional
	Buckets string `json:"buckets,omitempty"`
	// Namespaces the shard serves exactly (canary, subsets).
	// +optional
	// +listType=set
	Namespaces []string `json:"namespaces,omitempty"`
	// Canary is true for the canary shard.
	// +optional
	Canary bool `json:"canary,omitempty"`
	// Subset is the name of the subset the shard serves, if any.
	// +optional
	Subset string `json:"subset,omitempty"`
	// State of the shard.
	State ShardState `json:"state"`
	// Health of the shard.
	Health ShardHealth `json:"health"`
}

// CanaryStatus is how far the canary has gone.
type CanaryStatus struct {
	// Step is the index of the step in force.
	Step int32 `json:"step"`
	// HealthySince is when the canary shard last became healthy.
	// +optional
	HealthySince *metav1.Time `json:"healthySince,omitempty"`
}

// ShardingConfigStatus is the hub's report on placement and health.
type ShardingConfigStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, Degraded.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Clusters is the number of selected, available member clusters.
	// +optional
	Clusters int32 `json:"clusters,omitempty"`
	// Shards is the number of shards placed.
	// +optional
	Shards int32 `json:"shards,omitempty"`
	// ReadyShards is the number of shards that are Serving and Healthy.
	// +optional
	ReadyShards int32 `json:"readyShards,omitempty"`
	// Placement lists every shard.
	// +optional
	// +listType=atomic
	Placement []ShardPlacement `json:"placement,omitempty"`
	// Canary reports the canary's progress.
	// +optional
	Canary *CanaryStatus `json:"canary,omitempty"`
}

// ShardingConfig shards one operator's controllers and webhooks across its
// pods in a fleet of member clusters. It lives on the hub, in the namespace
// the operator runs in on the members. Its name is at most 63 characters:
// the hub writes it into a label of its Works.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="metadata.name may have at most 63 characters: the hub labels the ShardingConfig's Works with its name, and label values have at most 63"
// +kubebuilder:resource:shortName=shc;shardcfg,categories=ctrlmesh
// +kubebuilder:printcolumn:name="Scope",type=string,JSONPath=`.spec.scope`
// +kubebuilder:printcolumn:name="Clusters",type=integer,JSONPath=`.status.clusters`
// +kubebuilder:printcolumn:name="Shards",type=integer,JSONPath=`.status.shards`
// +kubebuilder:printcolumn:name="Ready-Shards",type=integer,JSONPath=`.status.readyShards`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ShardingConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ShardingConfigSpec   `json:"spec"`
	Status ShardingConfigStatus `json:"status,omitempty"`
}

// ShardingConfigList is a list of ShardingConfigs.
// +kubebuilder:object:root=true
type ShardingConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ShardingConfig `json:"items"`
}
