package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/debug"
	"github.com/pulse-io/pulse/test/syncbuf"
)

// bin holds pulse-agent and pulse-aggregator, built once for the tests.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pulse-demo-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, b := range []struct{ out, pkg string }{{"pulse-agent", "../../cmd/agent"}, {"pulse-aggregator", "../../cmd/aggregator"}} {
		cmd := exec.Command("go", "build", "-tags", "grpcnotrace", "-o", filepath.Join(dir, b.out), b.pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b.out, err, out)
			os.Exit(1)
		}
	}
	bin = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// demo runs the demo as `make run` does, on free ports, until the test
// ends, and returns the aggregator's HTTP address and the simulated pods'
// base URLs by name.
func demo(t *testing.T) (httpAddr string, pods map[string]string) {
	t.Helper()
	var out, logs syncbuf.Buffer
	// Port 0: each child takes a port the kernel chooses and says which
	// (an address found free and then listened on could be taken between).
	const kernels = "127.0.0.1:0"
	c := config{bin: bin, httpAddr: kernels, scalerAddr: kernels, ingestAddr: kernels, agentAddr: kernels, out: &out, logs: &logs}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, c) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("demo: %v\n%s", err, logs.String())
		}
	})
	re := regexp.MustCompile(`simulated vLLM (\S+)\s+http://(\S+)/metrics`)
	reHTTP := regexp.MustCompile(`curl -s 'http://(\S+)/debug/workloads`)
	pods = map[string]string{}
	waitFor(t, "the demo's addresses", func() error {
		sc := bufio.NewScanner(strings.NewReader(out.String()))
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				pods[m[1]] = "http://" + m[2]
			}
			if m := reHTTP.FindStringSubmatch(sc.Text()); m != nil {
				httpAddr = m[1]
			}
		}
		if len(pods) < 5 || httpAddr == "" {
			return fmt.Errorf("%d pods and the aggregator at %q in %q", len(pods), httpAddr, out.String())
		}
		return nil
	})
	return httpAddr, pods
}

func waitFor(t *testing.T, what string, check func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err = check(); err == nil {
			return
		}
	}
	t.Fatalf("%s: %v", what, err)
}

func post(t *testing.T, url, body string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST %s: %s", url, resp.Status)
	}
}

func del(t *testing.T, url string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodDelete, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE %s: %s", url, resp.Status)
	}
}

// llama0 is what the aggregator's debug endpoint shows of demo/llama's
// llama-0, the pod the test steers.
func llama0(httpAddr string) (debug.Pod, error) {
	const name = "llama-0"
	resp, err := http.Get("http://" + httpAddr + "/debug/workloads/demo/llama")
	if err != nil {
		return debug.Pod{}, err
	}
	defer resp.Body.Close()
	var doc debug.Document
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return debug.Pod{}, err
	}
	for _, w := range doc.Workloads {
		for _, p := range w.Pods {
			if p.Name == name {
				return p, nil
			}
		}
	}
	return debug.Pod{}, fmt.Errorf("pod %s not reported", name)
}

// holds checks, every half second for d, that check passes.
func holds(t *testing.T, what string, d time.Duration, check func() error) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if err := check(); err != nil {
			t.Fatalf("%s did not hold: %v", what, err)
		}
	}
}

// TestDemoCanBeSteeredAsTheREADMESays drives the demo's simulated pods as
// a user would, and reads what pulse reports: a posted load holds (the
// queueing model used to overwrite it within 100 ms) until released; a
// posted model holds (the demo's swing used to reset it within a second)
// until released; a hang lasts the seconds given (it used to last until
// {"seconds":0}).
func TestDemoCanBeSteeredAsTheREADMESays(t *testing.T) {
	httpAddr, pods := demo(t)
	pod := pods["llama-0"]
	waitFor(t, "llama-0 reported", func() error {
		p, err := llama0(httpAddr)
		if err == nil && !p.Fresh {
			err = errors.New("not fresh yet")
		}
		return err
	})

	post(t, pod+"/load", `{"waiting":123}`)
	waiting123 := func() error {
		p, err := llama0(httpAddr)
		if err == nil && p.Values["waiting"] != 123 {
			err = fmt.Errorf("waiting %v", p.Values["waiting"])
		}
		return err
	}
	waitFor(t, "the posted load reported", waiting123)
	holds(t, "the posted load", 4*time.Second, waiting123)
	del(t, pod+"/load")
	waitFor(t, "the model drives the load again", func() error {
		p, err := llama0(httpAddr)
		if err == nil && p.Values["waiting"] == 123 {
			err = errors.New("still 123")
		}
		return err
	})

	// No arrivals: the queue and the batch drain to 0 and stay there,
	// though the demo's swing asks for 2 to 26 requests/s.
	post(t, pod+"/model", `{"arrivalRate":0,"batchCapacity":16,"serviceRate":5}`)
	idle := func() error {
		p, err := llama0(httpAddr)
		if err == nil && (p.Values["waiting"] != 0 || p.Values["running"] != 0) {
			err = fmt.Errorf("waiting %v running %v", p.Values["waiting"], p.Values["running"])
		}
		return err
	}
	waitFor(t, "the posted model drains the pod", idle)
	holds(t, "the posted model", 4*time.Second, idle)
	del(t, pod+"/model")
	waitFor(t, "the demo's swing drives the pod again", func() error {
		if idle() == nil {
			return errors.New("still idle")
		}
		return nil
	})

	post(t, pod+"/hang", `{"seconds":3}`)
	waitFor(t, "the hang reported as a timeout", func() error {
		p, err := llama0(httpAddr)
		if err == nil && p.Missing != "timeout" {
			err = fmt.Errorf("missing %q", p.Missing)
		}
		return err
	})
	waitFor(t, "the pod back after its 3 s", func() error {
		p, err := llama0(httpAddr)
		if err == nil && (p.Missing != "" || !p.Fresh) {
			err = fmt.Errorf("missing %q fresh %v", p.Missing, p.Fresh)
		}
		return err
	})
}

// TestDemoPrintsHowToSteerIt: the demo says how to steer its pods, on the
// addresses it was given.
func TestDemoPrintsHowToSteerIt(t *testing.T) {
	// Addresses found free can be taken before the children listen on
	// them (other tests run beside this one): a few tries.
	for try := 1; ; try++ {
		var out syncbuf.Buffer
		c := config{bin: bin, httpAddr: freeAddr(t), scalerAddr: freeAddr(t), ingestAddr: freeAddr(t), agentAddr: freeAddr(t),
			out: &out, logs: io.Discard}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- run(ctx, c) }()
		var err error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if err = instructed(out.String(), c); err == nil {
				break
			}
			select {
			case err = <-done:
				done <- err
			default:
				continue
			}
			break
		}
		cancel()
		runErr := <-done
		if runErr != nil && strings.Contains(runErr.Error(), "address already in use") && try < 3 {
			t.Logf("try %d: %v", try, runErr)
			continue
		}
		if runErr != nil {
			t.Fatal(runErr)
		}
		if err != nil {
			t.Fatal(err)
		}
		return
	}
}

// instructed checks that the demo's output says how to steer it, on c's
// addresses.
func instructed(s string, c config) error {
	for _, want := range []string{c.httpAddr + "/debug/workloads", c.scalerAddr, c.agentAddr, "/load", "DELETE /load", "/model", "/hang"} {
		if !strings.Contains(s, want) {
			return fmt.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	return nil
}

// TestTakenPortIsNamedFirst: a taken address once failed only after "pulse
// demo is running"; it is now refused before anything starts, naming the
// make variable that moves it.
func TestTakenPortIsNamedFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var out syncbuf.Buffer
	c := config{bin: bin, httpAddr: ln.Addr().String(), scalerAddr: freeAddr(t), ingestAddr: freeAddr(t), agentAddr: freeAddr(t),
		out: &out, logs: io.Discard}
	err = run(context.Background(), c)
	if err == nil || !strings.Contains(err.Error(), "DEMO_HTTP") || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("%v, want an error naming %s and DEMO_HTTP", err, ln.Addr())
	}
	if strings.Contains(out.String(), "running") {
		t.Fatalf("it said it was running: %s", out.String())
	}
}

// TestExitedChildSaysWhy: a child that exits before the demo ends fails
// the demo with the child's name and its last words, not an exit status
// alone: before it says where it listens, and after.
func TestExitedChildSaysWhy(t *testing.T) {
	for name, script := range map[string]string{
		"before it listens": "echo 'listen tcp: address already in use' >&2\nexit 1\n",
		"after it listens": fmt.Sprintf("echo 'level=INFO msg=\"aggregator listening\" ingest=%s scaler=%s http=%s' >&2\n"+
			"sleep 1\necho 'listen tcp: address already in use' >&2\nexit 1\n", freeAddr(t), freeAddr(t), freeAddr(t)),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "pulse-aggregator"), []byte("#!/bin/sh\n"+script), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(bin, "pulse-agent"), filepath.Join(dir, "pulse-agent")); err != nil {
				t.Fatal(err)
			}
			c := config{bin: dir, httpAddr: freeAddr(t), scalerAddr: freeAddr(t), ingestAddr: freeAddr(t), agentAddr: "127.0.0.1:0",
				out: io.Discard, logs: io.Discard}
			err := run(context.Background(), c)
			if err == nil || !strings.Contains(err.Error(), "pulse-aggregator: exit status 1; its last words:") ||
				!strings.HasSuffix(err.Error(), "listen tcp: address already in use") {
				t.Fatalf("%v, want the aggregator's exit and its last words", err)
			}
		})
	}
}

// TestStoppedWhileStartingIsNoFailure: Ctrl-C before the aggregator
// listens stops the demo without an error.
func TestStoppedWhileStartingIsNoFailure(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pulse-aggregator"), []byte("#!/bin/sh\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const kernels = "127.0.0.1:0"
	c := config{bin: dir, httpAddr: kernels, scalerAddr: kernels, ingestAddr: kernels, agentAddr: kernels, out: io.Discard, logs: io.Discard}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, c) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("%v, want none", err)
	}
}
