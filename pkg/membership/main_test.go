package membership_test

import (
	"context"
	"os"
	"testing"

	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The fleet every test of the package uses: a hub and one member. Each test
// uses its own cluster names on the hub, so the tests stay independent.
var (
	fleet           *env.Fleet
	hub             *env.Cluster
	memberDiscovery discovery.ServerVersionInterface
	// memberClient reads member1, for its kube-system namespace's UID.
	memberClient client.Client
)

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}, {Name: "member1"}}}, func(_ context.Context, f *env.Fleet) (func(), error) {
		fleet = f
		hub = f.Cluster("hub")
		dc, err := discovery.NewDiscoveryClientForConfig(f.Cluster("member1").Config)
		if err != nil {
			return nil, err
		}
		memberDiscovery = dc
		memberClient = f.Cluster("member1").Client
		return nil, nil
	}))
}

// testNames keeps the names the tests use unique (see env.Names).
var testNames env.Names

func unique(base string) string { return testNames.Unique(base) }
