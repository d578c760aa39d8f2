package v1alpha1

// Condition types of ShardingConfig.
const (
	// ConditionReady is True when every bucket has a serving, healthy owner.
	ConditionReady = "Ready"
	// ConditionDegraded is True when something keeps the ShardingConfig from
	// being fully served; its reason says what.
	ConditionDegraded = "Degraded"
)

// Condition types of ShardRoute.
const (
	// ConditionRulesApplied is True when the member holds the rules of the
	// routing generation in the spec.
	ConditionRulesApplied = "RulesApplied"
	// ConditionProxiesReady is True when every candidate pod's proxy enforces
	// the rules hash in the spec.
	ConditionProxiesReady = "ProxiesReady"
)

// Reasons of the ShardRoute conditions.
const (
	// ReasonRulesValid: RulesApplied is True, the proxies can compile the rules.
	ReasonRulesValid = "RulesValid"
	// ReasonInvalidRules: RulesApplied is False, the proxies refuse the rules;
	// the message is the error.
	ReasonInvalidRules = "InvalidRules"
	// ReasonProxiesApplied: ProxiesReady is True, every candidate pod's proxy
	// reports spec.rulesHash.
	ReasonProxiesApplied = "ProxiesApplied"
	// ReasonProxiesPending: ProxiesReady is False, some candidate pods'
	// proxies do not report spec.rulesHash (yet); the message names them.
	ReasonProxiesPending = "ProxiesPending"
)

// Reasons of the Degraded condition of ShardingConfig. ReasonNoCandidatePods
// is also the reason of a ShardRoute's ProxiesReady False when no pod
// matches its selector.
const (
	ReasonNoCandidatePods    = "NoCandidatePods"
	ReasonClusterUnavailable = "ClusterUnavailable"
	ReasonHandoverPending    = "HandoverPending"
	ReasonInvalidSpec        = "InvalidSpec"
	ReasonNoClusters         = "NoClustersSelected"
)
