package proxy_test

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
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
