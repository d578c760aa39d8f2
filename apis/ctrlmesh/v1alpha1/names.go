package v1alpha1

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The names ctrlmesh's components agree on, in one place as Karmada keeps its
// in pkg/util/names: what one component writes and another reads (lock and
// Lease names, field managers, the proxy's ports and flags the injector
// writes, annotations and finalizers) is spelled here only, so that the hub,
// the agent and the proxy need not import each other for one name, and tests
// need not retype it.

// ShardLockSeparator joins an operator's leader-election lock name and a
// shard ID: the proxy renames lock "op" to "op---0" for shard "0". Three
// dashes cannot end a DNS-1123 name, so a renamed lock never collides with a
// name the operator could choose itself.
const ShardLockSeparator = "---"

// ShardLockName is the name of shard's leader-election lock for the
// operator's lock name.
func ShardLockName(lock, shard string) string { return lock + ShardLockSeparator + shard }

// HeartbeatLeaseName is the name of a member's heartbeat Lease on the hub,
// in the member's cluster namespace (ClusterNamespace): OCM's, as its
// registration agent renews it and its hub's lease controller reads it
// ("managed-cluster-lease"; OCM's API module has no constant for it), so
// that OCM tooling reads a ctrlmesh member's heartbeat as a klusterlet's.
// A fixed name lets RBAC restrict the agent to that one Lease.
const HeartbeatLeaseName = "managed-cluster-lease"

// HeartbeatRenewalAnnotation on the heartbeat Lease is the ctrlmesh agent's
// mark of its last renewal: the renewTime it wrote. The hub counts a
// renewal only when this mark changes, not when renewTime alone does: the
// Lease is OCM's, and OCM's registration agent, where it runs beside the
// ctrlmesh agent, renews renewTime too, but grants no rules validity.
const HeartbeatRenewalAnnotation = "ctrlmesh.io/agent-renew-time"

// ClusterNamespace is the namespace of a member on the hub, where its
// heartbeat Lease lives: as in OCM, named as the cluster (OCM's hub creates
// it when it accepts the cluster, as ctrlmesh's does). The execution
// namespace karmada-es-<cluster>, where its Works live, is another one:
// Karmada's.
func ClusterNamespace(cluster string) string { return cluster }

// ShardingConfigFinalizer keeps a ShardingConfig until the hub has deleted its
// Works.
const ShardingConfigFinalizer = "ctrlmesh.io/works"

// Field managers of ctrlmesh's writes in member clusters.
const (
	// WorkApplyFieldManager manages the ShardRoutes the agent applies from
	// Works in standalone mode.
	WorkApplyFieldManager = "ctrlmesh-agent-workapply"
	// proxyFieldManagerPrefix, followed by the pod name, manages one proxy's
	// entry status.pods[name=<pod>].appliedRulesHash of its ShardRoute.
	proxyFieldManagerPrefix = "ctrlmesh-proxy/"
)

// ProxyFieldManager is the server-side-apply field manager under which the
// proxy of pod reports the rules it applied. One manager per pod lets every
// proxy own its own entry of the list map status.pods.
func ProxyFieldManager(pod string) string { return proxyFieldManagerPrefix + pod }

// SystemNamespaces are never sharded, labeled or injected into, whatever a
// selector says: the cluster's own machinery runs there.
func SystemNamespaces() []string {
	return []string{metav1.NamespaceSystem, metav1.NamespacePublic, "kube-node-lease"}
}

// Annotations the agent's injection webhook writes on every pod that asks for
// the proxy (EnableProxyLabel).
const (
	// ProxyInjectionAnnotation is ProxyInjected or ProxyInjectionSkipped.
	ProxyInjectionAnnotation = "ctrlmesh.io/proxy-injection"
	// ProxyInjectionReasonAnnotation says, for people, what was injected for
	// which ShardRoute, or why nothing was.
	ProxyInjectionReasonAnnotation = "ctrlmesh.io/proxy-injection-reason"

	ProxyInjected         = "injected"
	ProxyInjectionSkipped = "skipped"
)

// The proxy sidecar as the injector writes it: its container name, ports and
// the flags and environment of ctrlmesh-proxy it sets. ctrlmesh-proxy
// declares its flags with these names, so the two cannot drift apart.
const (
	// ProxyContainerName names the proxy container. A pod with a container of
	// this name already has its proxy and is left alone.
	ProxyContainerName = "ctrlmesh-proxy"
	// ProxyListenPort serves the operator's API requests, on loopback only:
	// the containers of a pod share its network namespace.
	ProxyListenPort = 15080
	// ProxyHealthPort serves the proxy's /healthz, /readyz and /metrics.
	ProxyHealthPort = 15081
	// ProxyWebhookRouterPort is where the proxy's webhook router listens when
	// the ShardRoute has spec.webhook: point the operator's webhook Service's
	// targetPort here. The operator keeps serving on spec.webhook.port,
	// which must therefore differ.
	ProxyWebhookRouterPort = 15443
	// ProxyForwardPort serves the operator's external (non-Kubernetes)
	// HTTP and HTTPS requests as a forward proxy, on loopback only: the
	// injector points the operator containers' HTTP_PROXY and HTTPS_PROXY
	// here, so that traffic policies matching hosts apply to them. It
	// refuses the API server's addresses: the API goes through
	// ProxyListenPort, where it is fenced.
	ProxyForwardPort = 15082

	ProxyFlagListenAddress        = "listen-address"
	ProxyFlagHealthAddress        = "health-address"
	ProxyFlagRulesName            = "rules-name"
	ProxyFlagOperatorKubeconfig   = "operator-kubeconfig"
	ProxyFlagWebhookListenAddress = "webhook-listen-address"
	ProxyFlagWebhookCertDir       = "webhook-cert-dir"
	ProxyFlagForwardProxyAddress  = "forward-proxy-address"
	ProxyFlagStateDir             = "state-dir"

	// Flags of the in-cluster interceptions (Environment, Iptables).
	ProxyFlagOperatorServiceAccountDir = "operator-serviceaccount-dir"
	ProxyFlagServingNames              = "serving-names"

	// RedirectContainerName names the init container of Iptables
	// interception: the proxy's image running its RedirectCommand, which
	// programs the pod's netfilter rules and exits.
	RedirectContainerName = "ctrlmesh-redirect"
	// RedirectCommand is the ctrlmesh-proxy subcommand of that container,
	// with its flags.
	RedirectCommand           = "redirect"
	RedirectFlagDestination   = "destination"
	RedirectFlagToPort        = "to-port"
	RedirectFlagExcludeUserID = "exclude-uid"
	// ProxyUserID is the user (and group) the proxy runs as under Iptables
	// interception: the redirection leaves this user's connections alone,
	// so that the proxy reaches the API server. The operator must not run
	// as it (the injector refuses pods that ask for it).
	ProxyUserID = 15080

	// ProxyEnvPodName and ProxyEnvPodNamespace are the defaults of the proxy's
	// --pod-name and --pod-namespace; the injector fills them from the
	// downward API.
	ProxyEnvPodName      = "POD_NAME"
	ProxyEnvPodNamespace = "POD_NAMESPACE"
	ProxyEnvPodIP        = "POD_IP"
)

// ProxyFlag is "--name=value", a flag of ctrlmesh-proxy as the injector
// writes it.
func ProxyFlag(name string, value any) string { return fmt.Sprintf("--%s=%v", name, value) }

// The components as the Events they record name them.
const (
	HubComponent   = "ctrlmesh-hub"
	AgentComponent = "ctrlmesh-agent"
)

// Labels and annotations of the Works the hub writes, one per
// (ShardingConfig, cluster).
const (
	// WorkConfigNamespaceLabel and WorkConfigNameLabel on a Work name the
	// ShardingConfig it carries the route of.
	WorkConfigNamespaceLabel = "ctrlmesh.io/shardingconfig-namespace"
	WorkConfigNameLabel      = "ctrlmesh.io/shardingconfig-name"
	// WorkRulesHashAnnotation on a Work is the rulesHash of its ShardRoute,
	// so that the hub tells an unchanged Work without decoding its manifest.
	WorkRulesHashAnnotation = "ctrlmesh.io/rules-hash"
	// WorkAgentNamespaceAnnotation on a Work is the member agent's namespace
	// its labeler ClusterRoleBinding names ("" when the Work carries none),
	// so that the hub rewrites the Work when the agent's claim changes.
	WorkAgentNamespaceAnnotation = "ctrlmesh.io/agent-namespace"
)

// AgentServiceAccount is the ServiceAccount of the ctrlmesh agent in its
// member namespace: the subject of its member RBAC, and of the labeler
// rights the hub sends with each ShardingConfig's Work.
const AgentServiceAccount = "ctrlmesh-agent"

// LabelerRBACPrefix starts the name of every labeler ClusterRole and
// ClusterRoleBinding; the agent's standalone applier applies no RBAC object
// of another name.
const LabelerRBACPrefix = "ctrlmesh-labeler-"

// LabelerRBACName is the name of the ClusterRole, and of its binding, that
// gives the agent's labeler the rights the limits of ShardingConfig
// namespace/name need in a member: "ctrlmesh-labeler-<namespace>.<name>".
// A namespace is a DNS label, without dots, so the first dot splits the name
// unambiguously; with a namespace of at most 63 characters and a
// ShardingConfig name of at most 63 (its CRD's rule) the name has at most
// 144, within the 253 of an RBAC object name.
func LabelerRBACName(namespace, name string) string {
	return LabelerRBACPrefix + namespace + "." + name
}

// MemberClusterLabel names the member cluster of a hub object that exists
// per member, such as the RBAC of its agent.
const MemberClusterLabel = "ctrlmesh.io/cluster"
