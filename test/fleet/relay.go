package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/pulse-io/pulse/test/procs"
)

// relayProc is a pulse-relay process (--relays) between agents and the
// aggregator. It runs on the harness's CPUs (the harness's affinity is
// inherited): its cost is the load's, reported apart from the aggregator's.
type relayProc struct {
	listen, httpAddr string
	cmd              *exec.Cmd
	exited           chan struct{}
}

// startRelays starts n relays for the aggregator and waits until each is
// ready (it has resolved the aggregator).
func (f *fleet) startRelays(ctx context.Context, n int) error {
	for i := range n {
		listen, err := procs.FreeAddr()
		if err != nil {
			return err
		}
		httpAddr, err := procs.FreeAddr()
		if err != nil {
			return err
		}
		args := []string{"--listen", listen, "--http-addr", httpAddr, "--aggregator", f.agg.ingest,
			"--log-format", "text", "--log-level", "warn"}
		if t := f.agg.tls; t != nil {
			args = append(args, "--aggregator-ca-file", t.caFile)
		}
		logf, err := os.Create(filepath.Join(f.dir, fmt.Sprintf("relay-%d.log", i)))
		if err != nil {
			return err
		}
		cmd := exec.Command(filepath.Join(f.o.bin, "pulse-relay"), args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			_ = logf.Close()
			return fmt.Errorf("start pulse-relay: %w", err)
		}
		r := &relayProc{listen: listen, httpAddr: httpAddr, cmd: cmd, exited: make(chan struct{})}
		go func() { _ = cmd.Wait(); _ = logf.Close(); close(r.exited) }()
		f.relays = append(f.relays, r)
		if err := r.waitReady(ctx); err != nil {
			return fmt.Errorf("relay %d: %w (see %s)", i, err, logf.Name())
		}
	}
	f.logf("started %d relays", n)
	return nil
}

func (r *relayProc) waitReady(ctx context.Context) error {
	c := &http.Client{Timeout: 5 * time.Second}
	for {
		if resp, err := c.Get("http://" + r.httpAddr + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-r.exited:
			return fmt.Errorf("exited at start")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stopRelays ends every relay.
func (f *fleet) stopRelays() {
	for _, r := range f.relays {
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
}

// usage reads the aggregator's (pid's) usage and the relays' CPU seconds
// and resident memory, summed.
func (f *fleet) usage(pid int) (agg procs.Usage, relayCPU float64, relayRSS int64, err error) {
	if agg, err = procs.Read(pid); err != nil {
		return agg, 0, 0, err
	}
	relayCPU, relayRSS, err = f.relayUsage()
	return agg, relayCPU, relayRSS, err
}

// relayUsage is the relays' CPU seconds and resident memory, summed.
func (f *fleet) relayUsage() (cpu float64, rss int64, err error) {
	for _, r := range f.relays {
		u, err := procs.Read(r.cmd.Process.Pid)
		if err != nil {
			return 0, 0, err
		}
		cpu += u.CPUSeconds
		rss += u.RSSBytes
	}
	return cpu, rss, nil
}
