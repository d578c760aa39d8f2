package certs_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/test/certs"
)

func TestWriteServingVerifiesForItsHosts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	caPEM, err := certs.WriteServing(dir, "127.0.0.1", "localhost", "webhook.example.svc")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("the returned CA is not PEM: %q", caPEM)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, certs.CertFile), filepath.Join(dir, certs.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		host   string
		wantOK bool
	}{
		{host: "127.0.0.1", wantOK: true},
		{host: "localhost", wantOK: true},
		{host: "webhook.example.svc", wantOK: true},
		{host: "127.0.0.2", wantOK: false},
		{host: "example.com", wantOK: false},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			_, err := leaf.Verify(x509.VerifyOptions{DNSName: tt.host, Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			if (err == nil) != tt.wantOK {
				t.Fatalf("Verify(%s) = %v, want ok=%v", tt.host, err, tt.wantOK)
			}
		})
	}

	info, err := os.Stat(filepath.Join(dir, certs.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if perm := info.Mode().Perm(); perm != 0o600 {
		t.Errorf("key file mode = %o, want 600", perm)
	}
}

// TestWriteServingServesTLS proves the files work the way the webhook server
// uses them: a TLS server with them, a client trusting only the CA.
func TestWriteServingServesTLS(t *testing.T) {
	dir := t.TempDir()
	caPEM, err := certs.WriteServing(dir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, certs.CertFile), filepath.Join(dir, certs.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "served")
	}))
	srv.Listener.Close()
	srv.Listener, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	defer srv.Close()

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != "served" {
		t.Fatalf("body = %q, want %q", body, "served")
	}

	// A second call makes a new CA: the first CA must not trust it.
	other := t.TempDir()
	if _, err := certs.WriteServing(other, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	otherPair, err := tls.LoadX509KeyPair(filepath.Join(other, certs.CertFile), filepath.Join(other, certs.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	otherLeaf, err := x509.ParseCertificate(otherPair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otherLeaf.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: pool}); err == nil {
		t.Fatal("a certificate from another call verifies against the first CA")
	}
}

func TestWriteServingNeedsHosts(t *testing.T) {
	_, err := certs.WriteServing(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "no hosts") {
		t.Fatalf("WriteServing with no hosts = %v, want an error about hosts", err)
	}
}

// TestCAWriteClient proves a client certificate is what an API server's
// --client-ca-file or --requestheader-client-ca-file accepts: it verifies
// for client auth against its CA only, and names the user and groups.
func TestCAWriteClient(t *testing.T) {
	ca, err := certs.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ca.WriteClient(dir, "front-proxy-client", "group-a", "group-b"); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, certs.CertFile), filepath.Join(dir, certs.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if leaf.Subject.CommonName != "front-proxy-client" || strings.Join(leaf.Subject.Organization, ",") != "group-a,group-b" {
		t.Errorf("subject = %v, want CN front-proxy-client in group-a and group-b", leaf.Subject)
	}
	other, err := certs.NewCA("other CA")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		ca     *certs.CA
		usage  x509.ExtKeyUsage
		wantOK bool
	}{
		{name: "client auth, its CA", ca: ca, usage: x509.ExtKeyUsageClientAuth, wantOK: true},
		{name: "server auth, its CA", ca: ca, usage: x509.ExtKeyUsageServerAuth, wantOK: false},
		{name: "client auth, another CA", ca: other, usage: x509.ExtKeyUsageClientAuth, wantOK: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(tt.ca.PEM) {
				t.Fatalf("CA PEM does not parse: %q", tt.ca.PEM)
			}
			_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{tt.usage}})
			if (err == nil) != tt.wantOK {
				t.Fatalf("Verify = %v, want ok=%v", err, tt.wantOK)
			}
		})
	}
	if err := ca.WriteClient(t.TempDir(), ""); err == nil {
		t.Error("WriteClient with no common name succeeded")
	}
}

// TestCAWriteFiles: the CA's own files are a key pair (what an API server
// reads as its service-account signer) whose certificate is the CA's.
func TestCAWriteFiles(t *testing.T) {
	ca, err := certs.NewCA("signer")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "sa.crt"), filepath.Join(dir, "sa.key")
	if err := ca.WriteFiles(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatalf("the files are not a key pair: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if !leaf.IsCA || leaf.Subject.CommonName != "signer" {
		t.Errorf("certificate: CA %v, subject %v; want the CA signer", leaf.IsCA, leaf.Subject)
	}
	info, err := os.Stat(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v, want 0600", info.Mode().Perm())
	}
}
