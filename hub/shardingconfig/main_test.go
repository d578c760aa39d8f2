package shardingconfig_test

import (
	"context"
	"os"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ctrlmesh/ctrlmesh/test/env"
	"github.com/ctrlmesh/ctrlmesh/test/localfleet"
)

// The hub the API server tests of the package use, and the hub's identity
// there, with exactly its shipped RBAC. Each test uses its own cluster
// names and namespaces, so the tests stay independent.
var (
	fleet       *env.Fleet
	hub         *env.Cluster
	hubIdentity *rest.Config
)

func TestMain(m *testing.M) {
	// The controllers log to logr.Discard(); controller-runtime's own
	// fallback logger would otherwise complain that none was set.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(env.Main(m, env.Options{Clusters: []env.ClusterSpec{{Name: "hub"}}}, func(ctx context.Context, f *env.Fleet) (func(), error) {
		fleet, hub = f, f.Cluster("hub")
		var err error
		hubIdentity, err = localfleet.PrepareHub(ctx, hub, "ctrlmesh")
		return nil, err
	}))
}

// testNames keeps the names the tests use unique (see env.Names).
var testNames env.Names

func unique(base string) string { return testNames.Unique(base) }
