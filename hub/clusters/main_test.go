package clusters_test

import (
	"context"
	"os"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The hub every test of the package uses. Each test uses its own cluster
// names, so the tests stay independent.
var (
	fleet *env.Fleet
	hub   *env.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}}}, func(_ context.Context, f *env.Fleet) (func(), error) {
		fleet = f
		hub = f.Cluster("hub")
		return nil, nil
	}))
}

// testNames keeps the names the tests use unique (see env.Names).
var testNames env.Names

func unique(base string) string { return testNames.Unique(base) }
