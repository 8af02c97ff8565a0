package agent

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/discovery"
)

// TestTheProbesHaveAPortNoPodReaches: the HTTP port (reachable from any
// pod) holds at most maxHTTPConns connections, maxHTTPConnsPerIP from one
// address: 16 pods holding their 16 each filled it, the kubelet's probe
// of /livez there was closed at once, and the agent was restarted for
// ever. The probes have a port of their own (--health-addr, the chart's
// on the pod's loopback), probed by `pulse-agent probe`, which answers
// while the HTTP port is full.
func TestTheProbesHaveAPortNoPodReaches(t *testing.T) {
	a := newIdleAgent(t)
	a.opts.HTTPAddr, a.opts.HealthAddr = "127.0.0.1:0", "127.0.0.1:0"
	a.lastTick.Store(int64(time.Since(monoStart))) // the scrape loop ticks
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = a.serveHTTP(ctx) }()
	go func() { _ = a.serveHealth(ctx) }()
	waitUntil(t, "both ports listen", func() bool { return a.HTTPAddr() != "" && a.HealthAddr() != "" })
	// Sixteen addresses, each holding its sixteen connections.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for i := range maxHTTPConns / maxHTTPConnsPerIP {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))}}
		for range maxHTTPConnsPerIP {
			c, err := d.Dial("tcp", a.HTTPAddr())
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("connection %d of %v: %v", len(held), d.LocalAddr, err)
			}
			_ = resp.Body.Close() // held open (keep-alive)
		}
	}
	// The HTTP port is full: a probe there, from the node's address, gets
	// no answer.
	kubelet := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 2, 1)}}).DialContext}}
	if resp, err := kubelet.Get("http://" + a.HTTPAddr() + "/livez"); err == nil {
		_ = resp.Body.Close()
		t.Fatalf("the HTTP port answered past its %d connections: the flood did not fill it", maxHTTPConns)
	}
	var out strings.Builder
	if code := app.Probe("pulse-agent", []string{"http://" + a.HealthAddr() + "/livez"}, &out); code != 0 || !strings.Contains(out.String(), "200 OK: ok") {
		t.Fatalf("pulse-agent probe of the health port beside the flood: exit %d, %q", code, out.String())
	}
	// /readyz there too: no aggregator connected, 503, exit 1.
	out.Reset()
	if code := app.Probe("pulse-agent", []string{"http://" + a.HealthAddr() + "/readyz"}, &out); code != 1 || !strings.Contains(out.String(), "503") || !strings.Contains(out.String(), "no aggregator connected") {
		t.Fatalf("pulse-agent probe of /readyz with no aggregator: exit %d, %q", code, out.String())
	}
	// The health port serves the probes alone.
	resp, err := http.Get("http://" + a.HealthAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/metrics on the health port: %s, want 404", resp.Status)
	}
}

// TestReadyzSaysThePodsAreNotListed: no stream opens before the node's
// pods are listed once, and an agent that could not list them (its
// ServiceAccount forbidden, its egress to the API server blocked) said
// only that no aggregator was connected, sending the operator to the
// aggregator. It says the pods are not listed, and why.
func TestReadyzSaysThePodsAreNotListed(t *testing.T) {
	a := newIdleAgent(t)
	a.opts.HTTPAddr, a.opts.NodeName = "127.0.0.1:0", "gpu-1"
	a.lastTick.Store(int64(time.Since(monoStart)))
	sel, err := discovery.ParseSelector(discovery.DefaultSelector)
	if err != nil {
		t.Fatal(err)
	}
	forbidden := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			return nil, errors.New(`pods is forbidden: User "system:serviceaccount:pulse-system:pulse-agent" cannot list resource "pods"`)
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			return nil, errors.New("pods is forbidden")
		},
	}
	a.kube = discovery.NewKube(discovery.KubeOptions{Pods: forbidden, Node: "gpu-1", Selector: sel, OnChange: func([]discovery.Target) {},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = a.kube.Run(ctx) }()
	go func() { _ = a.serveHTTP(ctx) }()
	waitUntil(t, "the HTTP port listens", func() bool { return a.HTTPAddr() != "" })
	var body string
	waitUntil(t, "readyz names the list's error", func() bool {
		resp, err := http.Get("http://" + a.HTTPAddr() + "/readyz")
		if err != nil {
			return false
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(body, "pods of node gpu-1 not listed yet") && strings.Contains(body, "forbidden")
	})
	if strings.Contains(body, "aggregator") {
		t.Fatalf("readyz blames the aggregator: %q", body)
	}
}
