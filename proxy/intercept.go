package proxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Files of the in-cluster interception (Environment and Iptables): what the
// proxy keeps to itself (InterceptionState) and what it writes for the
// operator (ServiceAccountFiles).
const (
	// The proxy's CA and the operator's client token, kept in a directory
	// only the proxy mounts (an emptyDir in memory), so that a restarted
	// proxy serves under the CA and takes the token the operator already
	// holds.
	caCertFile      = "ca.crt"
	caKeyFile       = "ca.key"
	clientTokenFile = "client-token"
	// The files rest.InClusterConfig and controller-runtime read from
	// /var/run/secrets/kubernetes.io/serviceaccount: the CA bundle that
	// verifies the server, the bearer token, the pod's namespace.
	saCAFile        = "ca.crt"
	saTokenFile     = "token"
	saNamespaceFile = "namespace"
)

// Lifetimes of the interception certificates. The CA outlives any pod; the
// serving certificate's key never leaves the proxy's memory, and a new one
// is made when a third of its life is left.
const (
	interceptionCALifetime      = 10 * 365 * 24 * time.Hour
	interceptionServingLifetime = 365 * 24 * time.Hour
)

// InterceptionState is what the proxy of an in-cluster interception keeps:
// its CA, which the operator's CA bundle holds, and the client token the
// operator sends as its bearer token.
type InterceptionState struct {
	CA          *x509.Certificate
	caKey       *ecdsa.PrivateKey
	CAPEM       []byte
	ClientToken string
}

// LoadInterceptionState reads the CA and client token from dir, or makes
// them and writes them there (owner-only files) when dir has none.
// Anything else — one file without the others, a file that does not parse
// — is an error: the proxy then stops rather than serve under a CA the
// operator may not trust.
func LoadInterceptionState(dir string) (*InterceptionState, error) {
	certPEM, certErr := os.ReadFile(filepath.Join(dir, caCertFile))
	keyPEM, keyErr := os.ReadFile(filepath.Join(dir, caKeyFile))
	token, tokenErr := os.ReadFile(filepath.Join(dir, clientTokenFile))
	missing := 0
	for _, err := range []error{certErr, keyErr, tokenErr} {
		switch {
		case errors.Is(err, os.ErrNotExist):
			missing++
		case err != nil:
			return nil, fmt.Errorf("reading the proxy's interception state in %s: %w", dir, err)
		}
	}
	switch missing {
	case 0:
		return parseInterceptionState(certPEM, keyPEM, string(token))
	case 3:
		return newInterceptionState(dir)
	default:
		return nil, fmt.Errorf("the proxy's interception state in %s is incomplete (%s, %s and %s go together): empty the directory (restart the pod) to make new ones", dir, caCertFile, caKeyFile, clientTokenFile)
	}
}

func parseInterceptionState(certPEM, keyPEM []byte, token string) (*InterceptionState, error) {
	certBlock, _ := pem.Decode(certPEM)
	keyBlock, _ := pem.Decode(keyPEM)
	if certBlock == nil || keyBlock == nil || token == "" {
		return nil, errors.New("the proxy's interception state does not parse: restart the pod to make a new one")
	}
	ca, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the proxy's interception CA: %w", err)
	}
	key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the proxy's interception CA key: %w", err)
	}
	return &InterceptionState{CA: ca, caKey: key, CAPEM: certPEM, ClientToken: token}, nil
}

func newInterceptionState(dir string) (*InterceptionState, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	template := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "ctrlmesh-proxy interception CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(interceptionCALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("making the proxy's interception CA: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	token, err := newClientToken()
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	// The key and the token first: a CA certificate alone is refused at the
	// next start.
	for _, f := range []struct {
		name string
		data []byte
	}{{caKeyFile, keyPEM}, {clientTokenFile, []byte(token)}, {caCertFile, certPEM}} {
		if err := writeAtomic(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return parseInterceptionState(certPEM, keyPEM, token)
}

// WriteServiceAccountFiles writes, into dir, what rest.InClusterConfig
// reads from the service-account directory: the proxy's CA as ca.crt, the
// client token as token, and namespace. dir is mounted read-only in the
// operator containers at /var/run/secrets/kubernetes.io/serviceaccount;
// the proxy writes it before it reports ready, and the kubelet starts the
// operator containers after that.
func (s *InterceptionState) WriteServiceAccountFiles(dir, namespace string) error {
	if namespace == "" {
		return errors.New("the pod's namespace is needed for the operator's service-account directory")
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{saCAFile, s.CAPEM}, {saTokenFile, []byte(s.ClientToken)}, {saNamespaceFile, []byte(namespace)}} {
		if err := writeAtomic(filepath.Join(dir, f.name), f.data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// TLSConfig serves certificates signed by the CA for names (IP addresses
// or DNS names: what the operator dials), each made in memory.
func (s *InterceptionState) TLSConfig(names []string) (*tls.Config, error) {
	if len(names) == 0 {
		return nil, errors.New("the proxy's serving certificate needs the names the operator dials")
	}
	var mu sync.Mutex
	var current *tls.Certificate
	var renewAt time.Time
	get := func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		if current == nil || time.Now().After(renewAt) {
			cert, notAfter, err := s.serving(names)
			if err != nil {
				return nil, err
			}
			current = cert
			renewAt = notAfter.Add(-interceptionServingLifetime / 3)
		}
		return current, nil
	}
	// Made now, so that a bad name fails the start, not the first request.
	if _, err := get(nil); err != nil {
		return nil, err
	}
	// HTTP/1.1, as over the kubeconfig's plain HTTP: upgrades (exec,
	// port-forward) pass only over it, and each watch gets a connection.
	return &tls.Config{GetCertificate: get, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}, nil
}

// serving makes a serving certificate for names.
func (s *InterceptionState) serving(names []string) (*tls.Certificate, time.Time, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, time.Time{}, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, time.Time{}, err
	}
	now := time.Now()
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "ctrlmesh-proxy"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(interceptionServingLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			template.IPAddresses = append(template.IPAddresses, ip)
		} else if n != "" {
			template.DNSNames = append(template.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, template, s.CA, &key.PublicKey, s.caKey)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("making the proxy's serving certificate for %v: %w", names, err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, template.NotAfter, nil
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// writeAtomic writes data to path through a temporary file renamed over
// it, so that a reader never sees half a file.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	_, writeErr := tmp.Write(data)
	closeErr := tmp.Close()
	if err := errors.Join(writeErr, closeErr, os.Chmod(tmp.Name(), mode)); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
