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

// Reasons of the Degraded condition.
const (
	ReasonNoCandidatePods    = "NoCandidatePods"
	ReasonClusterUnavailable = "ClusterUnavailable"
	ReasonHandoverPending    = "HandoverPending"
	ReasonInvalidSpec        = "InvalidSpec"
	ReasonNoClusters         = "NoClustersSelected"
)
