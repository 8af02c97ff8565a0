package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/test/syncbuf"
)

// agentHTTP returns an agent endpoint's status and body.
func agentHTTP(ag *agent.Agent, path string) (int, string, error) {
	if ag.HTTPAddr() == "" {
		return 0, "", errors.New("agent not listening yet")
	}
	resp, err := http.Get("http://" + ag.HTTPAddr() + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// connectedGauge checks the agent's pulse_agent_aggregator_connected for
// one aggregator label.
func connectedGauge(ag *agent.Agent, label string, want int) error {
	_, body, err := agentHTTP(ag, "/metrics")
	if err != nil {
		return err
	}
	line := fmt.Sprintf("pulse_agent_aggregator_connected{aggregator=%q} %d", label, want)
	if !strings.Contains(body, line) {
		return fmt.Errorf("metrics lack %q", line)
	}
	return nil
}

// TestAgentIsNeverSilentAboutItsAggregator: an agent whose aggregator is not
// there exports pulse_agent_aggregator_connected 0 for it from the start, is
// not ready (saying why), and warns once with the address and the reason
// (not once per retry); when the aggregator appears at that address, the
// agent connects, becomes ready and delivers. It used to wait on the
// connection in silence: no log, no gauge, /readyz 200.
func TestAgentIsNeverSilentAboutItsAggregator(t *testing.T) {
	pods := startSims(t, []simPod{{name: "p-0", workload: "w"}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there until the aggregator below

	file := filepath.Join(t.TempDir(), "targets.yaml")
	writeTargets(t, file, pods)
	o := agent.NewOptions()
	o.StaticTargets, o.Aggregators, o.NodeName, o.NVML = file, []string{addr}, "node-1", gpu.ModeOff
	var logs syncbuf.Buffer
	ag := runAgent(t, o, agent.Deps{}, slog.New(slog.NewTextHandler(&logs, nil)))

	eventually(t, "the gauge, 0, from the start", func() error { return connectedGauge(ag, addr, 0) })
	eventually(t, "not ready, naming the address", func() error {
		code, body, err := agentHTTP(ag, "/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "no aggregator connected") || !strings.Contains(body, addr) {
			return fmt.Errorf("/readyz %d %q", code, body)
		}
		return nil
	})
	eventually(t, "a warning with the address and the reason", func() error {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "cannot reach the aggregator") && strings.Contains(line, addr) && strings.Contains(line, "connection refused") {
				return nil
			}
		}
		return fmt.Errorf("logs:\n%s", logs.String())
	})
	// The agent retried every few hundred milliseconds meanwhile; the
	// warning came once (the next is due warnEvery after it).
	if n := strings.Count(logs.String(), "cannot reach the aggregator"); n != 1 {
		t.Errorf("%d warnings, want 1 (rate-limited):\n%s", n, logs.String())
	}

	agg, _ := startAggregator(t, addr)
	eventually(t, "connected once the aggregator is there", func() error { return connectedGauge(ag, addr, 1) })
	eventually(t, "ready", func() error {
		code, body, err := agentHTTP(ag, "/readyz")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("/readyz %d %q", code, body)
		}
		return err
	})
	eventually(t, "samples delivered", func() error {
		w, err := workload(agg.HTTPAddr(), "w")
		if err == nil && w.Pods[0].AgeSeconds == nil {
			err = errors.New("no sample yet")
		}
		return err
	})
}

// noDNS resolves nothing.
type noDNS struct{}

func (noDNS) LookupHost(context.Context, string) ([]string, error) {
	return nil, &net.DNSError{Err: "no such host", Name: "pulse-aggregator-ingest.pulse.svc", IsNotFound: true}
}

// TestAgentWithAnUnresolvableAggregatorSaysSo: a name that resolves to
// nothing is exported as not connected, warned about and keeps the agent
// unready.
func TestAgentWithAnUnresolvableAggregatorSaysSo(t *testing.T) {
	pods := startSims(t, []simPod{{name: "p-0", workload: "w"}})
	file := filepath.Join(t.TempDir(), "targets.yaml")
	writeTargets(t, file, pods)
	o := agent.NewOptions()
	entry := "pulse-aggregator-ingest.pulse.svc:9091"
	o.StaticTargets, o.Aggregators, o.NodeName, o.NVML = file, []string{entry}, "node-1", gpu.ModeOff
	var logs syncbuf.Buffer
	ag := runAgent(t, o, agent.Deps{Resolver: noDNS{}}, slog.New(slog.NewTextHandler(&logs, nil)))
	eventually(t, "the entry exported as not connected", func() error { return connectedGauge(ag, entry, 0) })
	eventually(t, "a warning naming it", func() error {
		if s := logs.String(); !strings.Contains(s, "resolve aggregator") || !strings.Contains(s, entry) || !strings.Contains(s, "no such host") {
			return fmt.Errorf("logs:\n%s", s)
		}
		return nil
	})
	code, body, err := agentHTTP(ag, "/readyz")
	if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, entry) {
		t.Fatalf("/readyz %d %q %v, want 503 naming %s", code, body, err, entry)
	}
}
