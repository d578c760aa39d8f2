package membership_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/membership"
	"github.com/ctrlmesh/ctrlmesh/pkg/version"
)

func claimsOf(mc *clusterv1.ManagedCluster) map[string][]string {
	out := map[string][]string{}
	for _, c := range mc.Status.ClusterClaims {
		out[c.Name] = append(out[c.Name], c.Value)
	}
	return out
}

func TestJoinAndAccept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster := unique("join-accept")
	sv, err := memberDiscovery.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}

	if _, err := membership.IsAccepted(ctx, hub.Client, cluster); !apierrors.IsNotFound(err) {
		t.Fatalf("IsAccepted before Join: err = %v, want NotFound", err)
	}

	if err := membership.Join(ctx, hub.Client, membership.JoinOptions{ClusterName: cluster, Member: memberDiscovery, MemberClient: memberClient}); err != nil {
		t.Fatal(err)
	}
	var mc clusterv1.ManagedCluster
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
		t.Fatal(err)
	}
	claims := claimsOf(&mc)
	if got := claims[membership.ClaimKubeVersion]; len(got) != 1 || got[0] != sv.GitVersion || sv.GitVersion == "" {
		t.Errorf("claim %s = %v, want [%s] (member discovery)", membership.ClaimKubeVersion, got, sv.GitVersion)
	}
	if got := claims[membership.ClaimCtrlmeshVersion]; len(got) != 1 || got[0] != version.Version {
		t.Errorf("claim %s = %v, want [%s]", membership.ClaimCtrlmeshVersion, got, version.Version)
	}
	if mc.Status.Version.Kubernetes != sv.GitVersion {
		t.Errorf("status.version.kubernetes = %q, want %q", mc.Status.Version.Kubernetes, sv.GitVersion)
	}
	// The ID Karmada writes as its Cluster's spec.id: member1's kube-system UID.
	var kubeSystem corev1.Namespace
	if err := memberClient.Get(ctx, client.ObjectKey{Name: metav1.NamespaceSystem}, &kubeSystem); err != nil {
		t.Fatal(err)
	}
	if got := claims[membership.ClaimClusterID]; len(got) != 1 || got[0] != string(kubeSystem.UID) || got[0] == "" {
		t.Errorf("claim %s = %v, want [%s] (member1's kube-system UID)", membership.ClaimClusterID, got, kubeSystem.UID)
	}
	if id := membership.ClaimedClusterID(&mc); id != string(kubeSystem.UID) {
		t.Errorf("ClaimedClusterID = %q, want %q", id, kubeSystem.UID)
	}
	// OCM's lease duration, the Heartbeat's default.
	if got := mc.Spec.LeaseDurationSeconds; got != int32(membership.DefaultLeaseDuration/time.Second) {
		t.Errorf("spec.leaseDurationSeconds = %d, want %d", got, int32(membership.DefaultLeaseDuration/time.Second))
	}
	if mc.Spec.HubAcceptsClient {
		t.Error("Join created an accepted ManagedCluster")
	}
	accepted, err := membership.IsAccepted(ctx, hub.Client, cluster)
	if err != nil || accepted {
		t.Fatalf("IsAccepted after Join = %v, %v; want false", accepted, err)
	}

	// The hub admin accepts the member, and someone adds a claim of their own.
	mc.Status.ClusterClaims = append(mc.Status.ClusterClaims, clusterv1.ManagedClusterClaim{Name: "product.open-cluster-management.io", Value: "4711"})
	if err := hub.Client.Status().Update(ctx, &mc); err != nil {
		t.Fatal(err)
	}
	mc.Spec.HubAcceptsClient = true
	if err := hub.Client.Update(ctx, &mc); err != nil {
		t.Fatal(err)
	}
	accepted, err = membership.IsAccepted(ctx, hub.Client, cluster)
	if err != nil || !accepted {
		t.Fatalf("IsAccepted after acceptance = %v, %v; want true", accepted, err)
	}

	// A re-join of a newer agent updates its claim and keeps the rest; it
	// claims its namespace, which the hub reads back.
	if err := membership.Join(ctx, hub.Client, membership.JoinOptions{ClusterName: cluster, Member: memberDiscovery, MemberClient: memberClient, AgentVersion: "v9.9.9",
		AgentNamespace: "agents", ExtraClaims: map[string]string{"platform.open-cluster-management.io": "envtest"}}); err != nil {
		t.Fatal(err)
	}
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
		t.Fatal(err)
	}
	claims = claimsOf(&mc)
	for name, want := range map[string]string{
		membership.ClaimKubeVersion:           sv.GitVersion,
		membership.ClaimCtrlmeshVersion:       "v9.9.9",
		"product.open-cluster-management.io":  "4711",
		membership.ClaimClusterID:             string(kubeSystem.UID),
		"platform.open-cluster-management.io": "envtest",
		membership.ClaimAgentNamespace:        "agents",
	} {
		if got := claims[name]; len(got) != 1 || got[0] != want {
			t.Errorf("after re-join, claim %s = %v, want [%s]", name, got, want)
		}
	}
	if len(mc.Status.ClusterClaims) != 6 {
		t.Errorf("after re-join, claims %+v, want 6", mc.Status.ClusterClaims)
	}
	if ns := membership.ClaimedAgentNamespace(&mc); ns != "agents" {
		t.Errorf("ClaimedAgentNamespace = %q, want agents", ns)
	}
	if !mc.Spec.HubAcceptsClient {
		t.Error("re-join revoked the acceptance")
	}

	// An unchanged re-join writes nothing.
	before := mc.ResourceVersion
	if err := membership.Join(ctx, hub.Client, membership.JoinOptions{ClusterName: cluster, Member: memberDiscovery, MemberClient: memberClient, AgentVersion: "v9.9.9",
		AgentNamespace: "agents", ExtraClaims: map[string]string{"platform.open-cluster-management.io": "envtest"}}); err != nil {
		t.Fatal(err)
	}
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
		t.Fatal(err)
	}
	if mc.ResourceVersion != before {
		t.Errorf("an unchanged re-join wrote the ManagedCluster: resourceVersion %s -> %s", before, mc.ResourceVersion)
	}

	// The agent marks the cluster joined, as OCM's agent does, and keeps
	// the claims; marking it again writes nothing.
	if err := membership.MarkJoined(ctx, hub.Client, cluster); err != nil {
		t.Fatal(err)
	}
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
		t.Fatal(err)
	}
	joined := meta.FindStatusCondition(mc.Status.Conditions, clusterv1.ManagedClusterConditionJoined)
	if joined == nil || joined.Status != metav1.ConditionTrue || joined.Reason != ctrlmeshv1alpha1.ReasonClusterJoined {
		t.Errorf("Joined condition %+v", joined)
	}
	if len(mc.Status.ClusterClaims) != 6 {
		t.Errorf("after MarkJoined, claims %+v", mc.Status.ClusterClaims)
	}
	before = mc.ResourceVersion
	if err := membership.MarkJoined(ctx, hub.Client, cluster); err != nil {
		t.Fatal(err)
	}
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
		t.Fatal(err)
	}
	if mc.ResourceVersion != before {
		t.Errorf("a second MarkJoined wrote the ManagedCluster: resourceVersion %s -> %s", before, mc.ResourceVersion)
	}
}

// Agents starting at once (such as two replicas during a rollout) both membership.
func TestJoinConcurrently(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster := unique("join-concurrent")
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = membership.Join(ctx, hub.Client, membership.JoinOptions{ClusterName: cluster, Member: memberDiscovery, MemberClient: memberClient})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("join %d: %v", i, err)
		}
	}
	var mc clusterv1.ManagedCluster
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, &mc); err != nil {
		t.Fatal(err)
	}
	if len(mc.Status.ClusterClaims) != 3 {
		t.Errorf("claims %+v, want exactly the 3 of Join", mc.Status.ClusterClaims)
	}
}

func TestJoinRejectsBadOptions(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts membership.JoinOptions
		want string
	}{
		{"no cluster name", membership.JoinOptions{Member: memberDiscovery, MemberClient: memberClient}, "no cluster name"},
		{"upper case", membership.JoinOptions{ClusterName: "Member1", Member: memberDiscovery, MemberClient: memberClient}, "cluster name"},
		{"dot", membership.JoinOptions{ClusterName: "member.one", Member: memberDiscovery, MemberClient: memberClient}, "cluster name"},
		{"too long for the namespace", membership.JoinOptions{ClusterName: strings.Repeat("a", 60), Member: memberDiscovery, MemberClient: memberClient}, "execution namespace"},
		{"no member", membership.JoinOptions{ClusterName: "bad-options"}, "no discovery client"},
		{"no member client", membership.JoinOptions{ClusterName: "bad-options", Member: memberDiscovery}, "no discovery client or client"},
		{"negative lease duration", membership.JoinOptions{ClusterName: "bad-options", Member: memberDiscovery, MemberClient: memberClient,
			LeaseDuration: -time.Second}, "negative lease duration"},
		{"the cluster ID as an extra claim", membership.JoinOptions{ClusterName: "bad-options", Member: memberDiscovery, MemberClient: memberClient,
			ExtraClaims: map[string]string{membership.ClaimClusterID: "forged"}}, "set by Join itself"},
		{"reserved extra claim", membership.JoinOptions{ClusterName: "bad-options", Member: memberDiscovery, MemberClient: memberClient,
			ExtraClaims: map[string]string{membership.ClaimKubeVersion: "v0"}}, "set by Join itself"},
		{"the agent namespace as an extra claim", membership.JoinOptions{ClusterName: "bad-options", Member: memberDiscovery, MemberClient: memberClient,
			ExtraClaims: map[string]string{membership.ClaimAgentNamespace: "kube-system"}}, "set by Join itself"},
		{"an agent namespace that is no namespace name", membership.JoinOptions{ClusterName: "bad-options", Member: memberDiscovery, MemberClient: memberClient,
			AgentNamespace: "Agents/x"}, "agent namespace"},
		{"empty claim value", membership.JoinOptions{ClusterName: "bad-options", Member: memberDiscovery, MemberClient: memberClient,
			ExtraClaims: map[string]string{"x.example.com": ""}}, "values 1 to 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := membership.Join(ctx, hub.Client, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
	// None of them wrote anything.
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: "bad-options"}, &clusterv1.ManagedCluster{}); !apierrors.IsNotFound(err) {
		t.Errorf("a rejected Join created ManagedCluster bad-options: %v", err)
	}
}
