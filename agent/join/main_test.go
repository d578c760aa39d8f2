package join_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/discovery"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The fleet every test of the package uses: a hub and one member. Each test
// uses its own cluster names on the hub, so the tests stay independent.
var (
	fleet           *env.Fleet
	hub             *env.Cluster
	memberDiscovery discovery.ServerVersionInterface
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	var err error
	fleet, err = env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}, {Name: "member1"}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	fmt.Fprintf(os.Stderr, "hub and member1 serving after %s\n", time.Since(start).Round(time.Millisecond))
	hub = fleet.Cluster("hub")
	dc, err := discovery.NewDiscoveryClientForConfig(fleet.Cluster("member1").Config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	memberDiscovery = dc
	return m.Run()
}

var (
	namesMu   sync.Mutex
	namesUsed = map[string]int{}
)

// unique returns base the first time and base-r<n> after, so that the tests
// also pass with -count above 1 against the one fleet: envtest runs no
// namespace controller, so what a test creates cannot be cleaned up.
func unique(base string) string {
	namesMu.Lock()
	defer namesMu.Unlock()
	namesUsed[base]++
	if n := namesUsed[base]; n > 1 {
		return fmt.Sprintf("%s-r%d", base, n)
	}
	return base
}
