package membership

import (
	"fmt"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
)

// Configs loads the two kubeconfigs a member's agent or ctrlmeshctl is
// given: the hub's (hubKubeconfig, the agent's hub credentials) and the
// member's (memberKubeconfig; empty uses $KUBECONFIG, ~/.kube/config or
// in-cluster credentials).
func Configs(hubKubeconfig, memberKubeconfig string) (hub, member *rest.Config, err error) {
	hub, err = clientcmd.BuildConfigFromFlags("", hubKubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("hub kubeconfig %q: %w", hubKubeconfig, err)
	}
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	loading.ExplicitPath = memberKubeconfig
	member, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("member credentials: %w", err)
	}
	return hub, member, nil
}

// Connect builds what joining needs from the two kubeconfigs (see Configs):
// a client of the hub, and JoinOptions with the member's discovery and
// client (Member, MemberClient) for the caller to complete.
func Connect(hubKubeconfig, memberKubeconfig string) (client.Client, JoinOptions, error) {
	hubConfig, memberConfig, err := Configs(hubKubeconfig, memberKubeconfig)
	if err != nil {
		return nil, JoinOptions{}, err
	}
	scheme, err := ctrlmeshscheme.New()
	if err != nil {
		return nil, JoinOptions{}, err
	}
	hub, err := client.New(hubConfig, client.Options{Scheme: scheme})
	if err != nil {
		return nil, JoinOptions{}, fmt.Errorf("hub client: %w", err)
	}
	discoveryClient, err := discovery.NewDiscoveryClientForConfig(memberConfig)
	if err != nil {
		return nil, JoinOptions{}, fmt.Errorf("member discovery: %w", err)
	}
	member, err := client.New(memberConfig, client.Options{Scheme: scheme})
	if err != nil {
		return nil, JoinOptions{}, fmt.Errorf("member client: %w", err)
	}
	return hub, JoinOptions{Member: discoveryClient, MemberClient: member}, nil
}
