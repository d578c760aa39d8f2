// Package join registers a member cluster with the ctrlmesh hub and keeps it
// alive there.
//
// The agent of a member cluster
//   - creates the member's OCM ManagedCluster on the hub (Join) and reports
//     cluster claims in its status: the member's Kubernetes version and the
//     ctrlmesh version;
//   - renews OCM's heartbeat Lease ctrlmeshv1alpha1.HeartbeatLeaseName
//     ("managed-cluster-lease") in the member's cluster namespace on the hub,
//     named as the cluster (Heartbeat);
//   - asks whether the hub accepted the member (IsAccepted): until an
//     administrator, or an auto-accept policy, sets spec.hubAcceptsClient, the
//     agent must apply no rules; once it has, it marks the ManagedCluster
//     joined (MarkJoined), as OCM's agent does.
//
// The agent never sets spec.hubAcceptsClient and never updates the
// ManagedCluster's spec: it writes only the status subresource. The hub, not
// the agent, creates the cluster and execution namespaces. AgentHubRBAC gives the hub RBAC
// for one member's agent, and deploy/rbac/agent-hub.yaml is its rendering for
// the cluster "example".
package membership

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/karmada-io/karmada/pkg/util/names"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/util/retry"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/version"
)

// The cluster claims Join writes into the ManagedCluster's status.
const (
	// ClaimKubeVersion is OCM's reserved claim for the member's Kubernetes
	// version, as its API server's discovery reports it (such as "v1.36.3").
	ClaimKubeVersion = "kubeversion.open-cluster-management.io"
	// ClaimCtrlmeshVersion is the version of the ctrlmesh agent.
	ClaimCtrlmeshVersion = "version.ctrlmesh.io"
	// ClaimAgentNamespace is the member namespace the agent runs in, whose
	// ServiceAccount ctrlmesh-agent the hub binds the labeler's rights to
	// (routework.NewLabelerRBAC). It is the member's word about itself: the
	// hub's acceptance policy lets an agent write only its own
	// ManagedCluster, so it names a subject in its own cluster only.
	ClaimAgentNamespace = "namespace.agent.ctrlmesh.io"
	// ClaimClusterID is OCM's reserved claim for the member's unique ID
	// (clusterv1alpha1.ReservedClusterClaimNames): the UID of its
	// kube-system namespace, the ID Karmada writes as its Cluster's spec.id
	// (karmadactl join, karmada-agent: util.ObtainClusterID), by which the
	// hub tells whether Karmada knows the member, and under which name.
	ClaimClusterID = "id.k8s.io"
)

// ClaimedClusterID is the ID mc's agent claims (ClaimClusterID), "" when it
// claims none.
func ClaimedClusterID(mc *clusterv1.ManagedCluster) string {
	return claimed(mc, ClaimClusterID)
}

// ClaimedAgentNamespace is the agent namespace mc claims (ClaimAgentNamespace), ""
// when it claims none.
func ClaimedAgentNamespace(mc *clusterv1.ManagedCluster) string {
	return claimed(mc, ClaimAgentNamespace)
}

func claimed(mc *clusterv1.ManagedCluster, name string) string {
	for _, c := range mc.Status.ClusterClaims {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

// MemberClusterID reads the member's ID: the UID of its kube-system
// namespace, as Karmada reads it for its Cluster's spec.id.
func MemberClusterID(ctx context.Context, member client.Reader) (string, error) {
	var ns corev1.Namespace
	if err := member.Get(ctx, client.ObjectKey{Name: metav1.NamespaceSystem}, &ns); err != nil {
		return "", fmt.Errorf("join: reading the member's namespace %s for its cluster ID: %w", metav1.NamespaceSystem, err)
	}
	if ns.UID == "" {
		return "", fmt.Errorf("join: the member's namespace %s has no UID", metav1.NamespaceSystem)
	}
	return string(ns.UID), nil
}

// JoinOptions describe the member that joins.
type JoinOptions struct {
	// ClusterName is the member's name on the hub: the ManagedCluster's name
	// and the suffix of its execution namespace karmada-es-<ClusterName>.
	// Required; a DNS-1123 label short enough for the namespace name.
	ClusterName string
	// Member is the discovery client of the member cluster, asked for its
	// Kubernetes version. Required.
	Member discovery.ServerVersionInterface
	// MemberClient reads the member's kube-system namespace, whose UID is
	// claimed as ClaimClusterID (MemberClusterID). Required.
	MemberClient client.Reader
	// LeaseDuration is written as spec.leaseDurationSeconds of a
	// ManagedCluster Join creates (OCM's agents renew their Lease at least
	// that often; OCM's hub takes the Lease as stopped after five of them).
	// Give the Heartbeat's. Default: DefaultLeaseDuration.
	LeaseDuration time.Duration
	// AgentVersion is claimed as ClaimCtrlmeshVersion. Default:
	// version.Version.
	AgentVersion string
	// AgentNamespace, when set, is claimed as ClaimAgentNamespace: without
	// it the hub grants the labeler nothing.
	AgentNamespace string
	// ExtraClaims are more claims to report, name to value. They may not
	// redefine the claims Join sets itself.
	ExtraClaims map[string]string
}

// Join creates the member's ManagedCluster on the hub when there is none and
// writes the member's claims into its status. Claims with other names, set
// by someone else, are kept. It is idempotent: call it at every start of the
// agent.
//
// A new ManagedCluster is created with spec.hubAcceptsClient false (the
// default) and spec.leaseDurationSeconds; Join never changes the spec of an
// existing one, so the hub's
// acceptance survives every re-join. Creating needs the RBAC verb create on
// managedclusters, which RBAC cannot restrict to one name; a hub that
// creates the ManagedCluster itself can leave that grant out (see
// AgentHubRBAC).
func Join(ctx context.Context, hub client.Client, opts JoinOptions) error {
	if err := validateClusterName(opts.ClusterName); err != nil {
		return err
	}
	if opts.Member == nil || opts.MemberClient == nil {
		return errors.New("join: no discovery client or client for the member cluster")
	}
	leaseDuration, err := leaseDurationSeconds(opts.LeaseDuration)
	if err != nil {
		return err
	}
	clusterID, err := MemberClusterID(ctx, opts.MemberClient)
	if err != nil {
		return err
	}
	sv, err := opts.Member.ServerVersion()
	if err != nil {
		return fmt.Errorf("join: reading the Kubernetes version of member %q: %w", opts.ClusterName, err)
	}
	if sv.GitVersion == "" {
		return fmt.Errorf("join: member %q reports no Kubernetes version", opts.ClusterName)
	}
	agentVersion := opts.AgentVersion
	if agentVersion == "" {
		agentVersion = version.Version
	}
	claims := map[string]string{}
	for name, value := range opts.ExtraClaims {
		if name == ClaimKubeVersion || name == ClaimCtrlmeshVersion || name == ClaimAgentNamespace || name == ClaimClusterID {
			return fmt.Errorf("join: extra claim %q is set by Join itself", name)
		}
		claims[name] = value
	}
	claims[ClaimKubeVersion] = sv.GitVersion
	claims[ClaimCtrlmeshVersion] = agentVersion
	claims[ClaimClusterID] = clusterID
	if opts.AgentNamespace != "" {
		if errs := validation.IsDNS1123Label(opts.AgentNamespace); len(errs) > 0 {
			return fmt.Errorf("join: agent namespace %q: %s", opts.AgentNamespace, strings.Join(errs, "; "))
		}
		claims[ClaimAgentNamespace] = opts.AgentNamespace
	}
	for name, value := range claims {
		if name == "" || len(name) > 253 || value == "" || len(value) > 1024 {
			return fmt.Errorf("join: claim %q=%q: names must have 1 to 253 characters, values 1 to 1024", name, value)
		}
	}

	key := client.ObjectKey{Name: opts.ClusterName}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var mc clusterv1.ManagedCluster
		err := hub.Get(ctx, key, &mc)
		switch {
		case apierrors.IsNotFound(err):
			mc = clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: opts.ClusterName},
				Spec: clusterv1.ManagedClusterSpec{LeaseDurationSeconds: leaseDuration}}
			if err := hub.Create(ctx, &mc); err != nil {
				if apierrors.IsAlreadyExists(err) {
					// Created meanwhile: a conflict makes the retry read it.
					return apierrors.NewConflict(clusterv1.Resource("managedclusters"), opts.ClusterName, err)
				}
				return fmt.Errorf("join: creating ManagedCluster %q on the hub: %w", opts.ClusterName, err)
			}
		case err != nil:
			return fmt.Errorf("join: reading ManagedCluster %q on the hub: %w", opts.ClusterName, err)
		}
		if !mergeClaims(&mc.Status, claims, sv.GitVersion) {
			return nil
		}
		if mc.Status.Conditions == nil {
			mc.Status.Conditions = []metav1.Condition{}
		}
		if err := hub.Status().Update(ctx, &mc); err != nil {
			if apierrors.IsConflict(err) {
				return err
			}
			return fmt.Errorf("join: updating the status of ManagedCluster %q on the hub: %w", opts.ClusterName, err)
		}
		return nil
	})
}

// mergeClaims sets claims in status, keeping the order and the other claims,
// and the Kubernetes version; it reports whether anything changed.
func mergeClaims(status *clusterv1.ManagedClusterStatus, claims map[string]string, kubeVersion string) bool {
	changed := false
	if status.Version.Kubernetes != kubeVersion {
		status.Version.Kubernetes = kubeVersion
		changed = true
	}
	seen := map[string]bool{}
	for i := range status.ClusterClaims {
		c := &status.ClusterClaims[i]
		value, ours := claims[c.Name]
		if !ours {
			continue
		}
		seen[c.Name] = true
		if c.Value != value {
			c.Value = value
			changed = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(claims)) {
		if !seen[name] {
			status.ClusterClaims = append(status.ClusterClaims, clusterv1.ManagedClusterClaim{Name: name, Value: claims[name]})
			changed = true
		}
	}
	return changed
}

// IsAccepted reports whether the hub accepts the member: spec.hubAcceptsClient
// of its ManagedCluster. The agent applies no rules while it is false. A
// missing ManagedCluster is an error for which apierrors.IsNotFound holds.
func IsAccepted(ctx context.Context, hub client.Client, cluster string) (bool, error) {
	if err := validateClusterName(cluster); err != nil {
		return false, err
	}
	var mc clusterv1.ManagedCluster
	if err := hub.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
		return false, fmt.Errorf("join: reading ManagedCluster %q on the hub: %w", cluster, err)
	}
	return mc.Spec.HubAcceptsClient, nil
}

// MarkJoined sets the ManagedCluster's condition ManagedClusterJoined True,
// as OCM's agent does once the hub accepted the cluster; the agent calls it
// when it starts to take rules from the hub. Only the condition is written,
// on the latest object, so the hub's conditions and the claims survive.
func MarkJoined(ctx context.Context, hub client.Client, cluster string) error {
	if err := validateClusterName(cluster); err != nil {
		return err
	}
	joined := metav1.Condition{Type: clusterv1.ManagedClusterConditionJoined, Status: metav1.ConditionTrue,
		Reason: ctrlmeshv1alpha1.ReasonClusterJoined, Message: "Managed cluster joined"}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var mc clusterv1.ManagedCluster
		if err := hub.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
			return fmt.Errorf("join: reading ManagedCluster %q on the hub: %w", cluster, err)
		}
		if !meta.SetStatusCondition(&mc.Status.Conditions, joined) {
			return nil
		}
		if err := hub.Status().Update(ctx, &mc); err != nil {
			if apierrors.IsConflict(err) {
				return err
			}
			return fmt.Errorf("join: marking ManagedCluster %q joined: %w", cluster, err)
		}
		return nil
	})
}

// leaseDurationSeconds is d in whole seconds, rounded up, DefaultLeaseDuration
// for 0.
func leaseDurationSeconds(d time.Duration) (int32, error) {
	if d < 0 {
		return 0, fmt.Errorf("join: negative lease duration %s", d)
	}
	if d == 0 {
		d = DefaultLeaseDuration
	}
	return int32((d + time.Second - 1) / time.Second), nil
}

func validateClusterName(name string) error {
	if name == "" {
		return errors.New("join: no cluster name")
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("join: cluster name %q: %v", name, errs)
	}
	// The name also ends the execution namespace's name.
	if ns := names.GenerateExecutionSpaceName(name); len(validation.IsDNS1123Label(ns)) > 0 {
		return fmt.Errorf("join: cluster name %q is too long for the execution namespace %q", name, ns)
	}
	return nil
}
