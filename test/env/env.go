// Package env starts real, independent Kubernetes control planes — a hub and
// member clusters — for ctrlmesh's tests. Each cluster is its own etcd and
// kube-apiserver, run by controller-runtime's envtest from binaries that
// `make tools` builds from source into bin/. Nothing is faked: selectors,
// watches, leases, webhooks and CRD validation are the API server's own.
//
// The clusters are those of test/controlplane, which the local demo
// fleet also uses; this package adds the tests' defaults.
package env

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
)

// AssetsEnv names the environment variable holding the directory with the
// kube-apiserver and etcd binaries. When unset, <repo>/bin is used.
const AssetsEnv = "CTRLMESH_TEST_ASSETS"

// FeatureShardedListAndWatch is the kube-apiserver feature gate of KEP-5866
// (server-side sharded list and watch), alpha and off by default in v1.36.
const FeatureShardedListAndWatch = controlplane.FeatureShardedListAndWatch

// FeatureCBORServingAndStorage is the kube-apiserver feature gate that serves
// CBOR, alpha and off by default in v1.36.
const FeatureCBORServingAndStorage = controlplane.FeatureCBORServingAndStorage

type (
	// ClusterSpec describes one cluster to start.
	ClusterSpec = controlplane.Spec
	// Cluster is one running control plane.
	Cluster = controlplane.Cluster
	// Fleet is a set of running controlplane.
	Fleet = controlplane.Group
)

// Options for Start.
type Options struct {
	// Clusters to start, all at once.
	Clusters []ClusterSpec
	// AssetsDir holds kube-apiserver and etcd, and Karmada's components for a
	// cluster of ClusterSpec.Karmada (whose CRDs come from the karmada module
	// go.mod requires). Default: $CTRLMESH_TEST_ASSETS,
	// else <repo>/bin.
	AssetsDir string
	// CRDDirs are installed into every cluster. Default: <repo>/deploy/crds
	// and <repo>/deploy/crds/third-party (ctrlmesh, Karmada Work, OCM
	// ManagedCluster).
	CRDDirs []string
	// WorkDir receives one kubeconfig file per cluster. Default: a new
	// temporary directory, removed by Stop.
	WorkDir string
	// StartTimeout bounds the start of each control plane. Default: 2 minutes,
	// generous for a 2-core machine starting several at once.
	StartTimeout time.Duration
}

// Start starts every cluster of opts concurrently, installs the CRDs into
// each and returns once all serve. On error, whatever started is stopped.
func Start(ctx context.Context, opts Options) (*Fleet, error) {
	assets := opts.AssetsDir
	if assets == "" {
		assets = os.Getenv(AssetsEnv)
	}
	crdDirs := opts.CRDDirs
	karmada := slices.ContainsFunc(opts.Clusters, func(s ClusterSpec) bool { return s.Karmada })
	var karmadaCRDDirs []string
	if assets == "" || crdDirs == nil || karmada {
		root, err := controlplane.RepoRoot()
		if err != nil {
			return nil, fmt.Errorf("env: %w; set Options.AssetsDir and Options.CRDDirs", err)
		}
		if assets == "" {
			assets = filepath.Join(root, "bin")
		}
		if crdDirs == nil {
			crdDirs = controlplane.CRDDirs(root)
		}
		if karmada {
			if karmadaCRDDirs, err = controlplane.KarmadaCRDDirs(root); err != nil {
				return nil, fmt.Errorf("env: %w", err)
			}
		}
	}
	// A missing binary is a broken test setup: fail with an instruction,
	// never a skip.
	remedy := fmt.Sprintf("run 'make tools' to build them from source (make test does this for you), or set %s to a directory that has them", AssetsEnv)
	binaries := []string{"kube-apiserver", "etcd"}
	if karmada {
		binaries = append(binaries, controlplane.KarmadaAggregatedAPIServerBinary, controlplane.KarmadaControllerManagerBinary, controlplane.KarmadaAgentBinary)
	}
	if err := controlplane.CheckBinaries(assets, remedy, binaries...); err != nil {
		return nil, fmt.Errorf("env: %w", err)
	}
	return controlplane.Start(ctx, controlplane.Options{
		Clusters: opts.Clusters, AssetsDir: assets, CRDDirs: crdDirs, KarmadaCRDDirs: karmadaCRDDirs,
		WorkDir: opts.WorkDir, StartTimeout: opts.StartTimeout,
	})
}
