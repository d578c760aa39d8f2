// Package clusters starts real, independent Kubernetes control planes on
// one machine: each its own etcd and kube-apiserver, run by
// controller-runtime's envtest. The local demo fleet (package localfleet)
// and the tests (package test/env) use it. It imports nothing of ctrlmesh's
// components, so that their tests can use it.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	configv1alpha1 "github.com/karmada-io/karmada/pkg/apis/config/v1alpha1"
	"golang.org/x/mod/modfile"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	ctrlmeshscheme "github.com/ctrlmesh/ctrlmesh/pkg/scheme"
)

// FeatureShardedListAndWatch is the kube-apiserver feature gate of KEP-5866
// (server-side sharded list and watch), alpha and off by default in v1.36.
const FeatureShardedListAndWatch = "ShardedListAndWatch"

// FeatureCBORServingAndStorage is the kube-apiserver feature gate that
// serves CBOR (application/cbor, application/cbor-seq for watches), alpha
// and off by default in v1.36.
const FeatureCBORServingAndStorage = "CBORServingAndStorage"

// Spec describes one cluster to start.
type Spec struct {
	// Name of the cluster, such as "hub" or "member1".
	Name string
	// FeatureGates to turn on in kube-apiserver, such as
	// FeatureShardedListAndWatch.
	FeatureGates []string
	// APIServerFlags are extra kube-apiserver flags, name (without dashes) to
	// value.
	APIServerFlags map[string]string
	// Karmada makes the cluster a Karmada control plane: its kube-apiserver
	// is the Karmada API server, with Karmada's CRDs (Options.KarmadaCRDDirs)
	// and the aggregation layer's front-proxy certificates, and
	// karmada-aggregated-apiserver (serving cluster.karmada.io) and
	// karmada-controller-manager run against it, built by 'make tools'.
	Karmada bool
	// Node gives the cluster a real node (Cluster.Node): its own containerd
	// and kubelet, with kube-controller-manager and kube-scheduler, so that
	// its pods run. It needs root, the packages of 'make node-packages' and
	// the binaries of 'make tools'.
	Node bool
}

// Options for Start.
type Options struct {
	// Clusters to start, all at once.
	Clusters []Spec
	// AssetsDir holds kube-apiserver and etcd. Required.
	AssetsDir string
	// CRDDirs are installed into every cluster.
	CRDDirs []string
	// KarmadaCRDDirs are installed, beside CRDDirs, into the clusters of
	// Spec.Karmada: Karmada's chart CRDs (KarmadaCRDDirs). Required when a
	// cluster is one.
	KarmadaCRDDirs []string
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
	// Client is an admin client with ctrlmesh's scheme and Karmada's
	// cluster.karmada.io and config.karmada.io.
	Client client.Client
	// Karmada runs the Karmada components of a cluster of Spec.Karmada; nil
	// for the others.
	Karmada *Karmada
	// Node is the real node of a cluster of Spec.Node; nil for the others.
	Node *Node

	env *envtest.Environment
}

// Group is a set of running clusters.
type Group struct {
	Clusters []*Cluster
	// Scheme is the scheme the clients use.
	Scheme *runtime.Scheme

	workDir       string
	removeWorkDir bool
	stopOnce      sync.Once
	stopErr       error
}

// Cluster returns the cluster of that name, or nil.
func (g *Group) Cluster(name string) *Cluster {
	for _, c := range g.Clusters {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Start starts every cluster of opts concurrently, each its own etcd
// and kube-apiserver run by controller-runtime's envtest, installs the CRDs
// into each and returns once all serve. On error, whatever started is
// stopped.
func Start(ctx context.Context, opts Options) (*Group, error) {
	if len(opts.Clusters) == 0 {
		return nil, errors.New("clusters: no clusters to start")
	}
	if err := checkNames(opts.Clusters); err != nil {
		return nil, err
	}
	binaries := []string{"kube-apiserver", "etcd"}
	if slices.ContainsFunc(opts.Clusters, func(s Spec) bool { return s.Karmada }) {
		if len(opts.KarmadaCRDDirs) == 0 {
			return nil, errors.New("clusters: a Karmada control plane needs Options.KarmadaCRDDirs (see KarmadaCRDDirs)")
		}
		binaries = append(binaries, KarmadaAggregatedAPIServerBinary, KarmadaControllerManagerBinary, KarmadaAgentBinary)
	}
	if err := CheckBinaries(opts.AssetsDir, "run 'make tools' to build them from source", binaries...); err != nil {
		return nil, err
	}
	if slices.ContainsFunc(opts.Clusters, func(s Spec) bool { return s.Node }) {
		if err := checkNodeMachine(opts.AssetsDir); err != nil {
			return nil, fmt.Errorf("clusters: %w", err)
		}
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}

	g := &Group{Scheme: scheme, workDir: opts.WorkDir}
	if g.workDir == "" {
		if g.workDir, err = os.MkdirTemp("", "ctrlmesh-env-"); err != nil {
			return nil, fmt.Errorf("clusters: creating the work directory: %w", err)
		}
		g.removeWorkDir = true
	}

	g.Clusters = make([]*Cluster, len(opts.Clusters))
	errs := make([]error, len(opts.Clusters))
	var wg sync.WaitGroup
	for i, spec := range opts.Clusters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.Clusters[i], errs[i] = startCluster(ctx, spec, opts, timeout, scheme, g.workDir)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, g.Stop())
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(err, g.Stop())
	}
	return g, nil
}

func startCluster(ctx context.Context, spec Spec, opts Options, timeout time.Duration, scheme *runtime.Scheme, workDir string) (_ *Cluster, err error) {
	crdDirs := opts.CRDDirs
	var karmadaFiles karmadaPaths
	if spec.Karmada {
		crdDirs = append(slices.Clone(crdDirs), opts.KarmadaCRDDirs...)
		var flags map[string]string
		var err error
		if karmadaFiles, flags, err = prepareKarmada(workDir, spec.Name); err != nil {
			return nil, fmt.Errorf("clusters: preparing Karmada on cluster %q: %w", spec.Name, err)
		}
		spec.APIServerFlags = maps.Clone(spec.APIServerFlags)
		if spec.APIServerFlags == nil {
			spec.APIServerFlags = map[string]string{}
		}
		maps.Copy(spec.APIServerFlags, flags)
	}
	useExisting := false
	te := &envtest.Environment{
		BinaryAssetsDirectory:    opts.AssetsDir,
		CRDDirectoryPaths:        crdDirs,
		ErrorIfCRDPathMissing:    true,
		CRDInstallOptions:        envtest.CRDInstallOptions{Scheme: scheme},
		Scheme:                   scheme,
		UseExistingCluster:       &useExisting,
		ControlPlaneStartTimeout: timeout,
		ControlPlaneStopTimeout:  time.Minute,
	}
	apiServer := te.ControlPlane.GetAPIServer()
	// A directory of our own for the API server's certificates (envtest
	// would make a temporary one and drop it on stop), so that
	// RestartAPIServer brings it back with the same serving certificate.
	apiServer.CertDir = filepath.Join(workDir, spec.Name+"-apiserver")
	if err := os.MkdirAll(apiServer.CertDir, 0o700); err != nil {
		return nil, fmt.Errorf("clusters: %w", err)
	}
	args := apiServer.Configure()
	if len(spec.FeatureGates) > 0 {
		gates := make([]string, len(spec.FeatureGates))
		for i, g := range spec.FeatureGates {
			gates[i] = g + "=true"
		}
		args.Set("feature-gates", strings.Join(gates, ","))
	}
	// A node's network comes first: its API server listens on it. It goes
	// last, on error here or at Stop, once the API server stopped (whose
	// own clients use that address while it shuts down).
	var network *nodeNetwork
	if spec.Node {
		if network, err = claimNodeNetwork(); err != nil {
			return nil, fmt.Errorf("clusters: cluster %q: %w", spec.Name, err)
		}
		defer func() {
			if err != nil && network != nil {
				err = errors.Join(err, network.remove())
			}
		}()
		if err := prepareNodeAPIServer(apiServer, network); err != nil {
			return nil, fmt.Errorf("clusters: the API server of cluster %q for its node: %w", spec.Name, err)
		}
	}
	for flag, value := range spec.APIServerFlags {
		args.Set(flag, value)
	}

	cfg, err := te.Start()
	if err != nil {
		// envtest may leave half a control plane behind.
		return nil, errors.Join(fmt.Errorf("clusters: starting cluster %q: %w", spec.Name, err), te.Stop())
	}
	c := &Cluster{Name: spec.Name, Config: cfg, env: te}
	c.KubeconfigPath = filepath.Join(workDir, spec.Name+".kubeconfig")
	if err := os.WriteFile(c.KubeconfigPath, te.KubeConfig, 0o600); err != nil {
		return nil, errors.Join(fmt.Errorf("clusters: writing the kubeconfig of cluster %q: %w", spec.Name, err), te.Stop())
	}
	if c.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, errors.Join(fmt.Errorf("clusters: client for cluster %q: %w", spec.Name, err), te.Stop())
	}
	if spec.Karmada {
		if c.Karmada, err = startKarmada(ctx, c, karmadaFiles, opts.AssetsDir); err != nil {
			return nil, errors.Join(fmt.Errorf("clusters: %w", err), te.Stop())
		}
	}
	if spec.Node {
		if c.Node, err = startNode(ctx, c, network, opts.AssetsDir, workDir, timeout); err != nil {
			if c.Karmada != nil {
				c.Karmada.stop()
			}
			return nil, errors.Join(fmt.Errorf("clusters: %w", err), te.Stop())
		}
	}
	return c, nil
}

// RestartAPIServer kills the cluster's kube-apiserver, as a crash would, and
// starts it again on the same port with the same certificates, users and
// etcd (so the same objects): its clients see their connections and watches
// end, their requests refused, then served again. A graceful stop would
// wait up to a minute for the watches to drain.
func (c *Cluster) RestartAPIServer() error {
	apiServer := c.env.ControlPlane.APIServer
	pid, err := processWithArg("--cert-dir=" + apiServer.CertDir)
	if err != nil {
		return fmt.Errorf("clusters: the API server of %q: %w", c.Name, err)
	}
	p, err := os.FindProcess(pid)
	if err == nil {
		err = p.Kill()
	}
	if err != nil {
		return fmt.Errorf("clusters: killing the API server of %q: %w", c.Name, err)
	}
	// Stop returns once the process has exited.
	if err := apiServer.Stop(); err != nil {
		return fmt.Errorf("clusters: stopping the API server of %q: %w", c.Name, err)
	}
	if err := apiServer.Start(); err != nil {
		return fmt.Errorf("clusters: starting the API server of %q again: %w", c.Name, err)
	}
	return nil
}

// processWithArg finds the process of this user that has arg among its
// command-line arguments, on Linux (/proc).
func processWithArg(arg string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("finding the process with %s: %w", arg, err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(string(cmdline), "\x00"), arg) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process with %s", arg)
}

// newScheme is ctrlmesh's scheme and the Karmada APIs the test machinery
// writes: cluster.karmada.io (Cluster, served by the aggregated API server)
// and config.karmada.io (ResourceInterpreterCustomization).
func newScheme() (*runtime.Scheme, error) {
	scheme, err := ctrlmeshscheme.New()
	if err != nil {
		return nil, err
	}
	if err := clusterv1alpha1.Install(scheme); err != nil {
		return nil, fmt.Errorf("adding the cluster.karmada.io APIs to the scheme: %w", err)
	}
	if err := configv1alpha1.Install(scheme); err != nil {
		return nil, fmt.Errorf("adding the config.karmada.io APIs to the scheme: %w", err)
	}
	return scheme, nil
}

// AddUser returns a client config for a new user of the cluster, with
// exactly the rights RBAC gives that name and those groups: a component
// runs with its shipped RBAC and nothing more.
func (c *Cluster) AddUser(name string, groups ...string) (*rest.Config, error) {
	user, err := c.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("clusters: adding user %q to cluster %q: %w", name, c.Name, err)
	}
	return user.Config(), nil
}

// Stop stops every cluster and removes the work directory Start
// created. It is safe to call more than once.
func (g *Group) Stop() error {
	g.stopOnce.Do(func() {
		var errs []error
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, c := range g.Clusters {
			if c == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if c.Karmada != nil {
					c.Karmada.stop()
				}
				if c.Node != nil {
					if err := c.Node.stop(); err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("clusters: %w", err))
						mu.Unlock()
					}
				}
				if err := c.env.Stop(); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("clusters: stopping cluster %q: %w", c.Name, err))
					mu.Unlock()
				}
				if c.Node != nil {
					if err := c.Node.network.remove(); err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("clusters: %w", err))
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		if g.removeWorkDir {
			if err := os.RemoveAll(g.workDir); err != nil {
				errs = append(errs, fmt.Errorf("clusters: removing %s: %w", g.workDir, err))
			}
		}
		g.stopErr = errors.Join(errs...)
	})
	return g.stopErr
}

func checkNames(specs []Spec) error {
	seen := map[string]bool{}
	for _, s := range specs {
		if s.Name == "" {
			return errors.New("clusters: a cluster has no name")
		}
		if seen[s.Name] {
			return fmt.Errorf("clusters: cluster name %q used twice", s.Name)
		}
		seen[s.Name] = true
	}
	return nil
}

// CheckBinaries fails when an executable of names is missing from dir, with
// an error that names them and says how to get them (remedy).
func CheckBinaries(dir, remedy string, names ...string) error {
	var missing []string
	for _, name := range names {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	return fmt.Errorf("%s not found in %s: %s", strings.Join(missing, " and "), dir, remedy)
}

// RepoRoot finds the ctrlmesh checkout by walking up from the working
// directory to the go.mod of module github.com/ctrlmesh/ctrlmesh.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("clusters: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modfile.ModulePath(data) == "github.com/ctrlmesh/ctrlmesh" {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the ctrlmesh repository (no go.mod of github.com/ctrlmesh/ctrlmesh above the working directory)")
		}
		dir = parent
	}
}

// CRDDirs are the directories of the CRDs every cluster gets, in the
// checkout at root: ctrlmesh's, Karmada's Work and OCM's ManagedCluster.
func CRDDirs(root string) []string {
	return []string{filepath.Join(root, "deploy", "crds"), filepath.Join(root, "deploy", "crds", "third-party")}
}
