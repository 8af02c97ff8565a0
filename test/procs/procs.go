// Package procs holds what the harnesses that run pulse's processes
// (test/agentcost, test/fleet) share: a free loopback address, a sleep that
// ends with its context, and a process's CPU time, memory and open files
// from /proc (read with prometheus/procfs).
package procs

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/procfs"
)

// FreeAddr is a loopback address with a port free now.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String(), nil
}

// Sleep waits d; false when ctx ends first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Usage is a process's CPU time (user + system), resident memory (VmRSS),
// its peak since the process started (VmHWM) and open file descriptors.
type Usage struct {
	CPUSeconds   float64
	RSSBytes     int64
	RSSPeakBytes int64
	FDs          int
}

// Read reads pid's usage.
func Read(pid int) (Usage, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return Usage{}, fmt.Errorf("read /proc/%d: %w", pid, err)
	}
	st, err := p.Stat()
	if err != nil {
		return Usage{}, fmt.Errorf("read /proc/%d/stat: %w", pid, err)
	}
	status, err := p.NewStatus()
	if err != nil {
		return Usage{}, fmt.Errorf("read /proc/%d/status: %w", pid, err)
	}
	fds, err := p.FileDescriptorsLen()
	if err != nil {
		return Usage{}, fmt.Errorf("read /proc/%d/fd: %w", pid, err)
	}
	return Usage{CPUSeconds: st.CPUTime(), RSSBytes: int64(status.VmRSS), RSSPeakBytes: int64(status.VmHWM), FDs: fds}, nil
}
