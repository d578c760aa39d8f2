package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/karmada-io/karmada/pkg/util/names"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/agent"
	"github.com/ctrlmesh/ctrlmesh/agent/join"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestAgentJoinsAndHeartbeats: the agent, with only its shipped hub RBAC,
// registers its cluster and renews its Lease; stopped, the Lease goes stale.
func TestAgentJoinsAndHeartbeats(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fleet, err := env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}, {Name: "member1"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			t.Error(err)
		}
	}()
	hub, member := fleet.Cluster("hub"), fleet.Cluster("member1")
	for _, ns := range []string{names.GenerateExecutionSpaceName("member1"), join.AgentNamespace} {
		if err := hub.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, obj := range join.AgentHubRBAC("member1") {
		if err := hub.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	agentConfig, err := hub.AddUser(join.AgentUserName("member1"))
	if err != nil {
		t.Fatal(err)
	}
	agentHub, err := client.New(agentConfig, client.Options{Scheme: hub.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	memberDiscovery, err := discovery.NewDiscoveryClientForConfig(member.Config)
	if err != nil {
		t.Fatal(err)
	}

	agentCtx, stopAgent := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(agentCtx, agent.Options{
			Hub: agentHub, Member: memberDiscovery, ClusterName: "member1", Identity: "agent-0",
			LeaseDuration: 2 * time.Second, RenewInterval: 200 * time.Millisecond, Log: testr.New(t),
		})
	}()

	renewTime := func() time.Time {
		var lease coordinationv1.Lease
		err := hub.Client.Get(ctx, client.ObjectKey{Namespace: names.GenerateExecutionSpaceName("member1"), Name: join.LeaseName}, &lease)
		if err != nil || lease.Spec.RenewTime == nil {
			return time.Time{}
		}
		return lease.Spec.RenewTime.Time
	}
	deadline := time.Now().Add(30 * time.Second)
	first := time.Time{}
	for {
		if rt := renewTime(); !rt.IsZero() {
			if first.IsZero() {
				first = rt
			} else if rt.After(first) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the heartbeat Lease was not created and renewed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var mc clusterv1.ManagedCluster
	if err := hub.Client.Get(ctx, client.ObjectKey{Name: "member1"}, &mc); err != nil {
		t.Fatalf("no ManagedCluster after the agent started: %v", err)
	}
	if mc.Spec.HubAcceptsClient {
		t.Error("the agent accepted its own cluster")
	}

	stopAgent()
	if err := <-done; err != nil {
		t.Fatalf("agent: %v", err)
	}
	stopped := renewTime()
	time.Sleep(1 * time.Second) // five renewal intervals
	if after := renewTime(); !after.Equal(stopped) {
		t.Fatalf("the Lease was renewed after the agent stopped: %v -> %v", stopped, after)
	}
}
