package aggregator

import "testing"

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
