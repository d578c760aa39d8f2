package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Label keys that ctrlmesh writes on sharded objects in label mode, and that
// mark pods for proxy injection.
const (
	// ShardingHashLabel holds the object's bucket, in decimal, computed from its
	// namespace by pkg/sharding.
	ShardingHashLabel = "ctrlmesh.io/sharding-hash"
	// NamespaceLabel holds the namespace the bucket was computed from, so that a
	// label selector can pick single namespaces (canary by namespace).
	NamespaceLabel = "ctrlmesh.io/namespace"
	// ControlLabel marks objects that ctrlmesh labels and keeps labeled.
	ControlLabel = "ctrlmesh.io/control"
	// EnableProxyLabel on a pod asks for the ctrlmesh proxy sidecar.
	EnableProxyLabel = "ctrlmesh.io/enable-proxy"
)

// ShardingScope says whose objects are sharded among which pods.
// +kubebuilder:validation:Enum=PerCluster;Fleet
type ShardingScope string

const (
	// ScopePerCluster shards each member cluster's objects among the operator
	// pods of that same cluster. Every cluster has its own full set of buckets.
	ScopePerCluster ShardingScope = "PerCluster"
	// ScopeFleet shards the objects of one API server that every operator pod
	// talks to (for example the hub) among the pods of all selected clusters:
	// there is one set of buckets for the whole fleet.
	ScopeFleet ShardingScope = "Fleet"
)

// Interception says how the operator containers of an injected pod reach
// the proxy instead of the API server.
// +kubebuilder:validation:Enum=Kubeconfig;Environment;Iptables
type Interception string

const (
	// InterceptKubeconfig (the default, also when unset) sets $KUBECONFIG of
	// the operator containers to a kubeconfig the proxy writes: for
	// operators that honour KUBECONFIG (client-go's loading rules,
	// controller-runtime).
	InterceptKubeconfig Interception = "Kubeconfig"
	// InterceptEnvironment points KUBERNETES_SERVICE_HOST and
	// KUBERNETES_SERVICE_PORT of the operator containers at the proxy, which
	// serves TLS there, and mounts the proxy's CA bundle where
	// rest.InClusterConfig reads the cluster's: for operators that call
	// rest.InClusterConfig. No privileges.
	InterceptEnvironment Interception = "Environment"
	// InterceptIptables adds an init container with the NET_ADMIN
	// capability (only that) that redirects the pod's connections to the
	// API server's Service to the proxy (netfilter rules of the pod's
	// network namespace; the proxy's own connections, by its user ID, are
	// left alone), and mounts the proxy's CA bundle as Environment does: for
	// operators that dial the API server's Service however they find it.
	InterceptIptables Interception = "Iptables"
)

// ControllerConfig describes the operator's controller side.
type ControllerConfig struct {
	// LeaderElectionName is the name of the operator's leader-election lock
	// (a Lease, or a legacy ConfigMap or Endpoints lock) in any namespace. The
	// proxy renames it to "<name>---<shard>" so that each shard elects its own
	// leader.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	LeaderElectionName string `json:"leaderElectionName"`
}

// WebhookConfig describes the operator's admission webhook server, which the
// proxy fronts to send each admission request to the pod owning the object.
type WebhookConfig struct {
	// CertDir is the directory, inside the operator container, holding the
	// webhook's serving certificate (tls.crt, tls.key).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="webhook.certDir must be an absolute path, such as /tmp/k8s-webhook-server/serving-certs"
	CertDir string `json:"certDir"`
	// Port is the port the operator's webhook server listens on.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
}

// ResourceGroup names resources the way RBAC rules do. "*" matches every
// group or every resource.
type ResourceGroup struct {
	// APIGroups of the resources; "" is the core group, "*" any group.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	APIGroups []string `json:"apiGroups"`
	// Resources are plural resource names, such as "configmaps"; "*" is any.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	Resources []string `json:"resources"`
}

// Limit restricts what the operator's pods see of some resources: list and
// watch of these resources are sharded by bucket, and further narrowed by the
// limit's own selector.
type Limit struct {
	// RelateResources are the resources this limit shards.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	RelateResources []ResourceGroup `json:"relateResources"`
	// Selector, when set, is ANDed into every list and watch of these
	// resources, on top of the shard's buckets.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}
