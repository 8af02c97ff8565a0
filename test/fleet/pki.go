package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// ingestTLS is the ingest port's TLS with --tls: a CA and a server
// certificate for 127.0.0.1 (ECDSA P-256, as the aggregator's managed
// certificates), written to the run's directory for the aggregator
// (--ingest-tls-cert-file, --ingest-tls-key-file) and a real agent
// (--aggregator-ca-file); the simulated agents trust the CA.
type ingestTLS struct {
	certFile, keyFile, caFile string
	client                    *tls.Config
}

func newIngestTLS(dir string) (*ingestTLS, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pulse-fleet-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("make the fleet's CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "pulse-aggregator"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("make the ingest certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	t := &ingestTLS{certFile: filepath.Join(dir, "ingest.crt"), keyFile: filepath.Join(dir, "ingest.key"), caFile: filepath.Join(dir, "ca.crt")}
	for path, block := range map[string]*pem.Block{t.certFile: {Type: "CERTIFICATE", Bytes: der},
		t.keyFile: {Type: "EC PRIVATE KEY", Bytes: keyDER}, t.caFile: {Type: "CERTIFICATE", Bytes: caDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return nil, err
		}
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	t.client = &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	return t, nil
}
