package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/pulse-io/pulse/test/testpki"
)

// serve runs a gRPC health server with f's TLS on loopback.
func serve(t *testing.T, f *Files) string {
	t.Helper()
	return serveConfig(t, f.ServerConfig())
}

func serveConfig(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// check calls the health service as a client with cfg and returns the
// serial of the server's certificate.
func check(t *testing.T, addr string, cfg *tls.Config) (int64, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return 0, err
	}
	return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber.Int64(), nil
}

func TestMutualTLSFromFilesReloadedWithoutRestart(t *testing.T) {
	ca := testpki.NewCA(t)
	dir := t.TempDir()
	srvCert, srvKey := ca.Issue(t, "pulse-aggregator", 10, x509.ExtKeyUsageServerAuth)
	paths := testpki.Write(t, dir, map[string][]byte{"tls.crt": srvCert, "tls.key": srvKey, "ca.crt": ca.PEM}, "tls.crt", "tls.key", "ca.crt")
	f, err := NewFiles(paths[0], paths[1], paths[2])
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, f)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)

	// No client certificate: the handshake is refused.
	if _, err := check(t, addr, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	// A certificate of another CA: refused.
	other := testpki.NewCA(t)
	oc, ok := other.Issue(t, "keda", 2, x509.ExtKeyUsageClientAuth)
	bad, _ := tls.X509KeyPair(oc, ok)
	if _, err := check(t, addr, &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{bad}, MinVersion: tls.VersionTLS12}); err == nil {
		t.Fatal("a client certificate of another CA was accepted")
	}
	cc, ck := ca.Issue(t, "keda", 3, x509.ExtKeyUsageClientAuth)
	client, _ := tls.X509KeyPair(cc, ck)
	good := &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{client}, MinVersion: tls.VersionTLS12}
	serial, err := check(t, addr, good)
	if err != nil || serial != 10 {
		t.Fatalf("with a client certificate: serial %d, %v", serial, err)
	}

	// The certificate is renewed on disk: the next handshake serves it.
	newCert, newKey := ca.Issue(t, "pulse-aggregator", 11, x509.ExtKeyUsageServerAuth)
	testpki.Write(t, dir, map[string][]byte{"tls.key": newKey, "tls.crt": newCert}, "tls.key", "tls.crt")
	future := time.Now().Add(time.Second)
	for _, p := range paths[:2] {
		_ = os.Chtimes(p, future, future) // a distinct modification time, whatever the clock's grain
	}
	if serial, err := check(t, addr, good); err != nil || serial != 11 {
		t.Fatalf("after renewal: serial %d, %v; want 11", serial, err)
	}

	// A half-written pair keeps the last good one in service.
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if serial, err := check(t, addr, good); err != nil || serial != 11 {
		t.Fatalf("with a broken key on disk: serial %d, %v; want the last good 11", serial, err)
	}
}

func TestBadFilesAreAnErrorAtStart(t *testing.T) {
	dir := t.TempDir()
	paths := testpki.Write(t, dir, map[string][]byte{"a": []byte("x"), "b": []byte("y"), "c": []byte("z")}, "a", "b", "c")
	if _, err := NewFiles(paths[0], paths[1], paths[2]); err == nil {
		t.Fatal("accepted")
	}
	if _, err := NewFiles(filepath.Join(dir, "none"), paths[1], paths[2]); err == nil {
		t.Fatal("accepted a missing file")
	}
}

// TestAClientNameNarrowsTheCAsCertificates: with a client CA that signs
// others' certificates besides KEDA's (a cluster's shared issuer), every
// certificate it signed was taken for KEDA's, served any namespace's
// triggers and out of the per-address bound (found in a review,
// 2026-12-07). With ClientName a client certificate must also name it.
func TestAClientNameNarrowsTheCAsCertificates(t *testing.T) {
	ca := testpki.NewCA(t)
	srvCert, srvKey := ca.Issue(t, "pulse-aggregator", 10, x509.ExtKeyUsageServerAuth)
	paths := testpki.Write(t, t.TempDir(), map[string][]byte{"tls.crt": srvCert, "tls.key": srvKey, "ca.crt": ca.PEM}, "tls.crt", "tls.key", "ca.crt")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	as := func(cn string) *tls.Config {
		c, k := ca.Issue(t, cn, 3, x509.ExtKeyUsageClientAuth)
		pair, _ := tls.X509KeyPair(c, k)
		return &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	}
	for _, name := range []string{"", "keda-operator"} {
		f, err := NewFiles(paths[0], paths[1], paths[2])
		if err != nil {
			t.Fatal(err)
		}
		f.ClientName = name
		addr := serve(t, f)
		if _, err := check(t, addr, as("keda-operator")); err != nil {
			t.Errorf("client name %q: KEDA's certificate refused: %v", name, err)
		}
		_, err = check(t, addr, as("tenant-a-workload"))
		if name != "" && err == nil {
			t.Errorf("client name %q: a tenant's certificate of the same CA was served", name)
		}
		if name == "" && err != nil {
			t.Errorf("no client name: a certificate of the CA refused: %v", err)
		}
	}
}
