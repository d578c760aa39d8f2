package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RateLimit is a token bucket on the matched requests of each proxy: qps
// tokens a second up to burst. A request that finds no token is answered
// 429 Too Many Requests with Retry-After, which client-go honours.
type RateLimit struct {
	// Name of the limit, unique in the CircuitBreaker.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Match selects the limited requests.
	Match TrafficMatch `json:"match"`
	// QPS is the rate tokens come back at, per proxy (per operator pod).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	QPS int32 `json:"qps"`
	// Burst is the bucket's size: how many requests may pass at once after
	// a quiet spell.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	Burst int32 `json:"burst"`
}

// SlowCalls counts a call as slow when it takes longer than the threshold.
type SlowCalls struct {
	// ThresholdMilliseconds above which a call is slow. Watches are never
	// slow calls: they are meant to stay open.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=600000
	ThresholdMilliseconds int32 `json:"thresholdMilliseconds"`
	// RatioPercent of slow calls among the window's calls that opens the
	// breaker.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	RatioPercent int32 `json:"ratioPercent"`
}

// Breaker is a circuit breaker on the matched requests of each proxy. It
// opens when, within the window, the calls fail or are slow beyond a
// threshold (once at least minRequests were made), or when rate limits
// refused at least rateLimited of them; open, the matched requests fail
// fast with 503 for openSeconds; then the breaker is half-open and lets
// halfOpenProbes requests through: if they all succeed it closes, else it
// opens again.
// +kubebuilder:validation:XValidation:rule="has(self.failureRatioPercent) || has(self.slowCalls) || has(self.rateLimited)",message="a breaker needs a trigger: failureRatioPercent, slowCalls or rateLimited"
type Breaker struct {
	// Name of the breaker, unique in the CircuitBreaker; the hub's status
	// reports its state under this name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Match selects the requests the breaker watches and stops.
	Match TrafficMatch `json:"match"`
	// WindowSeconds is the sliding window the triggers count over.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +kubebuilder:default=60
	// +optional
	WindowSeconds int32 `json:"windowSeconds,omitempty"`
	// MinRequests within the window before failure and slow-call ratios
	// count: a single failure of a single call opens nothing.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	// +kubebuilder:default=10
	// +optional
	MinRequests int32 `json:"minRequests,omitempty"`
	// FailureRatioPercent of failed calls (a 5xx or 429 answer, or no
	// answer at all) among the window's calls that opens the breaker.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	FailureRatioPercent *int32 `json:"failureRatioPercent,omitempty"`
	// SlowCalls opens the breaker when too many calls are slow.
	// +optional
	SlowCalls *SlowCalls `json:"slowCalls,omitempty"`
	// RateLimited opens the breaker when a rate limit of the same
	// CircuitBreaker refused this many of its matched requests within the
	// window: an operator that keeps hitting its limit is stopped.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	// +optional
	RateLimited *int32 `json:"rateLimited,omitempty"`
	// OpenSeconds is the recovery window the breaker stays open.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +kubebuilder:default=30
	// +optional
	OpenSeconds int32 `json:"openSeconds,omitempty"`
	// HalfOpenProbes is how many requests pass while half-open, all of
	// which must succeed for the breaker to close.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=1
	// +optional
	HalfOpenProbes int32 `json:"halfOpenProbes,omitempty"`
}

// CountLimit bounds how many matched requests a proxy lets through per
// period; the others are denied.
type CountLimit struct {
	// Count of requests let through per period.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	Count int32 `json:"count"`
	// PeriodSeconds of the sliding window: in no span of this length does
	// a proxy let more than count requests through.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	PeriodSeconds int32 `json:"periodSeconds"`
}

// DenyRule refuses matched requests at the proxy with 403 Forbidden and
// its reason: all of them, or, with a limit, those beyond the limit's count
// per period ("no more than 10 Pod deletes a minute").
type DenyRule struct {
	// Name of the rule, unique in the CircuitBreaker.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Match selects the requests denied.
	Match TrafficMatch `json:"match"`
	// Reason is told to the operator in the refusal, so that whoever reads
	// its log learns why and whom to ask.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason"`
	// Limit, when set, denies only the requests beyond its count per
	// period, counted by each proxy.
	// +optional
	Limit *CountLimit `json:"limit,omitempty"`
}

// CircuitBreakerSpec is a set of rate limits, breakers and deny rules on an
// operator's requests.
// +kubebuilder:validation:XValidation:rule="has(self.rateLimits) || has(self.breakers) || has(self.deny)",message="a CircuitBreaker needs at least one of rateLimits, breakers or deny"
type CircuitBreakerSpec struct {
	// ShardingConfig whose operator pods the rules govern.
	ShardingConfig ShardingConfigReference `json:"shardingConfig"`
	// RateLimits are token buckets per proxy. A request matched by several
	// takes a token from each.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	// +optional
	RateLimits []RateLimit `json:"rateLimits,omitempty"`
	// Breakers are circuit breakers per proxy.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	// +optional
	Breakers []Breaker `json:"breakers,omitempty"`
	// Deny rules refuse requests outright or beyond a count.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	// +optional
	Deny []DenyRule `json:"deny,omitempty"`
}

// CircuitBreaker limits, breaks and denies an operator's requests — to its
// API server and to external hosts — at every proxy of the ShardingConfig
// it names, in every member cluster that ShardingConfig selects.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=cb,categories=ctrlmesh
// +kubebuilder:printcolumn:name="ShardingConfig",type=string,JSONPath=`.spec.shardingConfig.name`
// +kubebuilder:printcolumn:name="Enforced",type=string,JSONPath=`.status.conditions[?(@.type=="Enforced")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CircuitBreaker struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   CircuitBreakerSpec `json:"spec"`
	Status PolicyStatus       `json:"status,omitempty"`
}

// CircuitBreakerList is a list of CircuitBreakers.
// +kubebuilder:object:root=true
type CircuitBreakerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CircuitBreaker `json:"items"`
}
