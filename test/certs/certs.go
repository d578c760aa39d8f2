// Package certs makes throwaway TLS material for tests: self-signed CAs and
// the serving and client certificates they sign, laid out as
// controller-runtime's webhook server and Kubernetes API servers read them.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// File names WriteServing and WriteClient write, those controller-runtime's
// webhook server reads by default.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// Validity of the certificates: from an hour ago (clock skew) for a day.
const (
	backdate = time.Hour
	validFor = 24 * time.Hour
)

// WriteServing generates a self-signed CA and a serving certificate for
// hosts (IP addresses and DNS names, such as "127.0.0.1" and "localhost"),
// writes the certificate to dir/tls.crt and its key to dir/tls.key (mode
// 0600), creating dir if needed, and returns the CA certificate in PEM, for
// a webhook configuration's caBundle.
func WriteServing(dir string, hosts ...string) (caPEM []byte, err error) {
	ca, err := NewCA("ctrlmesh test CA")
	if err != nil {
		return nil, err
	}
	if err := ca.WriteServing(dir, hosts...); err != nil {
		return nil, err
	}
	return ca.PEM, nil
}

// CA is a self-signed certificate authority that signs serving and client
// certificates, for components that must trust one another (an API server
// and its aggregated API servers, say).
type CA struct {
	// PEM is the CA certificate, for a caBundle or a --client-ca-file.
	PEM []byte

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA generates a self-signed CA named commonName.
func NewCA(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: generating the CA key: %w", err)
	}
	serialNumber, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	template := &x509.Certificate{
		SerialNumber:          serialNumber,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certs: signing the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: parsing the CA certificate: %w", err)
	}
	return &CA{PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}, nil
}

// WriteServing signs a serving certificate for hosts (IP addresses and DNS
// names) and writes it and its key to dir/tls.crt and dir/tls.key (mode
// 0600), creating dir if needed.
func (ca *CA) WriteServing(dir string, hosts ...string) error {
	if len(hosts) == 0 {
		return errors.New("certs: no hosts to serve")
	}
	template := &x509.Certificate{
		Subject:     pkix.Name{CommonName: hosts[0]},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			template.IPAddresses = append(template.IPAddresses, ip)
		} else {
			template.DNSNames = append(template.DNSNames, h)
		}
	}
	return ca.write(dir, template)
}

// WriteClient signs a client certificate for user commonName in groups (a
// Kubernetes API server reads the groups from the organizations) and writes
// it and its key to dir/tls.crt and dir/tls.key (mode 0600), creating dir if
// needed.
func (ca *CA) WriteClient(dir, commonName string, groups ...string) error {
	if commonName == "" {
		return errors.New("certs: a client certificate needs a common name")
	}
	return ca.write(dir, &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName, Organization: groups},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// write signs template with a new key and writes both into dir.
func (ca *CA) write(dir string, template *x509.Certificate) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("certs: generating the key of %q: %w", template.Subject.CommonName, err)
	}
	if template.SerialNumber, err = serial(); err != nil {
		return err
	}
	now := time.Now()
	template.NotBefore, template.NotAfter = now.Add(-backdate), now.Add(validFor)
	der, err := x509.CreateCertificate(rand.Reader, template, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return fmt.Errorf("certs: signing the certificate of %q: %w", template.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("certs: encoding the key of %q: %w", template.Subject.CommonName, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, CertFile), certPEM, 0o644); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := os.WriteFile(filepath.Join(dir, KeyFile), keyPEM, 0o600); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}

// serial returns a random 128-bit serial number.
func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("certs: generating a serial number: %w", err)
	}
	return n, nil
}

// WriteFiles writes the CA's own certificate to certFile and its key to
// keyFile (mode 0600): a key pair for signing, such as the service-account
// token signer a Kubernetes API server reads.
func (ca *CA) WriteFiles(certFile, keyFile string) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return fmt.Errorf("certs: encoding the CA key: %w", err)
	}
	if err := os.WriteFile(certFile, ca.PEM, 0o644); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}
