package proxy_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// TestOnlyTheOperatorUsesTheProxy: with an operator kubeconfig written, a
// caller without its token — anything else in the pod's network namespace
// — is refused (401) before the proxy acts with the operator's credentials;
// the operator, reading the kubeconfig, is served.
func TestOnlyTheOperatorUsesTheProxy(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	writeRules(t, rulesFile, route("t1", 1, "0-15", "16-31"))
	kubeconfig := filepath.Join(dir, "operator.kubeconfig")
	p := runProxy(t, ctx, proxy.Options{
		Upstream: fleet.Cluster("label").Config, Pod: "pod-a", RulesFile: rulesFile, RulesFileInterval: 50 * time.Millisecond,
		Mode: rules.ModeLabel, OperatorKubeconfig: kubeconfig,
	})
	for _, path := range []string{"/version", "/api/v1/namespaces/team-1-prod/configmaps", "/api/v1/namespaces/team-1-prod/secrets"} {
		resp, err := http.Get(p.config.Host + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %s, want 401", path, resp.Status)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		t.Errorf("the operator, with the kubeconfig's token: %v", err)
	}
}

// TestRestartKeepsTheOperatorsToken: a proxy restarted alone (the sidecar
// container, its operator running on, at the same address) takes the
// client token from its state directory, so the operator, which read its
// kubeconfig once at its start, is still served. Before, every start made
// a new token, and the operator got 401 until it restarted too.
func TestRestartKeepsTheOperatorsToken(t *testing.T) {
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	writeRules(t, rulesFile, route("t1", 1, "0-15", "16-31"))
	opts := proxy.Options{
		Upstream: fleet.Cluster("label").Config, Pod: "pod-a", RulesFile: rulesFile, RulesFileInterval: 50 * time.Millisecond,
		Mode: rules.ModeLabel, OperatorKubeconfig: filepath.Join(dir, "operator.kubeconfig"), StateDir: t.TempDir(),
	}
	ctx, stop := context.WithCancel(context.Background())
	first := runProxy(t, ctx, opts)
	cfg, err := clientcmd.BuildConfigFromFlags("", opts.OperatorKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps("team-1-prod").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("the operator, before the restart: %v", err)
	}
	stop()
	opts.ListenAddress = strings.TrimPrefix(first.config.Host, "http://")
	env.Eventually(t, 30*time.Second, "the first proxy to stop listening", func() error {
		conn, err := net.Dial("tcp", opts.ListenAddress)
		if err != nil {
			return nil
		}
		_ = conn.Close()
		return errors.New("still listening on " + opts.ListenAddress)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runProxy(t, ctx, opts)
	if _, err := cs.CoreV1().ConfigMaps("team-1-prod").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the operator, with the kubeconfig it read before the restart: %v", err)
	}
}
