package webhook_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
	"github.com/ctrlmesh/ctrlmesh/proxy/webhook"
)

// TestOutboundVerification puts operators with various certificates behind a
// router: only one serving the router's own certificate, or one of the same
// CA for the same name when the CA is known, is trusted.
func TestOutboundVerification(t *testing.T) {
	ca := newTestCA(t)
	otherCA := newTestCA(t)
	names := []string{"webhook.test.svc", "127.0.0.1"}
	nsA := namespaceIn("team-a", 0, 15)

	cases := []struct {
		name string
		// dir writes the router's certificate directory and returns what the
		// operator serves.
		dir    func(dir string) (operatorCert, operatorKey []byte)
		wantOK bool
	}{
		{name: "same certificate", wantOK: true, dir: func(dir string) ([]byte, []byte) {
			c, k := ca.issue(t, names...)
			writeCertDir(t, dir, c, k, nil)
			return c, k
		}},
		{name: "same names, another CA", dir: func(dir string) ([]byte, []byte) {
			c, k := ca.issue(t, names...)
			writeCertDir(t, dir, c, k, ca.pem)
			return otherCA.issue(t, names...)
		}},
		{name: "rotated certificate of the same CA, with ca.crt", wantOK: true, dir: func(dir string) ([]byte, []byte) {
			c, k := ca.issue(t, names...)
			writeCertDir(t, dir, c, k, ca.pem)
			return ca.issue(t, names...)
		}},
		{name: "rotated certificate of the same CA, CA bundled in tls.crt", wantOK: true, dir: func(dir string) ([]byte, []byte) {
			c, k := ca.issue(t, names...)
			writeCertDir(t, dir, append(c, ca.pem...), k, nil)
			return ca.issue(t, names...)
		}},
		{name: "rotated certificate of the same CA, CA unknown", dir: func(dir string) ([]byte, []byte) {
			c, k := ca.issue(t, names...)
			writeCertDir(t, dir, c, k, nil)
			return ca.issue(t, names...)
		}},
		{name: "same CA, another service's name", dir: func(dir string) ([]byte, []byte) {
			c, k := ca.issue(t, names...)
			writeCertDir(t, dir, c, k, ca.pem)
			return ca.issue(t, "other.test.svc", "127.0.0.1")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			opCert, opKey := tc.dir(dir)
			op := startStandIn(t, "pod-a", opCert, opKey)
			r := listenRouter(t, "pod-a")
			r.snap.Store(compileFor(t, twoShards(dir, r.addr(), "127.0.0.1:1"), "pod-a", op.port(), staticScopes()))
			r.serve(t, webhook.Options{})

			code, body := post(t, clientTrusting(ca), r.addr(), "/mutate", reviewFor(t, "u1", nsA), nil)
			if tc.wantOK {
				if code != http.StatusOK {
					t.Fatalf("status %d: %s", code, body)
				}
				if by, err := answeredBy(body, "u1"); err != nil || by != "pod-a" {
					t.Fatalf("answered by %q: %v", by, err)
				}
				return
			}
			if code != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503: %s", code, body)
			}
			assertRouterFailure(t, body, http.StatusServiceUnavailable, "certificate")
			if n := len(op.requests()); n != 0 {
				t.Errorf("the untrusted operator received %d requests", n)
			}
		})
	}
}

// TestCertificateReload rotates the certificate files under a running
// router: it then serves the new certificate, and trusts an operator serving
// it, without ca.crt (the pin follows the files).
func TestCertificateReload(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	oldCert, oldKey := ca.issue(t, "webhook.test.svc", "127.0.0.1")
	writeCertDir(t, dir, oldCert, oldKey, nil)
	newCert, newKey := ca.issue(t, "webhook.test.svc", "127.0.0.1")
	newSerial := serialOf(t, newCert)

	op := startStandIn(t, "pod-a", newCert, newKey)
	r := listenRouter(t, "pod-a")
	r.snap.Store(compileFor(t, twoShards(dir, r.addr(), "127.0.0.1:1"), "pod-a", op.port(), staticScopes()))
	r.serve(t, webhook.Options{CertCheckInterval: 50 * time.Millisecond})
	client := clientTrusting(ca)
	nsA := namespaceIn("team-a", 0, 15)

	if got := servedSerial(t, ca, r.addr()); got.Cmp(serialOf(t, oldCert)) != 0 {
		t.Fatalf("serving serial %v, want the first certificate's", got)
	}
	if code, body := post(t, client, r.addr(), "/mutate", reviewFor(t, "u1", nsA), nil); code != http.StatusServiceUnavailable {
		t.Fatalf("an operator with a certificate the router does not hold was trusted: %d %s", code, body)
	}

	writeCertDir(t, dir, newCert, newKey, nil)
	deadline := time.Now().Add(30 * time.Second)
	for servedSerial(t, ca, r.addr()).Cmp(newSerial) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the rotated certificate is not served")
		}
		time.Sleep(100 * time.Millisecond)
	}
	code, body := post(t, client, r.addr(), "/mutate", reviewFor(t, "u2", nsA), nil)
	if code != http.StatusOK {
		t.Fatalf("after rotation: %d %s", code, body)
	}
	if by, err := answeredBy(body, "u2"); err != nil || by != "pod-a" {
		t.Fatalf("answered by %q: %v", by, err)
	}
}

// TestNoCertificateBeforeRules: without rules the router has no certificate
// directory and refuses the handshake, a failure to the API server; with
// Options.CertDir it answers 503.
func TestNoCertificateBeforeRules(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	c, k := ca.issue(t, "webhook.test.svc", "127.0.0.1")
	writeCertDir(t, dir, c, k, nil)
	review := reviewFor(t, types.UID("u1"), "default")

	fromRules := listenRouter(t, "pod-a")
	fromRules.serve(t, webhook.Options{})
	resp, err := clientTrusting(ca).Post("https://"+fromRules.addr()+"/mutate", "application/json", bytes.NewReader(review))
	if err == nil {
		_ = resp.Body.Close()
		t.Fatalf("a router without rules answered %d", resp.StatusCode)
	}

	fixed := listenRouter(t, "pod-a")
	fixed.serve(t, webhook.Options{CertDir: dir})
	code, body := post(t, clientTrusting(ca), fixed.addr(), "/mutate", review, nil)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503: %s", code, body)
	}
	assertRouterFailure(t, body, http.StatusServiceUnavailable, "not loaded")
}

func serialOf(t *testing.T, certPEM []byte) *big.Int {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert.SerialNumber
}

// servedSerial is the serial of the certificate the router serves now.
func servedSerial(t *testing.T, ca *testCA, addr string) *big.Int {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.pool(), ServerName: "webhook.test.svc"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber
}

// TestStopsCleanlyWithAConnectionOpen: a router told to stop while a
// connection that never finished its handshake is open (as the API
// server's client leaves one) stops without an error, closing it after its
// grace; it returned "context deadline exceeded" instead.
func TestStopsCleanlyWithAConnectionOpen(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	c, k := ca.issue(t, "webhook.test.svc", "127.0.0.1")
	writeCertDir(t, dir, c, k, nil)
	r := listenRouter(t, "pod-a")
	rt, err := webhook.New(webhook.Options{CertDir: dir, Registry: r.registry, Log: testr.New(t),
		Rules: func() (*rules.Snapshot, string) { return nil, "" }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rt.Serve(ctx, r.listener) }()
	conn, err := net.Dial("tcp", r.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	// Served: a request on another connection is answered.
	code, body := post(t, clientTrusting(ca), r.addr(), "/mutate", reviewFor(t, types.UID("u1"), "default"), nil)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503 (no rules): %s", code, body)
	}
	stopped := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the router stopped with %v, %v after it was told to", err, time.Since(stopped))
		}
		t.Logf("stopped %v after it was told to", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("the router did not stop within 30s")
	}
}
