// Package certs serves TLS certificates to pulse's gRPC servers.
package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
)

// Files serves a certificate, its key and (optionally) the CA that client
// certificates must chain to, from files, re-read when any of them changes
// (as cert-manager rotates a mounted Secret): each handshake takes the
// current pair, so a renewal needs no restart. With a client CA, client
// certificates are required; without one, none is asked for. With
// ClientName too, a client certificate must also name it (its Common Name
// or a DNS name): a CA that signs others' certificates besides KEDA's (a
// cluster's shared issuer) signed every tenant's, each then taken for
// KEDA's.
type Files struct {
	CertFile, KeyFile, ClientCAFile, ClientName string

	mu      sync.Mutex
	stamp   string // sizes and modification times of the three files
	current *tls.Config
}

// NewFiles loads the files once, so that a bad file is an error at start.
func NewFiles(certFile, keyFile, clientCAFile string) (*Files, error) {
	f := &Files{CertFile: certFile, KeyFile: keyFile, ClientCAFile: clientCAFile}
	if _, err := f.config(); err != nil {
		return nil, err
	}
	return f, nil
}

// ServerConfig is a tls.Config whose certificate and client CAs are read
// per handshake.
func (f *Files) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return f.config()
		},
	}
}

// config returns the current per-connection config, reloading the files
// when they changed. A reload that fails keeps serving the last good pair.
func (f *Files) config() (*tls.Config, error) {
	stamp, err := f.stampNow()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil && stamp == f.stamp && f.current != nil {
		return f.current, nil
	}
	cfg, lerr := f.load()
	if lerr != nil || err != nil {
		if f.current != nil {
			return f.current, nil // keep the last good pair while files are being replaced
		}
		return nil, errors.Join(err, lerr)
	}
	f.current, f.stamp = cfg, stamp
	return cfg, nil
}

func (f *Files) stampNow() (string, error) {
	s := ""
	for _, p := range []string{f.CertFile, f.KeyFile, f.ClientCAFile} {
		if p == "" {
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("tls file: %w", err)
		}
		s += fmt.Sprintf("%s:%d:%d;", p, st.Size(), st.ModTime().UnixNano())
	}
	return s, nil
}

func (f *Files) load() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s: %w", f.CertFile, err)
	}
	if f.ClientCAFile == "" {
		return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}, nil
	}
	ca, err := os.ReadFile(f.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("read client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("client CA %s holds no PEM certificate", f.ClientCAFile)
	}
	return &tls.Config{
		MinVersion:       tls.VersionTLS12,
		Certificates:     []tls.Certificate{pair},
		ClientCAs:        pool,
		ClientAuth:       tls.RequireAndVerifyClientCert,
		VerifyConnection: f.verifyClientName,
	}, nil
}

// verifyClientName refuses a verified client certificate that does not
// name f.ClientName, when set.
func (f *Files) verifyClientName(cs tls.ConnectionState) error {
	if f.ClientName == "" || len(cs.PeerCertificates) == 0 {
		return nil // no certificate is refused by the handshake itself
	}
	leaf := cs.PeerCertificates[0]
	if leaf.Subject.CommonName == f.ClientName || slices.Contains(leaf.DNSNames, f.ClientName) {
		return nil
	}
	return fmt.Errorf("client certificate of %q (DNS names %q): not %q, the name asked of a client", leaf.Subject.CommonName, leaf.DNSNames, f.ClientName)
}
