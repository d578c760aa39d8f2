package inject_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ctrlmesh/ctrlmesh/agent/inject"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestInjectedProxyServesTheOperator runs the ctrlmesh-proxy binary exactly
// as the injected container would run — its arguments and environment, the
// downward API resolved — and lists ConfigMaps through the kubeconfig it
// writes, as the operator containers would through $KUBECONFIG. Only what a
// test process cannot share with a pod is changed: the listen and health
// addresses (free ports), the kubeconfig path (a temporary directory), and
// the upstream credentials (the test's, as there is no in-cluster token).
func TestInjectedProxyServesTheOperator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "ctrlmesh-proxy")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/ctrlmesh/ctrlmesh/cmd/ctrlmesh-proxy")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the proxy: %v\n%s", err, out)
	}

	ns := createNamespace(t, ctx, "proxy-run")
	const podName = "demo-operator-0"
	createRoute(t, ctx, route(ns, "demo", nil, podName))
	want := operatorPod(ns)
	want.GenerateName, want.Name = "", podName
	pod := createPod(t, ctx, want)
	proxy := proxyOf(t, pod)
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owned"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	kubeconfig := filepath.Join(dir, "kubeconfig")
	healthAddress := fmt.Sprintf("127.0.0.1:%d", env.FreePort(t))
	forwardAddress := fmt.Sprintf("127.0.0.1:%d", env.FreePort(t))
	args := rewriteArgs(t, proxy.Args, map[string]string{
		"--listen-address":        fmt.Sprintf("127.0.0.1:%d", env.FreePort(t)),
		"--health-address":        healthAddress,
		"--operator-kubeconfig":   kubeconfig,
		"--forward-proxy-address": forwardAddress,
		"--state-dir":             t.TempDir(),
	})
	args = append(args, "--upstream-kubeconfig="+member.KubeconfigPath)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = resolveEnv(t, proxy.Env, pod)
	var output syncBuffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("proxy output:\n%s", output.String())
		}
	})

	// The operator container starts once the startup probe passes; by then
	// the kubeconfig is written.
	waitFor(t, ctx, "the proxy's /readyz", func() error {
		resp, err := http.Get("http://" + healthAddress + "/readyz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	})
	waitFor(t, ctx, "the operator kubeconfig", func() error {
		_, err := os.Stat(kubeconfig)
		return err
	})
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	operator, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	list, err := operator.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing through the operator kubeconfig (server %s): %v", cfg.Host, err)
	}
	var names []string
	for _, cm := range list.Items {
		names = append(names, cm.Name)
	}
	if !slices.Contains(names, "owned") {
		t.Errorf("ConfigMaps through the proxy: %v, want the shard's ConfigMap \"owned\"", names)
	}
	checkForwardProxy(t, pod, forwardAddress)
}

// checkForwardProxy: the operator container's HTTP_PROXY names the
// proxy's forward proxy, which the injected proxy serves (here at
// address): an external server is reached through it, the API server is
// refused.
func checkForwardProxy(t *testing.T, pod *corev1.Pod, address string) {
	t.Helper()
	if !slices.Contains(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: "HTTP_PROXY", Value: inject.ForwardProxyURL}) {
		t.Fatalf("the operator's environment %+v lacks HTTP_PROXY=%s", pod.Spec.Containers[0].Env, inject.ForwardProxyURL)
	}
	external := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("external")) }))
	defer external.Close()
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: address})}}
	get := func(u string) (int, string) {
		resp, err := client.Get(u)
		if err != nil {
			t.Fatalf("GET %s through the forward proxy: %v", u, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get(external.URL); code != http.StatusOK || body != "external" {
		t.Errorf("an external server through the forward proxy: %d %s", code, body)
	}
	api, err := url.Parse(member.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get("http://" + api.Host + "/api"); code != http.StatusForbidden || !strings.Contains(body, "is the Kubernetes API server") {
		t.Errorf("the API server through the forward proxy: %d %s", code, body)
	}
}

// rewriteArgs replaces the values of the --flag=value arguments named in
// with, failing if one is missing.
func rewriteArgs(t *testing.T, args []string, with map[string]string) []string {
	t.Helper()
	out := make([]string, len(args))
	replaced := 0
	for i, a := range args {
		name, _, _ := strings.Cut(a, "=")
		if v, ok := with[name]; ok {
			a = name + "=" + v
			replaced++
		}
		out[i] = a
	}
	if replaced != len(with) {
		t.Fatalf("proxy args %q lack some of %v", args, with)
	}
	return out
}

// resolveEnv is the container's environment as the kubelet would set it
// for pod, whose IP, as envtest runs no kubelet, is taken to be loopback.
func resolveEnv(t *testing.T, env []corev1.EnvVar, pod *corev1.Pod) []string {
	t.Helper()
	fieldValues := map[string]string{"metadata.name": pod.Name, "metadata.namespace": pod.Namespace, "status.podIP": "127.0.0.1"}
	var out []string
	for _, e := range env {
		value := e.Value
		if e.ValueFrom != nil {
			ref := e.ValueFrom.FieldRef
			if ref == nil || fieldValues[ref.FieldPath] == "" {
				t.Fatalf("env %s: cannot resolve %+v", e.Name, e.ValueFrom)
			}
			value = fieldValues[ref.FieldPath]
		}
		out = append(out, e.Name+"="+value)
	}
	return out
}

// waitFor polls check until it succeeds or ctx ends.
func waitFor(t *testing.T, ctx context.Context, what string, check func() error) {
	t.Helper()
	for {
		err := check()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// syncBuffer collects a process's output from its copying goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
