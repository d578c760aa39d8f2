package agent_test

import (
	"context"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestAgentReadsTheAPIServerEndpoints: with only its shipped RBAC the agent
// reads the EndpointSlice default/kubernetes, which its injector needs for
// Iptables interception, and no other: another EndpointSlice, or a list,
// is forbidden.
func TestAgentReadsTheAPIServerEndpoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := startFleet(t, ctx)
	asAgent, err := kubernetes.NewForConfig(f.agentMember)
	if err != nil {
		t.Fatal(err)
	}
	slices := asAgent.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault)
	env.Eventually(t, time.Minute, "the agent reads EndpointSlice default/kubernetes", func() error {
		_, err := slices.Get(ctx, "kubernetes", metav1.GetOptions{})
		return err
	})
	other := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "other"}, AddressType: discoveryv1.AddressTypeIPv4}
	env.Create(t, ctx, f.member.Client, other)
	if _, err := slices.Get(ctx, "other", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent reads EndpointSlice default/other: %v, want forbidden", err)
	}
	if _, err := slices.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent lists EndpointSlices: %v, want forbidden", err)
	}
}
