package clusters_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The hub every test of the package uses. Each test uses its own cluster
// names, so the tests stay independent.
var (
	fleet *env.Fleet
	hub   *env.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	// Fuzzing runs no test that needs the hub.
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	var err error
	fleet, err = env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	fmt.Fprintf(os.Stderr, "hub serving after %s\n", time.Since(start).Round(time.Millisecond))
	hub = fleet.Cluster("hub")
	return m.Run()
}

var (
	namesMu   sync.Mutex
	namesUsed = map[string]int{}
)

// unique returns base the first time and base-r<n> after, so that the tests
// also pass with -count above 1 against the one hub: envtest runs no
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
