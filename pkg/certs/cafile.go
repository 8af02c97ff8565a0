package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// CAFile is a CA certificate file that a client trusts, parsed again when
// its size or modification time changes: a CA published after the client
// starts (the aggregator's managed CA, mounted from a ConfigMap) or
// renewed later is trusted without a restart.
type CAFile struct {
	// Path is the file; Flag names it in errors (--aggregator-ca-file).
	Path, Flag string
	// Name is the name the server's certificate must carry; "": the
	// connection's server name.
	Name string

	mu   sync.Mutex
	mod  time.Time
	size int64
	pool *x509.CertPool
}

// ClientConfig is a TLS client configuration for serverName whose chain is
// verified in VerifyConnection against the file as it is at each handshake,
// and whose name is checked as the standard check does.
func (c *CAFile) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		ServerName: serverName, MinVersion: tls.VersionTLS12,
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection against the CA file
		VerifyConnection:   c.Verify,
	}
}

// roots returns the file's certificates as a pool.
func (c *CAFile) roots() (*x509.CertPool, error) {
	fi, err := os.Stat(c.Path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", c.Flag, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pool != nil && fi.ModTime().Equal(c.mod) && fi.Size() == c.size {
		return c.pool, nil
	}
	pem, err := os.ReadFile(c.Path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", c.Flag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s holds no PEM certificate", c.Flag, c.Path)
	}
	c.pool, c.mod, c.size = pool, fi.ModTime(), fi.Size()
	return pool, nil
}

// Verify checks the server's chain against the CA file and its name
// against the one the connection asked for, as crypto/tls would.
func (c *CAFile) Verify(cs tls.ConnectionState) error {
	roots, err := c.roots()
	if err != nil {
		return err
	}
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the server sent no certificate")
	}
	name := c.Name
	if name == "" {
		name = cs.ServerName
	}
	if name == "" {
		return errors.New("no server name to check the server's certificate against")
	}
	opts := x509.VerifyOptions{Roots: roots, DNSName: name, Intermediates: x509.NewCertPool()}
	for _, ic := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(ic)
	}
	_, err = cs.PeerCertificates[0].Verify(opts)
	return err
}
