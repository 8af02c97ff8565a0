package certs

import (
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-io/pulse/test/testpki"
)

// TestCAFileIsReadAtEachHandshake: the agent read its CA file once,
// when a stream started, and gave up for good if it was missing: an agent
// whose CA is the aggregator's managed one (a ConfigMap the aggregator
// writes after it starts, mounted optional) never connected, and a renewed
// CA needed a restart. The file is now read at each handshake: missing, the
// handshake fails saying so; once there, it is trusted; replaced (a new
// CA), the new one is. A certificate for another name is refused.
func TestCAFileIsReadAtEachHandshake(t *testing.T) {
	dir := t.TempDir()
	caPath := filepath.Join(dir, "ca.crt")
	serve := func(ca *testpki.CA) string {
		crt, key := ca.Issue(t, "pulse-aggregator", 1, x509.ExtKeyUsageServerAuth)
		pair, err := tls.X509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.(*tls.Conn).Handshake()
				_ = c.Close()
			}
		}()
		return ln.Addr().String()
	}
	dial := func(addr, name string) error {
		f := &CAFile{Path: caPath, Flag: "--aggregator-ca-file", Name: name}
		c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: name, MinVersion: tls.VersionTLS12,
			InsecureSkipVerify: true, VerifyConnection: f.Verify}) //nolint:gosec // verified by f.Verify, the code under test
		if err == nil {
			_ = c.Close()
		}
		return err
	}
	first, second := testpki.NewCA(t), testpki.NewCA(t)
	addr := serve(first)
	if err := dial(addr, "localhost"); err == nil || !strings.Contains(err.Error(), "read --aggregator-ca-file") {
		t.Fatalf("no CA file yet: %v, want the handshake refused, saying why", err)
	}
	testpki.Write(t, dir, map[string][]byte{"ca.crt": first.PEM}, "ca.crt")
	if err := dial(addr, "localhost"); err != nil {
		t.Fatalf("the CA published: %v", err)
	}
	if err := dial(addr, "pulse-aggregator-ingest.other.svc"); err == nil {
		t.Fatal("a certificate for another name was trusted")
	}
	if err := dial(serve(second), "localhost"); err == nil {
		t.Fatal("a certificate of another CA was trusted")
	}
	// The CA renewed: the new file, with the new CA, is read (its size
	// differs too: two writes within one test may share a time).
	testpki.Write(t, dir, map[string][]byte{"ca.crt": append(second.PEM, '\n')}, "ca.crt")
	if err := dial(serve(second), "localhost"); err != nil {
		t.Fatalf("the renewed CA: %v", err)
	}
}
