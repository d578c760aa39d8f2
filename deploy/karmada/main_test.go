package karmada_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// cluster stands for the Karmada control plane: one API server with
// ctrlmesh's CRDs and Karmada's config.karmada.io CRDs, so that the shipped
// ResourceInterpreterCustomization is checked against Karmada's real schema
// and the Lua scripts run on ShardRoutes as an API server returns them.
var cluster *env.Cluster

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	karmadaCRDs, err := karmadaConfigCRDDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	start := time.Now()
	fleet, err := env.Start(ctx, env.Options{
		Clusters: []env.ClusterSpec{{Name: "karmada"}},
		// Setting CRDDirs replaces env's defaults, so they are listed too.
		CRDDirs: []string{filepath.Join("..", "crds"), filepath.Join("..", "crds", "third-party"), karmadaCRDs},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	fmt.Fprintf(os.Stderr, "karmada stand-in serving after %s\n", time.Since(start).Round(time.Millisecond))
	cluster = fleet.Cluster("karmada")
	return m.Run()
}

// karmadaConfigCRDDir is the directory of the config.karmada.io CRDs in the
// module cache, of the very Karmada version go.mod requires, so that the
// schema tested is the one whose Go code the Lua tests run.
func karmadaConfigCRDDir() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/karmada-io/karmada").Output()
	if err != nil {
		return "", fmt.Errorf("locating the karmada module (go list -m): %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "charts", "karmada", "_crds", "bases", "config")
	if _, err := os.Stat(filepath.Join(dir, "config.karmada.io_resourceinterpretercustomizations.yaml")); err != nil {
		return "", fmt.Errorf("the ResourceInterpreterCustomization CRD is not where karmada v1.16 keeps it: %w", err)
	}
	return dir, nil
}
