package webhook_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/common/expfmt"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/internal/metrics"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/proxy/webhook"
)

// answeredByAnnotation is what each operator stand-in adds, naming itself.
const answeredByAnnotation = "ctrlmesh.io/answered-by"

// testCA issues serving certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(t),
		Subject:               pkix.Name{CommonName: "webhook router test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func randomSerial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// issue returns a serving certificate and key in PEM for hosts (DNS names and
// IP addresses, in order).
func (ca *testCA) issue(t *testing.T, hosts ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(t),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// writeCertDir writes tls.crt and tls.key into dir, and ca.crt when caPEM is
// not nil (else removes it).
func writeCertDir(t *testing.T, dir string, certPEM, keyPEM, caPEM []byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ca := filepath.Join(dir, "ca.crt")
	if caPEM == nil {
		if err := os.Remove(ca); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		return
	}
	if err := os.WriteFile(ca, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
}

// standIn plays an operator's webhook server: it allows every request and
// patches the object with an annotation naming itself. On the path /fail it
// refuses with 500 and failBody, to show bodies are relayed unchanged.
type standIn struct {
	name string
	srv  *httptest.Server

	mu        sync.Mutex
	forwarded []string // ForwardedHeader of each request received
}

const failBody = "stand-in refuses: \x00 not even JSON"

func startStandIn(t *testing.T, name string, certPEM, keyPEM []byte) *standIn {
	t.Helper()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	s := &standIn{name: name}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	return s
}

func (s *standIn) port() int { return s.srv.Listener.Addr().(*net.TCPAddr).Port }

func (s *standIn) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.forwarded...)
}

func (s *standIn) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.forwarded = append(s.forwarded, r.Header.Get(webhook.ForwardedHeader))
	s.mu.Unlock()
	if r.URL.Path == "/fail" {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, failBody)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("stand-in %s: bad review: %v", s.name, err), http.StatusBadRequest)
		return
	}
	var obj metav1.PartialObjectMetadata
	var patch []map[string]any
	if len(review.Request.Object.Raw) > 0 {
		if err := json.Unmarshal(review.Request.Object.Raw, &obj); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	if obj.Annotations == nil {
		patch = append(patch, map[string]any{"op": "add", "path": "/metadata/annotations", "value": map[string]string{}})
	}
	patch = append(patch, map[string]any{"op": "add", "path": "/metadata/annotations/" + strings.ReplaceAll(answeredByAnnotation, "/", "~1"), "value": s.name})
	patchJSON, _ := json.Marshal(patch)
	pt := admissionv1.PatchTypeJSONPatch
	review.Response = &admissionv1.AdmissionResponse{
		UID:              review.Request.UID,
		Allowed:          true,
		PatchType:        &pt,
		Patch:            patchJSON,
		AuditAnnotations: map[string]string{"answered-by": s.name},
	}
	review.Request = nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}

// answeredBy decodes an admission response and returns the stand-in that
// answered; it fails unless the response allows the request it answers.
func answeredBy(body []byte, uid types.UID) (string, error) {
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return "", err
	}
	if review.Response == nil || review.Response.UID != uid || !review.Response.Allowed {
		return "", fmt.Errorf("not an allowing response to %s: %s", uid, body)
	}
	return review.Response.AuditAnnotations["answered-by"], nil
}

// router is one pod's webhook router on 127.0.0.1, with rules the test sets.
type router struct {
	pod      string
	listener net.Listener
	snap     atomic.Pointer[rules.Snapshot]
	refusal  atomic.Pointer[string]
	registry *metrics.Registry
}

func listenRouter(t *testing.T, pod string) *router {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return &router{pod: pod, listener: l, registry: metrics.NewRegistry()}
}

func (r *router) addr() string { return r.listener.Addr().String() }

// serve starts the router; it stops when the test ends.
func (r *router) serve(t *testing.T, opts webhook.Options) {
	t.Helper()
	opts.Rules = func() (*rules.Snapshot, string) {
		if refusal := r.refusal.Load(); refusal != nil {
			return r.snap.Load(), *refusal
		}
		return r.snap.Load(), ""
	}
	opts.Registry = r.registry
	opts.Log = testr.NewWithOptions(t, testr.Options{Verbosity: 1})
	rt, err := webhook.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Serve(ctx, r.listener) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router %s: %v", r.pod, err)
		}
	})
}

// outcome reads the router's request counter for one outcome.
func (r *router) outcome(t *testing.T, outcome string) float64 {
	t.Helper()
	var text bytes.Buffer
	r.registry.WritePrometheus(&text)
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(&text)
	if err != nil {
		t.Fatal(err)
	}
	if f := families["ctrlmesh_proxy_webhook_requests_total"]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("router %s has no %q outcome counter", r.pod, outcome)
	return 0
}

// namespaceIn returns a namespace name, with prefix, whose bucket is in
// [first, last].
func namespaceIn(prefix string, first, last int) string {
	space := sharding.MustSpace(32)
	for i := 0; ; i++ {
		ns := fmt.Sprintf("%s-%d", prefix, i)
		if b := space.Bucket(ns); b >= first && b <= last {
			return ns
		}
	}
}

// twoShards is the rules of the tests: shard a (pod-a) serves buckets 0-15,
// shard b (pod-b) 16-31; routers are reached at the addresses given.
func twoShards(certDir, addrA, addrB string) *ctrlmeshv1alpha1.ShardRoute {
	return &ctrlmeshv1alpha1.ShardRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "operators", Name: "op"},
		Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			Cluster:           "c",
			RoutingGeneration: 1,
			RulesHash:         "h1",
			Scope:             ctrlmeshv1alpha1.ScopePerCluster,
			Buckets:           32,
			Webhook:           &ctrlmeshv1alpha1.WebhookConfig{CertDir: certDir},
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}},
			}}},
			Shards: []ctrlmeshv1alpha1.RouteShard{
				{ID: "a", Buckets: "0-15", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "pod-a", Address: addrA}}},
				{ID: "b", Buckets: "16-31", Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "pod-b", Address: addrB}}},
			},
		},
	}
}

// compileFor compiles route for pod with the pod's own operator port: in
// tests every operator stand-in listens on its own loopback port.
func compileFor(t *testing.T, route *ctrlmeshv1alpha1.ShardRoute, pod string, operatorPort int, scopes rules.Scopes) *rules.Snapshot {
	t.Helper()
	route = route.DeepCopy()
	if route.Spec.Webhook != nil {
		route.Spec.Webhook.Port = int32(operatorPort)
	}
	snap, err := rules.Compile(route, pod, rules.ModeLabel, scopes)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// reviewFor is an admission.k8s.io/v1 review of a ConfigMap creation.
func reviewFor(t *testing.T, uid types.UID, namespace string) []byte {
	t.Helper()
	return mustJSON(t, admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       uid,
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
			Namespace: namespace,
			Name:      "cm",
			Operation: admissionv1.Create,
		},
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// post sends body to the router at addr and returns status and body.
func post(t *testing.T, client *http.Client, addr, path string, body []byte, header http.Header) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "https://"+addr+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, got
}

// clientTrusting is an HTTPS client that trusts ca, as kube-apiserver trusts
// a webhook's caBundle.
func clientTrusting(ca *testCA) *http.Client {
	return &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool()}, DisableKeepAlives: true},
	}
}

// deadAddress is a loopback address nothing listens on.
func deadAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}
