package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Traffic policies (CircuitBreaker, FaultInjection) share what is here: the
// reference to the ShardingConfig whose pods they govern, how a rule matches
// a request, and the per-member status the hub reports.

// ShardingConfigReference names a ShardingConfig in the policy's namespace.
// The policy governs that ShardingConfig's operator pods: it rides to every
// member the ShardingConfig selects, in its ShardRoute, and every proxy of
// the operator enforces it.
type ShardingConfigReference struct {
	// Name of the ShardingConfig.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
}

// Verb is an API request's verb, as RBAC names it.
// +kubebuilder:validation:Enum=get;list;watch;create;update;patch;delete;deletecollection;"*"
type Verb string

// TrafficMatch selects requests of the operator. It matches either API
// requests (resources, and optionally verbs, namespaces and names) or
// external requests through the proxy as HTTP/HTTPS forward proxy (hosts,
// and for plain HTTP optionally methods and path prefixes). Every field
// that is set must match; within a field, any entry may.
// +kubebuilder:validation:XValidation:rule="has(self.resources) != has(self.hosts)",message="a match names either resources (the operator's API requests) or hosts (its external requests through the proxy), exactly one of them"
// +kubebuilder:validation:XValidation:rule="!has(self.hosts) || (!has(self.verbs) && !has(self.namespaces) && !has(self.names))",message="verbs, namespaces and names match API requests only; for external hosts use methods and pathPrefixes"
// +kubebuilder:validation:XValidation:rule="!has(self.resources) || (!has(self.methods) && !has(self.pathPrefixes))",message="methods and pathPrefixes match external requests only; for API requests use verbs, namespaces and names"
type TrafficMatch struct {
	// Resources of the API requests matched ("*" matches every group or
	// resource). A subresource request matches its resource.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Resources []ResourceGroup `json:"resources,omitempty"`
	// Verbs of the API requests matched; absent matches every verb.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=9
	// +listType=set
	// +optional
	Verbs []Verb `json:"verbs,omitempty"`
	// Namespaces of the API requests matched; absent matches every
	// namespace and cluster-scoped requests too.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
	// Names of the objects matched; absent matches every name (and lists,
	// watches and creates, which name none).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	Names []string `json:"names,omitempty"`
	// Hosts of the external requests matched: a host name ("api.example.com"),
	// a suffix ("*.example.com" matches its subdomains) or "*". A port is
	// not part of the match.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^(\*|(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)$`
	// +listType=set
	// +optional
	Hosts []string `json:"hosts,omitempty"`
	// Methods of plain-HTTP external requests matched, such as GET; absent
	// matches every method. HTTPS requests pass the proxy as a tunnel
	// (CONNECT), whose method and path the proxy cannot see: a match with
	// methods or pathPrefixes never matches them.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=9
	// +kubebuilder:validation:items:Enum=GET;HEAD;POST;PUT;PATCH;DELETE;OPTIONS
	// +listType=set
	// +optional
	Methods []string `json:"methods,omitempty"`
	// PathPrefixes of plain-HTTP external requests matched, each starting
	// with "/"; absent matches every path.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=1024
	// +kubebuilder:validation:items:Pattern=`^/`
	// +listType=set
	// +optional
	PathPrefixes []string `json:"pathPrefixes,omitempty"`
}

// PolicyClusterStatus is one member cluster's report of a policy.
type PolicyClusterStatus struct {
	// Cluster is the member cluster.
	Cluster string `json:"cluster"`
	// Proxies is the number of the operator's proxies in the cluster.
	Proxies int32 `json:"proxies"`
	// Enforcing is the number of those proxies that report enforcing the
	// policy's current generation.
	Enforcing int32 `json:"enforcing"`
	// Breakers are the breakers that are not closed in some proxy of the
	// cluster (CircuitBreaker only): a breaker absent here is closed in
	// every proxy.
	// +listType=map
	// +listMapKey=name
	// +optional
	Breakers []ClusterBreakerStatus `json:"breakers,omitempty"`
}

// ClusterBreakerStatus is one breaker's state in one member cluster.
type ClusterBreakerStatus struct {
	// Name of the breaker.
	Name string `json:"name"`
	// State is the breaker's state in the proxies where it is furthest from
	// closed: Open before HalfOpen.
	State BreakerState `json:"state"`
	// Pods whose proxy has the breaker in that state.
	// +listType=set
	Pods []string `json:"pods"`
	// LastTransitionTime is when the breaker last changed state in one of
	// those pods, on that proxy's clock.
	LastTransitionTime metav1.Time `json:"lastTransitionTime"`
}

// BreakerState is a circuit breaker's state.
// +kubebuilder:validation:Enum=Closed;Open;HalfOpen
type BreakerState string

const (
	// BreakerClosed: matched requests pass.
	BreakerClosed BreakerState = "Closed"
	// BreakerOpen: matched requests fail fast until the recovery window ends.
	BreakerOpen BreakerState = "Open"
	// BreakerHalfOpen: a few probe requests pass; their outcome closes or
	// reopens the breaker.
	BreakerHalfOpen BreakerState = "HalfOpen"
)

// PolicyStatus is the hub's report on a traffic policy.
type PolicyStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Clusters report the policy per member cluster the ShardingConfig
	// selects.
	// +listType=map
	// +listMapKey=cluster
	// +optional
	Clusters []PolicyClusterStatus `json:"clusters,omitempty"`
	// Conditions: Enforced.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RoutePolicies are the traffic policies bound to a ShardingConfig, as the
// hub carries them in its ShardRoute to every member: each proxy of the
// operator enforces them, and reports its breakers' states in
// status.pods[].breakers.
type RoutePolicies struct {
	// CircuitBreakers bound to the ShardingConfig, by name.
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=name
	// +optional
	CircuitBreakers []RouteCircuitBreaker `json:"circuitBreakers,omitempty"`
	// FaultInjections bound to the ShardingConfig, by name.
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=name
	// +optional
	FaultInjections []RouteFaultInjection `json:"faultInjections,omitempty"`
}

// RouteCircuitBreaker is one CircuitBreaker in a ShardRoute.
type RouteCircuitBreaker struct {
	// Name of the CircuitBreaker on the hub (in the ShardingConfig's
	// namespace).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Generation of the CircuitBreaker the spec is from.
	// +kubebuilder:validation:Minimum=1
	Generation int64 `json:"generation"`
	// Spec of the CircuitBreaker.
	Spec CircuitBreakerSpec `json:"spec"`
}

// RouteFaultInjection is one FaultInjection in a ShardRoute.
type RouteFaultInjection struct {
	// Name of the FaultInjection on the hub.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Generation of the FaultInjection the spec is from.
	// +kubebuilder:validation:Minimum=1
	Generation int64 `json:"generation"`
	// Spec of the FaultInjection.
	Spec FaultInjectionSpec `json:"spec"`
}

// PodBreakerStatus is the state of one breaker in one proxy, reported by
// the proxy only while it is not closed, so that the status changes only
// when a breaker does.
type PodBreakerStatus struct {
	// Policy is the CircuitBreaker's name.
	Policy string `json:"policy"`
	// Name of the breaker in it.
	Name string `json:"name"`
	// State of the breaker: Open or HalfOpen.
	State BreakerState `json:"state"`
	// LastTransitionTime is when it entered the state, on the proxy's clock.
	LastTransitionTime metav1.Time `json:"lastTransitionTime"`
}

// Policy is what CircuitBreaker and FaultInjection have in common for the
// hub, which carries them and reports their status alike.
// +kubebuilder:object:generate=false
type Policy interface {
	// ShardingConfigName is the ShardingConfig the policy is bound to.
	ShardingConfigName() string
	// PolicyStatus is the policy's status, to read and write.
	PolicyStatus() *PolicyStatus
}

// ShardingConfigName implements Policy.
func (cb *CircuitBreaker) ShardingConfigName() string { return cb.Spec.ShardingConfig.Name }

// PolicyStatus implements Policy.
func (cb *CircuitBreaker) PolicyStatus() *PolicyStatus { return &cb.Status }

// ShardingConfigName implements Policy.
func (fi *FaultInjection) ShardingConfigName() string { return fi.Spec.ShardingConfig.Name }

// PolicyStatus implements Policy.
func (fi *FaultInjection) PolicyStatus() *PolicyStatus { return &fi.Status }
