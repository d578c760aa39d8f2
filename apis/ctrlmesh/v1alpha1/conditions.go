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
	// ConditionLabeled (label mode only) is True when the last sweep of the
	// agent's labeler labeled every object of the resources the route's
	// limits name; False when it could not, so that some of them may stay
	// unlabeled and invisible to every shard.
	ConditionLabeled = "Labeled"
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
	// ReasonObjectsLabeled: Labeled is True.
	ReasonObjectsLabeled = "ObjectsLabeled"
	// ReasonLabelerForbidden: Labeled is False, the agent lacks the rights
	// to list, watch or patch some resource (the hub's labeler ClusterRole
	// has not landed, or a limit names "*"); the message names them. The
	// labeler retries.
	ReasonLabelerForbidden = "LabelerForbidden"
	// ReasonLabelingFailed: Labeled is False for another error; the message
	// names it. The labeler retries.
	ReasonLabelingFailed = "LabelingFailed"
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
	// ReasonPodsWithoutProxy: ready pods the selector matches have had no
	// proxy report for a while (also the reason of the Warning Event on
	// the ShardingConfig naming each): they get no buckets.
	ReasonPodsWithoutProxy = "PodsWithoutProxy"
	// ReasonSelectorOverlap: the selector of another ShardingConfig of the
	// namespace selects, or is bound to select, the same pods in a common
	// cluster (also the reason of the Warning Event on the ShardingConfig):
	// the injector gives such pods no proxy, and only the config created
	// first places them.
	ReasonSelectorOverlap = "SelectorOverlap"
)

// Reasons of the Ready condition of ShardingConfig when it is True, and of
// Degraded when it is False (the other reasons above say what is wrong).
const (
	// ReasonAllShardsServing: Ready is True, every shard serves its buckets
	// and is healthy.
	ReasonAllShardsServing = "AllShardsServing"
	// ReasonShardsNotReady: Ready is False, some shard is pending or
	// unhealthy; the message names them.
	ReasonShardsNotReady = "ShardsNotReady"
	// ReasonAsExpected: Degraded is False.
	ReasonAsExpected = "AsExpected"
)

// Reasons of the conditions on OCM ManagedClusters: HubAcceptedManagedCluster
// and ManagedClusterConditionAvailable, which the hub writes, and
// ManagedClusterJoined, which the agent writes. OCM's API module has
// constants for the condition types only (clusterv1.ManagedClusterCondition*);
// where OCM's registration controllers (open-cluster-management.io/ocm,
// pkg/registration) have a reason for the same state, the reason, status and
// message are OCM's, so that OCM tooling and a real OCM hub running beside
// ctrlmesh read and write them alike.
const (
	// ReasonClusterAccepted: spec.hubAcceptsClient is true (HubAccepted
	// True, message "Accepted by hub cluster admin"): OCM's hub.
	ReasonClusterAccepted = "HubClusterAdminAccepted"
	// ReasonClusterDenied: spec.hubAcceptsClient became false after the
	// cluster was accepted (HubAccepted False, message "Denied by hub
	// cluster admin"): OCM's hub. A cluster never accepted has no
	// HubAccepted condition, as in OCM.
	ReasonClusterDenied = "HubClusterAdminDenied"
	// ReasonClusterJoined: the agent saw the hub accept the cluster and
	// takes rules from it (Joined True, message "Managed cluster joined"):
	// OCM's agent.
	ReasonClusterJoined = "ManagedClusterJoined"
	// ReasonClusterAvailable: the heartbeat is fresh and, where the hub
	// serves Karmada's Clusters, Karmada's Cluster of the member is Ready
	// (Available True): OCM's.
	ReasonClusterAvailable = "ManagedClusterAvailable"
	// ReasonLeaseUpdateStopped: the agent stopped renewing the heartbeat
	// Lease, or the Lease was deleted (Available Unknown): OCM's hub.
	ReasonLeaseUpdateStopped = "ManagedClusterLeaseUpdateStopped"
	// ReasonNoHeartbeat: the member's agent has not written its heartbeat
	// Lease, or wrote one without renewTime or leaseDurationSeconds
	// (Available Unknown).
	ReasonNoHeartbeat = "ManagedClusterLeaseNotFound"
	// ReasonKarmadaClusterNotReady: the heartbeat is fresh but Karmada's
	// Cluster of the member is not Ready (Available False).
	ReasonKarmadaClusterNotReady = "KarmadaClusterNotReady"
	// ReasonKarmadaClusterNotFound: the hub serves Karmada's Clusters but
	// Karmada has none for the member, by name or by ID (Available False):
	// Works for it would never be applied. The message says how to join it.
	ReasonKarmadaClusterNotFound = "KarmadaClusterNotFound"
	// ReasonKarmadaClusterNameMismatch: Karmada knows the member under
	// another name: its Cluster of that name has, as spec.id, the ID the
	// agent claims as id.k8s.io (Available False). The message names it.
	ReasonKarmadaClusterNameMismatch = "KarmadaClusterNameMismatch"
	// ReasonKarmadaClusterIDMismatch: Karmada's Cluster of the member's name
	// is another cluster: its spec.id is not the ID the agent claims
	// (Available False). Works for the member would go elsewhere.
	ReasonKarmadaClusterIDMismatch = "KarmadaClusterIDMismatch"
)

// Reasons of the Applied condition the agent writes on a Work in standalone
// mode, as Karmada's execution controller spells them (Karmada has no
// constants for them).
const (
	ReasonWorkAppliedSuccessful = "AppliedSuccessful"
	ReasonWorkAppliedFailed     = "AppliedFailed"
)

// Reasons of the Events ctrlmesh records.
const (
	// ReasonRevoked (Normal, on a ShardingConfig): a shard stops serving
	// buckets or namespaces in a new generation of the rules.
	ReasonRevoked = "Revoked"
	// ReasonGranted (Normal, on a ShardingConfig): a shard starts serving
	// buckets or namespaces, once nobody else serves them.
	ReasonGranted = "Granted"
	// ReasonCanaryAdvanced (Normal, on a ShardingConfig): the canary shard
	// stayed healthy for canary.minHealthySeconds and takes the next step.
	ReasonCanaryAdvanced = "CanaryAdvanced"
	// ReasonWorksDeleted (Normal, on a ShardingConfig): the Works of clusters
	// no longer selected were deleted.
	ReasonWorksDeleted = "WorksDeleted"
	// ReasonLabelerRightsNotGranted (Warning, on a ShardingConfig): a limit
	// names "*" or a subresource, which the labeler's ClusterRole cannot
	// grant without a wildcard; in label-mode members those objects stay
	// unlabeled, invisible to every shard, until the limit names resources.
	ReasonLabelerRightsNotGranted = "LabelerRightsNotGranted"
	// ReasonBucketCountConflict (Warning, on a ShardRoute in label mode): the
	// route counts another number of buckets than the labels of the member
	// are written with, so it cannot be served there.
	ReasonBucketCountConflict = "BucketCountConflict"
	// ReasonProxyNotInjected (Warning, on a Pod): the pod asked for the proxy
	// and was created without it; the message says why and what to do.
	ReasonProxyNotInjected = "ProxyNotInjected"
	// ReasonEvictedForProxy (Normal, on a Pod): the pod asked for the proxy,
	// was created without it, and a ShardRoute now selects it: the agent
	// evicted it so that its controller recreates it with the proxy.
	ReasonEvictedForProxy = "EvictedForProxy"
	// ReasonProxyEvictionBlocked (Warning, on a Pod): the eviction that would
	// replace the pod by one with the proxy was refused, by a
	// PodDisruptionBudget or otherwise; the agent retries it later.
	ReasonProxyEvictionBlocked = "ProxyEvictionBlocked"
	// ReasonRecreateForProxy (Warning, on a Pod): the pod was created without
	// the proxy and a ShardRoute now selects it, but no controller would
	// recreate it if evicted: recreate it by hand.
	ReasonRecreateForProxy = "RecreateForProxy"
	// ReasonShardRouteDeleted (Warning, on a Pod): the ShardRoute the pod's
	// proxy enforces was deleted; the proxy refuses sharded requests.
	ReasonShardRouteDeleted = "ShardRouteDeleted"
)

// Condition type and reasons of the traffic policies (CircuitBreaker,
// FaultInjection).
const (
	// ConditionEnforced is True when every proxy of the ShardingConfig, in
	// every member it selects, enforces the policy's generation.
	ConditionEnforced = "Enforced"
	// ReasonPolicyEnforced: Enforced is True.
	ReasonPolicyEnforced = "PolicyEnforced"
	// ReasonPolicyPending: Enforced is False, some proxies do not enforce the
	// policy's generation yet; the message names the clusters.
	ReasonPolicyPending = "PolicyPending"
	// ReasonShardingConfigNotFound: Enforced is False, the ShardingConfig the
	// policy names does not exist.
	ReasonShardingConfigNotFound = "ShardingConfigNotFound"
)
