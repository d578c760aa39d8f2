package proxy_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// inClusterConfig is what rest.InClusterConfig makes of the proxy's
// service-account directory when KUBERNETES_SERVICE_HOST/PORT name host.
func inClusterConfig(host, dir string) *rest.Config {
	return &rest.Config{
		Host:            host,
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(dir, "ca.crt")},
		BearerTokenFile: filepath.Join(dir, "token"),
	}
}

// TestInClusterInterception: with an operator service-account directory
// the proxy serves TLS under a CA of its own, writes what
// rest.InClusterConfig reads (ca.crt, token, namespace), and serves a
// client that verifies it with that CA and sends that token; a client
// trusting the API server's CA refuses the proxy's certificate, and one
// with another token (the API server's own credentials) gets 401. A
// restarted proxy with the same state directory serves under the same CA
// and token, so the operator's configuration stays good.
func TestInClusterInterception(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	writeRules(t, rulesFile, route("t1", 1, "0-15", "16-31"))
	sa, state := filepath.Join(dir, "sa"), filepath.Join(dir, "state")
	for _, d := range []string{sa, state} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	upstream := fleet.Cluster("label").Config
	opts := proxy.Options{
		Upstream: upstream, Pod: "pod-a", RulesFile: rulesFile, RulesFileInterval: 50 * time.Millisecond, Mode: rules.ModeLabel,
		RulesNamespace: "operators", OperatorServiceAccountDir: sa, StateDir: state, ServingNames: []string{"127.0.0.1", "localhost"},
	}
	p := runProxy(t, ctx, opts)
	host := strings.Replace(p.config.Host, "http://", "https://", 1)

	ns, err := os.ReadFile(filepath.Join(sa, "namespace"))
	if err != nil || string(ns) != "operators" {
		t.Errorf("namespace file %q (%v), want operators", ns, err)
	}
	operator := inClusterConfig(host, sa)
	cs, err := kubernetes.NewForConfig(operator)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		t.Fatalf("the operator with the proxy's directory: %v", err)
	}
	if _, err := cs.CoreV1().ConfigMaps("team-1-prod").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the operator's sharded list: %v", err)
	}

	// The API server's CA does not verify the proxy.
	clusterCA := rest.CopyConfig(operator)
	clusterCA.TLSClientConfig = rest.TLSClientConfig{CAData: upstream.CAData}
	if cs, err := kubernetes.NewForConfig(clusterCA); err != nil {
		t.Fatal(err)
	} else if _, err := cs.Discovery().ServerVersion(); !errors.As(err, new(x509.UnknownAuthorityError)) && (err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority")) {
		t.Errorf("a client trusting the API server's CA: %v, want the proxy's certificate refused", err)
	}
	// Another bearer token, or none: 401, before the proxy acts.
	for name, token := range map[string]string{"the API server's credentials": upstream.BearerToken + "x", "no token": ""} {
		c := rest.CopyConfig(operator)
		c.BearerTokenFile, c.BearerToken = "", token
		cs, err := kubernetes.NewForConfig(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().ConfigMaps("team-1-prod").List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
			t.Errorf("%s: %v, want 401", name, err)
		}
	}
	// Plain HTTP is not served.
	if resp, err := http.Get(p.config.Host + "/version"); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP served: %s", resp.Status)
		}
	}

	// A restart keeps the CA and the token.
	caBefore, _ := os.ReadFile(filepath.Join(sa, "ca.crt"))
	restarted := runProxy(t, ctx, opts)
	caAfter, _ := os.ReadFile(filepath.Join(sa, "ca.crt"))
	if !bytes.Equal(caBefore, caAfter) || len(caAfter) == 0 {
		t.Error("the restarted proxy wrote another CA")
	}
	again := inClusterConfig(strings.Replace(restarted.config.Host, "http://", "https://", 1), sa)
	if cs, err := kubernetes.NewForConfig(again); err != nil {
		t.Fatal(err)
	} else if _, err := cs.Discovery().ServerVersion(); err != nil {
		t.Errorf("the operator's configuration against the restarted proxy: %v", err)
	}
}

// TestInterceptionState: the state directory is made once and read again;
// an incomplete one is refused; serving certificates name exactly what the
// operator dials.
func TestInterceptionState(t *testing.T) {
	dir := t.TempDir()
	s, err := proxy.LoadInterceptionState(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.crt", "ca.key", "client-token"} {
		info, err := os.Stat(filepath.Join(dir, f))
		if err != nil || info.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want an owner-only file", f, info, err)
		}
	}
	again, err := proxy.LoadInterceptionState(dir)
	if err != nil || !again.CA.Equal(s.CA) || again.ClientToken != s.ClientToken {
		t.Fatalf("read again: %v, same CA %v, same token %v", err, err == nil && again.CA.Equal(s.CA), err == nil && again.ClientToken == s.ClientToken)
	}
	cfg, err := s.TLSConfig([]string{"10.96.0.1", "kubernetes.default.svc"})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := cfg.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(s.CA)
	for name, ok := range map[string]bool{"10.96.0.1": true, "kubernetes.default.svc": true, "127.0.0.1": false, "10.96.0.2": false} {
		_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name})
		if (err == nil) != ok {
			t.Errorf("verifying for %s: %v, want ok=%v", name, err, ok)
		}
	}
	if _, err := s.TLSConfig(nil); err == nil {
		t.Error("a serving certificate without names")
	}
	if err := os.Remove(filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	if _, err := proxy.LoadInterceptionState(dir); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Errorf("an incomplete state: %v, want refused", err)
	}
}
