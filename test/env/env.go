// Package env starts real, independent Kubernetes control planes — a hub and
// member clusters — for ctrlmesh's tests. Each cluster is its own etcd and
// kube-apiserver, run by controller-runtime's envtest from binaries that
// `make tools` builds from source into bin/. Nothing is faked: selectors,
// watches, leases, webhooks and CRD validation are the API server's own.
package env

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/mod/modfile"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
)

// AssetsEnv names the environment variable holding the directory with the
// kube-apiserver and etcd binaries. When unset, <repo>/bin is used.
const AssetsEnv = "CTRLMESH_TEST_ASSETS"

// FeatureShardedListAndWatch is the kube-apiserver feature gate of KEP-5866
// (server-side sharded list and watch), alpha and off by default in v1.36.
const FeatureShardedListAndWatch = "ShardedListAndWatch"

// ClusterSpec describes one cluster to start.
type ClusterSpec struct {
	// Name of the cluster, such as "hub" or "member1".
	Name string
	// FeatureGates to turn on in kube-apiserver, such as
	// FeatureShardedListAndWatch.
	FeatureGates []string
	// APIServerFlags are extra kube-apiserver flags, name (without dashes) to
	// value.
	APIServerFlags map[string]string
}

// Options for Start.
type Options struct {
	// Clusters to start, all at once.
	Clusters []ClusterSpec
	// AssetsDir holds kube-apiserver and etcd. Default: $CTRLMESH_TEST_ASSETS,
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

// Cluster is one running control plane.
type Cluster struct {
	Name string
	// Config is an admin (system:masters) client config.
	Config *rest.Config
	// KubeconfigPath is a kubeconfig file for Config.
	KubeconfigPath string
	// Client is an admin client with ctrlmesh's scheme.
	Client client.Client

	env *envtest.Environment
}

// Fleet is a set of running clusters.
type Fleet struct {
	Clusters []*Cluster
	// Scheme is the scheme the clients use.
	Scheme *runtime.Scheme

	workDir       string
	removeWorkDir bool
	stopOnce      sync.Once
	stopErr       error
}

// Cluster returns the cluster of that name, or nil.
func (f *Fleet) Cluster(name string) *Cluster {
	for _, c := range f.Clusters {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Start starts every cluster of opts concurrently, installs the CRDs into
// each and returns once all serve. On error, whatever started is stopped.
func Start(ctx context.Context, opts Options) (*Fleet, error) {
	if len(opts.Clusters) == 0 {
		return nil, errors.New("env: no clusters to start")
	}
	if err := checkNames(opts.Clusters); err != nil {
		return nil, err
	}
	root, err := repoRoot()
	if err != nil && (opts.AssetsDir == "" || opts.CRDDirs == nil) {
		return nil, err
	}
	assets := opts.AssetsDir
	if assets == "" {
		assets = os.Getenv(AssetsEnv)
	}
	if assets == "" {
		assets = filepath.Join(root, "bin")
	}
	if err := checkBinaries(assets); err != nil {
		return nil, err
	}
	crdDirs := opts.CRDDirs
	if crdDirs == nil {
		crdDirs = []string{filepath.Join(root, "deploy", "crds"), filepath.Join(root, "deploy", "crds", "third-party")}
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	scheme, err := ctrlmeshscheme.New()
	if err != nil {
		return nil, err
	}

	fleet := &Fleet{Scheme: scheme, workDir: opts.WorkDir}
	if fleet.workDir == "" {
		if fleet.workDir, err = os.MkdirTemp("", "ctrlmesh-env-"); err != nil {
			return nil, fmt.Errorf("env: creating the work directory: %w", err)
		}
		fleet.removeWorkDir = true
	}

	fleet.Clusters = make([]*Cluster, len(opts.Clusters))
	errs := make([]error, len(opts.Clusters))
	var wg sync.WaitGroup
	for i, spec := range opts.Clusters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fleet.Clusters[i], errs[i] = startCluster(spec, assets, crdDirs, timeout, scheme, fleet.workDir)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, fleet.Stop())
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(err, fleet.Stop())
	}
	return fleet, nil
}

func startCluster(spec ClusterSpec, assets string, crdDirs []string, timeout time.Duration, scheme *runtime.Scheme, workDir string) (*Cluster, error) {
	useExisting := false
	te := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        crdDirs,
		ErrorIfCRDPathMissing:    true,
		CRDInstallOptions:        envtest.CRDInstallOptions{Scheme: scheme},
		Scheme:                   scheme,
		UseExistingCluster:       &useExisting,
		ControlPlaneStartTimeout: timeout,
		ControlPlaneStopTimeout:  time.Minute,
	}
	args := te.ControlPlane.GetAPIServer().Configure()
	if len(spec.FeatureGates) > 0 {
		gates := make([]string, len(spec.FeatureGates))
		for i, g := range spec.FeatureGates {
			gates[i] = g + "=true"
		}
		args.Set("feature-gates", strings.Join(gates, ","))
	}
	for flag, value := range spec.APIServerFlags {
		args.Set(flag, value)
	}

	cfg, err := te.Start()
	if err != nil {
		// envtest may leave half a control plane behind.
		return nil, errors.Join(fmt.Errorf("env: starting cluster %q: %w", spec.Name, err), te.Stop())
	}
	c := &Cluster{Name: spec.Name, Config: cfg, env: te}
	c.KubeconfigPath = filepath.Join(workDir, spec.Name+".kubeconfig")
	if err := os.WriteFile(c.KubeconfigPath, te.KubeConfig, 0o600); err != nil {
		return nil, errors.Join(fmt.Errorf("env: writing the kubeconfig of cluster %q: %w", spec.Name, err), te.Stop())
	}
	if c.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, errors.Join(fmt.Errorf("env: client for cluster %q: %w", spec.Name, err), te.Stop())
	}
	return c, nil
}

// AddUser returns a client config for a new user of the cluster, with
// exactly the rights RBAC gives that name and those groups: for testing that
// a component's shipped RBAC is enough.
func (c *Cluster) AddUser(name string, groups ...string) (*rest.Config, error) {
	user, err := c.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("env: adding user %q to cluster %q: %w", name, c.Name, err)
	}
	return user.Config(), nil
}

// Stop stops every cluster and removes the work directory Start created.
// It is safe to call more than once.
func (f *Fleet) Stop() error {
	f.stopOnce.Do(func() {
		var errs []error
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, c := range f.Clusters {
			if c == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := c.env.Stop(); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("env: stopping cluster %q: %w", c.Name, err))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if f.removeWorkDir {
			if err := os.RemoveAll(f.workDir); err != nil {
				errs = append(errs, fmt.Errorf("env: removing %s: %w", f.workDir, err))
			}
		}
		f.stopErr = errors.Join(errs...)
	})
	return f.stopErr
}

func checkNames(specs []ClusterSpec) error {
	seen := map[string]bool{}
	for _, s := range specs {
		if s.Name == "" {
			return errors.New("env: a cluster has no name")
		}
		if seen[s.Name] {
			return fmt.Errorf("env: cluster name %q used twice", s.Name)
		}
		seen[s.Name] = true
	}
	return nil
}

// checkBinaries fails with an instruction, never a skip: a missing binary is
// a broken test setup.
func checkBinaries(dir string) error {
	var missing []string
	for _, name := range []string{"kube-apiserver", "etcd"} {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	return fmt.Errorf("env: %s not found in %s: run 'make tools' to build them from source (make test does this for you), or set %s to a directory that has them",
		strings.Join(missing, " and "), dir, AssetsEnv)
}

// repoRoot finds the ctrlmesh checkout by walking up from the working
// directory to the go.mod of module github.com/ctrlmesh/ctrlmesh.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("env: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modfile.ModulePath(data) == "github.com/ctrlmesh/ctrlmesh" {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("env: not inside the ctrlmesh repository (no go.mod of github.com/ctrlmesh/ctrlmesh above the working directory); set Options.AssetsDir and Options.CRDDirs")
		}
		dir = parent
	}
}
