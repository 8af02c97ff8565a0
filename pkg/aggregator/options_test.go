package aggregator

import (
	"strings"
	"testing"
)

// TestAnAddressWithoutAPortIsRefused: the addresses were checked with
// net.SplitHostPort alone, which takes "host:" (no port) and ":port" (no
// host): --ingest-addr=127.0.0.1: (a chart value rendered empty) listened
// on a port the kernel chose, which no Service reaches, and
// --provision-scaler-address=:9090 wrote a scalerAddress into every
// provisioned ScaledObject that KEDA's operator dials on its own loopback.
func TestAnAddressWithoutAPortIsRefused(t *testing.T) {
	for _, c := range []struct {
		flag string
		set  func(*Options)
	}{
		{"--ingest-addr 127.0.0.1:", func(o *Options) { o.Serving.IngestAddr = "127.0.0.1:" }},
		{"--scaler-addr :", func(o *Options) { o.Serving.ScalerAddr = ":" }},
		{"--provision-scaler-address :9090", func(o *Options) {
			o.Provision.Enabled, o.Provision.ScalerAddress, o.Certs.Namespace = true, ":9090", "pulse-system"
		}},
		{"--provision-scaler-address pulse-aggregator.pulse-system.svc:", func(o *Options) {
			o.Provision.Enabled, o.Provision.ScalerAddress, o.Certs.Namespace = true, "pulse-aggregator.pulse-system.svc:", "pulse-system"
		}},
	} {
		o := NewOptions()
		c.set(o)
		if err := o.Validate(); err == nil {
			t.Errorf("%s: accepted, want refused (no port, or no host)", c.flag)
		}
	}
}

// TestAProvisionedAddressTheManagedCertificateNames: KEDA checks the
// scaler's certificate against the scalerAddress's host; with
// --manage-certs, one the certificate does not name failed every
// provisioned ScaledObject (refused at the start, as --tls-cert-file's
// case is). A wildcard names one label; an IP is taken as one.
func TestAProvisionedAddressTheManagedCertificateNames(t *testing.T) {
	for addr, ok := range map[string]bool{
		"pulse-aggregator.pulse-system.svc:9090":               true,
		"pulse-aggregator.pulse-system.svc.cluster.local:9090": false,
		"other.pulse-system.svc:9090":                          true, // the wildcard's
		"a.b.pulse-system.svc:9090":                            false,
		"10.0.0.7:9090":                                        true,
		"10.0.0.8:9090":                                        false,
	} {
		o := NewOptions()
		o.Certs.Enabled, o.Certs.Namespace = true, "pulse-system"
		o.Certs.DNSNames, o.Certs.IPs = []string{"pulse-aggregator.pulse-system.svc", "*.pulse-system.svc"}, []string{"10.0.0.7"}
		o.Provision.Enabled, o.Provision.ScalerAddress = true, addr
		err := o.Validate()
		if refused := err != nil && strings.Contains(err.Error(), "is not among the managed certificate's"); refused == ok {
			t.Errorf("%s: %v; want it taken: %v", addr, err, ok)
		}
	}
}

// TestGCPercentIsBounded: --gc-percent is Go's GC percent; a negative one
// (the GC off, the heap unbounded but for the memory limit) or a huge one
// is refused, naming the flag; 0 is Go's default.
func TestGCPercentIsBounded(t *testing.T) {
	for _, c := range []struct {
		percent int
		ok      bool
	}{{-1, false}, {0, true}, {50, true}, {10000, true}, {10001, false}} {
		o := NewOptions()
		o.Store.GCPercent = c.percent
		err := o.Validate()
		if (err == nil) != c.ok || err != nil && !strings.Contains(err.Error(), "--gc-percent") {
			t.Errorf("--gc-percent %d: %v, want accepted %v", c.percent, err, c.ok)
		}
	}
	if NewOptions().Store.GCPercent != 50 {
		t.Errorf("default --gc-percent %d, want 50", NewOptions().Store.GCPercent)
	}
}

// TestTokenReviewNeedsTLSOnTheIngestPort: --agent-auth=tokenreview on a
// plaintext ingest port started, and no stream could ever be
// authenticated: an agent sends its --token-file only over TLS (its
// --aggregator-ca-file, required with it), and a pulse-relay refuses to
// forward a stream carrying a token in plaintext (FailedPrecondition).
// Every agent was refused for ever, with nothing said at the start (the
// chart refuses the combination; the binary took it).
func TestTokenReviewNeedsTLSOnTheIngestPort(t *testing.T) {
	o := NewOptions()
	o.AgentAuth.Mode = "tokenreview"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--agent-auth=tokenreview needs TLS on the ingest port") {
		t.Errorf("--agent-auth=tokenreview on a plaintext ingest port: Validate() = %v, want it refused", err)
	}
	o.IngestTLS.CertFile, o.IngestTLS.KeyFile = "tls.crt", "tls.key"
	if err := o.Validate(); err != nil {
		t.Errorf("--agent-auth=tokenreview with --ingest-tls-cert-file: %v", err)
	}
	o.IngestTLS.CertFile, o.IngestTLS.KeyFile, o.IngestTLS.Managed = "", "", true
	o.Certs.Enabled, o.Certs.Namespace, o.Certs.DNSNames, o.Certs.CAConfigMap = true, "pulse-system", []string{"pulse-aggregator.pulse-system.svc"}, "pulse-aggregator-ca"
	if err := o.Validate(); err != nil {
		t.Errorf("--agent-auth=tokenreview with --ingest-managed-tls: %v", err)
	}
}

// TestManagedCertFlagsNeedManageCerts: --relay-cert-secret (with its
// --relay-cert-dns-name), --relay-cert-secret-retired and --ca-configmap
// are --manage-certs' and did nothing without it, silently: the relays
// waited for ever on a Secret never made, the agents on a CA ConfigMap
// never published.
func TestManagedCertFlagsNeedManageCerts(t *testing.T) {
	for _, c := range []struct {
		flag string
		set  func(*Options)
	}{
		{"--relay-cert-secret", func(o *Options) {
			o.Certs.RelaySecret, o.Certs.RelayDNSNames = "pulse-relay-tls", []string{"pulse-relay.pulse-system.svc"}
		}},
		{"--relay-cert-secret-retired", func(o *Options) { o.Certs.RetiredRelaySecret = "pulse-relay-tls" }},
		{"--ca-configmap", func(o *Options) { o.Certs.CAConfigMap = "pulse-aggregator-ca" }},
	} {
		o := NewOptions()
		c.set(o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), c.flag) || !strings.Contains(err.Error(), "needs --manage-certs") {
			t.Errorf("%s without --manage-certs: Validate() = %v, want it refused", c.flag, err)
		}
	}
}
