package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/pulse-io/pulse/test/procs"
)

// The machine's floor under the run's load: a 32-byte TCP round trip
// between the harness and an echo process on the aggregator's CPUs, at a
// fixed rate through the measurement. An answer's round trip is not
// expected to be faster; what lies above it is, roughly, gRPC's and the
// aggregator's (docs/performance.md, "The machine's floor").

// echoEnv names the address the echo process serves; a harness binary
// started with it set serves echoes there and nothing else.
const echoEnv = "PULSE_FLEET_ECHO_ADDR"

// echoSize is the bytes each round trip sends: about a GetMetrics request.
const echoSize = 32

// serveEchoIfAsked serves echoes forever when the process was started as
// the echo process; it returns false otherwise.
func serveEchoIfAsked() bool {
	addr := os.Getenv(echoEnv)
	if addr == "" {
		return false
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet echo:", err)
		os.Exit(1)
	}
	_ = serveEcho(ln)
	return true
}

// serveEcho writes back what each connection sends until ln closes.
func serveEcho(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer func() { _ = c.Close() }()
			_, _ = io.Copy(c, c)
		}()
	}
}

// echoProc is the echo process: the harness's own binary, on the
// aggregator's CPUs when they are its own.
type echoProc struct {
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
}

func startEcho(cpus []int, logPath string) (*echoProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	addr, err := procs.FreeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	if len(cpus) > 0 {
		cmd = exec.Command("taskset", "-c", cpuList(cpus), self)
	}
	cmd.Env = append(os.Environ(), echoEnv+"="+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with the harness
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("start the echo process: %w", err)
	}
	p := &echoProc{addr: addr, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = log.Close(); close(p.exited) }()
	return p, nil
}

func (p *echoProc) stop() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// echoer times round trips to an echo server, every `every`, keeping the
// ones since the last take.
type echoer struct {
	mu     sync.Mutex
	rtts   []float64 // seconds
	failed error     // the first failure; the echoer stops at it
	// drain: how long the round trips under way at the end may take
	// (0: echoDrain).
	drain time.Duration
}

// run dials addr and times a round trip every `every` until ctx ends,
// but for the turns skip (nil: none) says are not its own. The echo
// process starting may take a moment: the dial is retried for 10 s.
func (e *echoer) run(ctx context.Context, addr string, every time.Duration, skip func() bool) {
	c, err := dialRetry(ctx, addr, 10*time.Second)
	if err != nil {
		if ctx.Err() == nil {
			e.fail(err)
		}
		return
	}
	defer func() { _ = c.Close() }()
	// At the end no more is sent, and the round trips under way run to
	// their answers, within echoDrain, as a poll under way runs to its
	// answer (dropped at the connection's close, a stall at the end was
	// in the polls' times and not in the floor's).
	drain := cmp.Or(e.drain, echoDrain)
	stop := context.AfterFunc(ctx, func() {
		_ = c.SetDeadline(time.Now().Add(drain)) // a write blocked then ends too
	})
	defer stop()
	// Open loop, as the GetMetrics polls are (each ScaledObject's on its
	// own schedule): a round trip is sent when due, whether or not the
	// ones before have come back, and timed from its send, as a poll is.
	// So a stall of L is L/every samples, as it is of the polls, for up
	// to echoInFlight × every (10 s at the default): past that the sends
	// wait for room. One at a time on a ticker (until 2026-12-06), the
	// ticks a slow round trip overlapped were dropped: a stall was one
	// sample, and the floor's p99 understated where stalls outlast every
	// (at 10,000 agents). The echo answers in order on the one
	// connection: the reader pairs each answer with the oldest send.
	sent := make(chan time.Time, echoInFlight)
	room := make(chan struct{}, echoInFlight) // a slot a round trip under way
	done := make(chan struct{})
	failed := make(chan struct{}) // the reader failed: no more is sent
	go func() {
		defer close(done)
		e.readAnswers(ctx, c, drain, sent, room, failed)
	}()
	defer func() {
		if ctx.Err() == nil { // stopped by a failure: nothing more to wait for
			_ = c.SetDeadline(time.Now())
		}
		close(sent)
		<-done // the reader reads what is under way, then ends
	}()
	out := bytes.Repeat([]byte{'p'}, echoSize)
	timer := time.NewTimer(every)
	defer timer.Stop()
	due := time.Now().Add(every)
	for {
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-failed:
				return
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		due = due.Add(every)
		if skip != nil && skip() {
			continue
		}
		select {
		case room <- struct{}{}: // at most echoInFlight unanswered: past that it waits
		case <-ctx.Done():
			return
		case <-failed:
			return
		}
		sent <- time.Now() // taken once there is room: a slot is this one's
		if _, err := c.Write(out); err != nil {
			e.failUnlessDone(ctx, err)
			return
		}
	}
}

// echoInFlight bounds the round trips sent and not answered (10 s of them
// at the default 10 ms); echoDrain is how long those under way at the end
// may take to come back (a poll's deadline).
const (
	echoInFlight = 1024
	echoDrain    = getMetricsDeadline
)

// readAnswers reads the echo's answers in order, timing each from its
// send (sent, closed once no more is sent), and frees its slot (room);
// at a failure it closes failed and takes what is still sent.
func (e *echoer) readAnswers(ctx context.Context, c net.Conn, drain time.Duration, sent <-chan time.Time, room <-chan struct{}, failed chan<- struct{}) {
	want := bytes.Repeat([]byte{'p'}, echoSize)
	in := make([]byte, echoSize)
	stopped := func() {
		close(failed)
		for range sent { // until the writer, told, stops
		}
	}
	for at := range sent {
		if _, err := io.ReadFull(c, in); err != nil {
			if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() && ctx.Err() != nil {
				// Under way at the end and not answered within the
				// drain, as a poll past its deadline is an error: it
				// was dropped, and the floor kept no trace of the stall.
				e.fail(fmt.Errorf("an echo round trip under way at the end was not answered within %s of it", drain))
			} else {
				e.failUnlessDone(ctx, err)
			}
			stopped()
			return
		}
		d := time.Since(at)
		<-room
		if !bytes.Equal(in, want) {
			e.fail(fmt.Errorf("echo answered %q to %q", in, want))
			stopped()
			return
		}
		e.mu.Lock()
		e.rtts = append(e.rtts, d.Seconds())
		e.mu.Unlock()
	}
}

func dialRetry(ctx context.Context, addr string, limit time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(limit)
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("dial the echo process at %s: %w", addr, err)
		}
		if !procs.Sleep(ctx, 20*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
}

func (e *echoer) failUnlessDone(ctx context.Context, err error) {
	if ctx.Err() != nil { // the run ended: the connection was closed under it
		return
	}
	e.fail(fmt.Errorf("echo round trip: %w", err))
}

func (e *echoer) fail(err error) {
	e.mu.Lock()
	if e.failed == nil {
		e.failed = err
	}
	e.mu.Unlock()
}

// take returns the round trips since the last take and the first failure.
func (e *echoer) take() ([]float64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.rtts
	e.rtts = nil
	return r, e.failed
}
