package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// Files of the operator's certificate directory. tls.crt and tls.key are
// controller-runtime's defaults; ca.crt is optional (cert-manager writes it).
const (
	certFile = "tls.crt"
	keyFile  = "tls.key"
	caFile   = "ca.crt"
)

// material is one load of the operator's certificate directory: what the
// router serves, and the transport that verifies the operator and peers.
//
// Verification: every pod of one operator serves the same certificate (they
// sit behind one Service), so the router verifies the local operator and its
// peers the way kube-apiserver verifies the Service: the presented chain must
// lead to a trusted root, and be valid for the serving certificate's own name
// (its first DNS name, else its first IP address) — not for the dialled pod
// IP, which the certificate does not name. The trusted roots are the serving
// certificate itself (a pin: only holders of the operator's key pass), the
// CA certificates bundled after it in tls.crt, and ca.crt when present: the
// last two keep pods talking while a rotated certificate reaches them at
// different times. Without a CA file the pin alone applies.
type material struct {
	dir                    string
	certPEM, keyPEM, caPEM []byte
	cert                   *tls.Certificate
	transport              *http.Transport
}

func newMaterial(dir string, certPEM, keyPEM, caPEM []byte) (*material, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parsing %s: %w", certFile, err)
		}
		cert.Leaf = leaf
	}
	var serverName string
	switch {
	case len(leaf.DNSNames) > 0:
		serverName = leaf.DNSNames[0]
	case len(leaf.IPAddresses) > 0:
		serverName = leaf.IPAddresses[0].String()
	default:
		return nil, fmt.Errorf("the certificate in %s names no DNS name or IP address to verify peers against", certFile)
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	for _, der := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("parsing the chain in %s: %w", certFile, err)
		}
		if c.IsCA {
			roots.AddCert(c)
		}
	}
	if len(caPEM) > 0 && !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		// Pod and loopback addresses: never through an HTTP proxy.
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &dialError{err: err}
			}
			return conn, nil
		},
		TLSClientConfig: &tls.Config{
			MinVersion: tls.VersionTLS12,
			RootCAs:    roots,
			ServerName: serverName,
		},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second, // the longest admission timeout
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   8,
		// Bodies are relayed byte for byte.
		DisableCompression: true,
	}
	return &material{dir: dir, certPEM: certPEM, keyPEM: keyPEM, caPEM: caPEM, cert: &cert, transport: transport}, nil
}

func (m *material) same(dir string, certPEM, keyPEM, caPEM []byte) bool {
	return m.dir == dir && bytes.Equal(m.certPEM, certPEM) && bytes.Equal(m.keyPEM, keyPEM) && bytes.Equal(m.caPEM, caPEM)
}

// dialError marks a connection that was never made: the request was not
// sent, so another pod of the shard may be tried.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// certSource loads the certificate directory on demand and re-reads it at
// most every interval, so a rotated certificate is served and trusted
// without a restart. A failed re-read keeps the last good load.
type certSource struct {
	fixedDir string
	rules    func() *rules.Snapshot
	interval time.Duration
	log      logr.Logger

	mu       sync.Mutex
	cur      *material
	checked  time.Time
	loggedAt time.Time
}

func newCertSource(fixedDir string, rules func() *rules.Snapshot, interval time.Duration, log logr.Logger) *certSource {
	return &certSource{fixedDir: fixedDir, rules: rules, interval: interval, log: log}
}

func (s *certSource) dir() (string, error) {
	if s.fixedDir != "" {
		return s.fixedDir, nil
	}
	snap := s.rules()
	if snap == nil {
		return "", errors.New("no serving certificate: the sharding rules are not loaded yet")
	}
	if snap.Route.Spec.Webhook == nil || snap.Route.Spec.Webhook.CertDir == "" {
		return "", fmt.Errorf("no serving certificate: the rules (generation %d) configure no webhook certDir", snap.Generation())
	}
	return snap.Route.Spec.Webhook.CertDir, nil
}

func (s *certSource) get() (*material, error) {
	dir, err := s.dir()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		// Rules that lost the webhook keep the last certificate: the router
		// still answers, with an error naming the cause.
		if s.cur != nil {
			return s.cur, nil
		}
		return nil, err
	}
	cur := s.cur
	if cur != nil && cur.dir != dir {
		cur = nil
	}
	now := time.Now()
	if cur != nil && now.Sub(s.checked) < s.interval {
		return cur, nil
	}
	s.checked = now
	next, err := s.load(dir, cur)
	if err != nil {
		err = fmt.Errorf("loading the operator's serving certificate from %s: %w", dir, err)
		if now.Sub(s.loggedAt) >= s.interval {
			s.loggedAt = now
			s.log.Error(err, "webhook router certificate", "keeping", cur != nil)
		}
		if cur != nil {
			return cur, nil
		}
		return nil, err
	}
	if next != cur {
		if s.cur != nil {
			s.cur.transport.CloseIdleConnections()
		}
		s.cur = next
		s.log.Info("webhook router certificate loaded", "dir", dir, "subject", next.cert.Leaf.Subject.String(),
			"notAfter", next.cert.Leaf.NotAfter, "peerName", next.transport.TLSClientConfig.ServerName)
	}
	return next, nil
}

// load reads dir, returning cur when nothing changed.
func (s *certSource) load(dir string, cur *material) (*material, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, certFile))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, keyFile))
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, caFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if cur != nil && cur.same(dir, certPEM, keyPEM, caPEM) {
		return cur, nil
	}
	return newMaterial(dir, certPEM, keyPEM, caPEM)
}

func (s *certSource) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		s.cur.transport.CloseIdleConnections()
	}
}
