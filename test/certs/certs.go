// Package certs makes throwaway TLS material for tests: a self-signed CA and
// a serving certificate it signed, laid out as controller-runtime's webhook
// server expects them.
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

// File names WriteServing writes, those controller-runtime's webhook server
// reads by default.
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
	if len(hosts) == 0 {
		return nil, errors.New("certs: no hosts to serve")
	}
	now := time.Now()

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: generating the CA key: %w", err)
	}
	caSerial, err := serial()
	if err != nil {
		return nil, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          caSerial,
		Subject:               pkix.Name{CommonName: "ctrlmesh test CA"},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("certs: signing the CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("certs: parsing the CA certificate: %w", err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: generating the serving key: %w", err)
	}
	servingSerial, err := serial()
	if err != nil {
		return nil, err
	}
	template := &x509.Certificate{
		SerialNumber: servingSerial,
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(validFor),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			template.IPAddresses = append(template.IPAddresses, ip)
		} else {
			template.DNSNames = append(template.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("certs: signing the serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certs: encoding the serving key: %w", err)
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, CertFile), certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := os.WriteFile(filepath.Join(dir, KeyFile), keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

// serial returns a random 128-bit serial number.
func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("certs: generating a serial number: %w", err)
	}
	return n, nil
}
