package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/ctrlmesh/ctrlmesh/test/controlplane"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The charts, relative to this package's directory, and the Kubernetes
// version they are rendered for: that of the test API server.
const (
	hubChart    = "charts/ctrlmesh-hub"
	agentChart  = "charts/ctrlmesh-agent"
	kubeVersion = "v1.36.3"
)

var (
	// helmBin is bin/helm, built from source by make tools.
	helmBin string
	// apiserver is one real API server with deploy/crds,
	// deploy/crds/third-party, Karmada's config.karmada.io CRDs (the
	// ShardRoute interpreter) and minimal cert-manager CRDs
	// (testdata/cert-manager): every rendered object is dry-run against it.
	apiserver *env.Cluster
	// dyn applies objects of any kind; warnings collects the API server's
	// warnings to its requests.
	dyn      dynamic.Interface
	warnings = &warningCollector{}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	// A missing helm fails the package, with the instruction; never a skip.
	if helmBin, err = findHelm(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	karmadaConfigCRDs, err := karmadaCRDDir("config")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fleet, err := env.Start(ctx, env.Options{
		Clusters: []env.ClusterSpec{{Name: "apiserver"}},
		// Setting CRDDirs replaces env's defaults, so they are listed too.
		CRDDirs: []string{"crds", filepath.Join("crds", "third-party"), filepath.Join("testdata", "cert-manager"), karmadaConfigCRDs},
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
	fmt.Fprintf(os.Stderr, "API server serving after %s\n", time.Since(start).Round(time.Millisecond))
	apiserver = fleet.Cluster("apiserver")
	cfg := rest.CopyConfig(apiserver.Config)
	cfg.WarningHandler = warnings
	if dyn, err = dynamic.NewForConfig(cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stopKarmadaFleet()
	return m.Run()
}

// karmadaCRDDir is the directory of Karmada's CRDs of one group (config,
// work, ...) in the karmada module go.mod requires.
func karmadaCRDDir(group string) (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	dirs, err := controlplane.KarmadaCRDDirs(root)
	if err != nil {
		return "", err
	}
	for _, d := range dirs {
		if filepath.Base(d) == group {
			return d, nil
		}
	}
	return "", fmt.Errorf("no directory %q among Karmada's CRD directories %v", group, dirs)
}

// findHelm returns bin/helm ($CTRLMESH_TEST_ASSETS/helm when that is set,
// as make test sets it to bin/), or an error saying how to build it.
func findHelm() (string, error) {
	dir := os.Getenv(env.AssetsEnv)
	if dir == "" {
		dir = filepath.Join("..", "bin")
	}
	path, err := filepath.Abs(filepath.Join(dir, "helm"))
	if err != nil {
		return "", err
	}
	info, err := os.Stat(path)
	if err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
		return "", fmt.Errorf("helm not found at %s: run 'make tools' to build it from source (make test does this for you), or set %s to a directory that has it", path, env.AssetsEnv)
	}
	return path, nil
}

// helmEnv keeps helm's config, cache and data directories in a temporary
// directory: rendering local charts needs nothing from $HOME.
func helmEnv(t *testing.T) []string {
	dir := t.TempDir()
	return append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(dir, "config"),
		"HELM_CACHE_HOME="+filepath.Join(dir, "cache"), "HELM_DATA_HOME="+filepath.Join(dir, "data"))
}

// helmTemplate runs helm template for chart into namespace with --set
// values sets and further helm flags extra.
func helmTemplate(t *testing.T, chart, namespace string, sets []string, extra ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	args := []string{"template", filepath.Base(chart), chart, "--namespace", namespace, "--kube-version", kubeVersion}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	args = append(args, extra...)
	cmd := exec.Command(helmBin, args...)
	cmd.Env = helmEnv(t)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return parseYAML(stdout.Bytes())
}

// render is helmTemplate that fails the test on error.
func render(t *testing.T, chart, namespace string, sets []string, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := helmTemplate(t, chart, namespace, sets, extra...)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) == 0 {
		t.Fatalf("helm template %s rendered no objects", chart)
	}
	return objs
}

// parseYAML splits multi-document YAML into objects, skipping empty
// documents.
func parseYAML(data []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("parsing %q: %w", doc, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

func describe(u *unstructured.Unstructured) string {
	if u.GetNamespace() != "" {
		return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
	}
	return u.GetKind() + " " + u.GetName()
}

// find returns the rendered object of that kind and name, or nil.
func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			return u
		}
	}
	return nil
}

// mustFind is find that fails the test when the object is missing.
func mustFind(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	u := find(objs, kind, name)
	if u == nil {
		t.Fatalf("%s %s not rendered", kind, name)
	}
	return u
}

// dryRunApply server-side applies every object with dryRun=All, forced
// ownership and strict field validation (unknown or duplicate fields are
// errors), and fails the test for each object the API server refuses or
// warns about. Namespaced objects must name their namespace (the plain
// manifests are applied with kubectl, not helm), cluster-scoped ones none.
//
// Namespaces are the one exception to dry-run: a dry-run Namespace would
// not exist for the objects in it, so every namespace the objects use or
// render is created for real first (and then dry-run applied like the rest).
func dryRunApply(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, u := range objs {
		if u.GetKind() == "Namespace" {
			ensureNamespace(ctx, t, apiserver, u.GetName())
		} else if u.GetNamespace() != "" {
			ensureNamespace(ctx, t, apiserver, u.GetNamespace())
		}
	}
	serverSideApply(ctx, t, apiserver, dyn, objs, []string{metav1.DryRunAll})
}

// serverSideApply applies every object to cluster through dyn (whose
// warnings go to warnings), with forced ownership and strict field
// validation, dry-run as dryRun says; see dryRunApply.
func serverSideApply(ctx context.Context, t *testing.T, cluster *env.Cluster, dyn dynamic.Interface, objs []*unstructured.Unstructured, dryRun []string) {
	t.Helper()
	mapper := cluster.Client.RESTMapper()
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Errorf("%s: the API server does not serve %s: %v", describe(u), gvk, err)
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if u.GetNamespace() == "" {
				t.Errorf("%s: namespaced, but rendered without metadata.namespace", describe(u))
				continue
			}
			ri = dyn.Resource(mapping.Resource).Namespace(u.GetNamespace())
		} else if u.GetNamespace() != "" {
			t.Errorf("%s: cluster-scoped, but rendered with metadata.namespace", describe(u))
		}
		data, err := u.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		warnings.reset()
		_, err = ri.Patch(ctx, u.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			DryRun:          dryRun,
			Force:           ptr.To(true),
			FieldManager:    "ctrlmesh-chart-test",
			FieldValidation: metav1.FieldValidationStrict,
		})
		if err != nil {
			t.Errorf("%s: server-side apply (dry-run %v) refused: %v", describe(u), dryRun, err)
		}
		if w := warnings.reset(); len(w) > 0 {
			t.Errorf("%s: the API server warned: %s", describe(u), strings.Join(w, "; "))
		}
	}
}

func ensureNamespace(ctx context.Context, t *testing.T, cluster *env.Cluster, name string) {
	t.Helper()
	err := cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// warningCollector is a rest.WarningHandler keeping the warnings of the
// requests since the last reset.
type warningCollector struct {
	mu       sync.Mutex
	messages []string
}

func (w *warningCollector) HandleWarningHeader(_ int, _ string, message string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.messages = append(w.messages, message)
}

func (w *warningCollector) reset() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.messages
	w.messages = nil
	return out
}
