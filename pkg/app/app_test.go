package app

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"runtime"
	runtimedebug "runtime/debug"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/version"
)

type opts struct {
	addr string
	log  logging.Options
}

func (o *opts) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.addr, "addr", ":80", "where to listen")
	o.log.AddFlags(fs)
}
func (o *opts) Validate() error             { return nil }
func (o *opts) LogOptions() logging.Options { return o.log }

// TestBadFlagIsOneLineAndAPointer: a bad flag says what is wrong and where
// the flags are, in two lines, and exits 2 (it used to print the whole
// usage: 44 lines for the agent).
func TestBadFlagIsOneLineAndAPointer(t *testing.T) {
	var out, errs bytes.Buffer
	code, done := Parse("pulse-agent", []string{"--scrape-intervall=2s"}, &out, &errs, &opts{})
	want := "pulse-agent: flag provided but not defined: -scrape-intervall\nRun 'pulse-agent --help' for its flags.\n"
	if !done || code != 2 || errs.String() != want || out.Len() != 0 {
		t.Fatalf("done %v code %d stdout %q stderr %q, want stderr %q", done, code, out.String(), errs.String(), want)
	}
	errs.Reset()
	if code, done := Parse("pulse-agent", []string{"--addr=:1", "extra"}, &out, &errs, &opts{}); !done || code != 2 || !strings.Contains(errs.String(), `unexpected argument "extra"`) {
		t.Fatalf("positional argument: done %v code %d %q", done, code, errs.String())
	}
}

func TestHelpPrintsTheFlags(t *testing.T) {
	var out, errs bytes.Buffer
	code, done := Parse("pulse-agent", []string{"--help"}, &out, &errs, &opts{})
	if !done || code != 0 || !strings.Contains(out.String(), "-addr") || !strings.Contains(out.String(), "where to listen") || errs.Len() != 0 {
		t.Fatalf("done %v code %d stdout %q stderr %q", done, code, out.String(), errs.String())
	}
}

func TestVersion(t *testing.T) {
	var out, errs bytes.Buffer
	code, done := Parse("pulse-agent", []string{"--version"}, &out, &errs, &opts{})
	if !done || code != 0 || out.String() != "pulse-agent "+version.Version+"\n" || errs.Len() != 0 {
		t.Fatalf("done %v code %d stdout %q stderr %q", done, code, out.String(), errs.String())
	}
}

func TestGoodFlagsParse(t *testing.T) {
	o := &opts{}
	var out, errs bytes.Buffer
	if code, done := Parse("pulse-agent", []string{"--addr=:9", "--log-format=text"}, &out, &errs, o); done || code != 0 || o.addr != ":9" || o.log.Format != "text" {
		t.Fatalf("done %v code %d opts %+v", done, code, o)
	}
}

// TestReportEndsTheLine: an error (the aggregator's --agent-auth one, say)
// ends with a newline, a multi-error with one line per problem.
func TestReportEndsTheLine(t *testing.T) {
	var b bytes.Buffer
	Report(&b, "pulse-aggregator", errors.Join(errors.New(`--agent-auth "maybe": want none or tokenreview`), errors.New("--namespace is required")))
	want := "pulse-aggregator: --agent-auth \"maybe\": want none or tokenreview\n--namespace is required\n"
	if b.String() != want {
		t.Fatalf("%q, want %q", b.String(), want)
	}
}

// TestMemoryLimitIsNinetyPercentOfTheContainers: the charts set GOMEMLIMIT
// at the container's limit, where the garbage collector worked hardest
// only at the point of the kernel's OOM kill, with no room for what Go
// does not count (NVML's memory in the agent). Both binaries now set it to
// 90 % of the limit they read; GOMEMLIMIT in the environment is kept;
// AUTOMEMLIMIT sets another ratio or none, and a bad one is refused.
func TestMemoryLimitIsNinetyPercentOfTheContainers(t *testing.T) {
	prev := runtimedebug.SetMemoryLimit(-1)
	t.Cleanup(func() { runtimedebug.SetMemoryLimit(prev) })
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no refreshes
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const limit = 1 << 30
	t.Setenv("AUTOMEMLIMIT", "") // restored at the end; unset below
	t.Setenv("GOMEMLIMIT", "")
	for _, c := range []struct {
		env  map[string]string
		want int64
		err  string
	}{
		{want: 966367641}, // 0.9 GiB, as the library rounds it
		{env: map[string]string{"AUTOMEMLIMIT": "0.5"}, want: limit / 2},
		{env: map[string]string{"AUTOMEMLIMIT": "off"}, want: math.MaxInt64},
		{env: map[string]string{"GOMEMLIMIT": "64MiB"}, want: math.MaxInt64}, // the runtime read it at start; kept
		{env: map[string]string{"AUTOMEMLIMIT": "1.5"}, err: `AUTOMEMLIMIT="1.5"`},
		{env: map[string]string{"AUTOMEMLIMIT": "ninety"}, err: `AUTOMEMLIMIT="ninety"`},
	} {
		_ = os.Unsetenv("AUTOMEMLIMIT")
		_ = os.Unsetenv("GOMEMLIMIT")
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		runtimedebug.SetMemoryLimit(math.MaxInt64)
		err := SetMemoryLimit(ctx, memlimit.Limit(limit), log)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: %v, want an error naming %s", c.env, err, c.err)
			}
			continue
		}
		if got := runtimedebug.SetMemoryLimit(-1); err != nil || got != c.want {
			t.Errorf("%v: limit %d (%v), want %d", c.env, got, err, c.want)
		}
	}
	// The library logs to the binary's log (each minute's re-read that
	// fails is said there): here, that GOMEMLIMIT is kept.
	var said strings.Builder
	_ = os.Unsetenv("AUTOMEMLIMIT")
	t.Setenv("GOMEMLIMIT", "64MiB")
	if err := SetMemoryLimit(ctx, memlimit.Limit(limit), slog.New(slog.NewTextHandler(&said, nil))); err != nil || !strings.Contains(said.String(), "GOMEMLIMIT is already set") {
		t.Errorf("the library's log: %v %q, want its line in the binary's log", err, said.String())
	}
	_ = os.Unsetenv("GOMEMLIMIT")
	// No limit to read: none set, no error, and nothing of the library's
	// at error (it would repeat each minute).
	_ = os.Unsetenv("AUTOMEMLIMIT")
	runtimedebug.SetMemoryLimit(math.MaxInt64)
	said.Reset()
	noLimit := func() (uint64, error) { return 0, memlimit.ErrNoLimit }
	if err := SetMemoryLimit(ctx, noLimit, slog.New(slog.NewTextHandler(&said, nil))); err != nil || runtimedebug.SetMemoryLimit(-1) != math.MaxInt64 || strings.Contains(said.String(), "level=ERROR") {
		t.Errorf("no limit: %v, limit %d, log %q", err, runtimedebug.SetMemoryLimit(-1), said.String())
	}
	noCgroup := func() (uint64, error) { return 0, memlimit.ErrCgroupsNotSupported }
	if err := SetMemoryLimit(ctx, noCgroup, slog.New(slog.NewTextHandler(&said, nil))); err != nil || strings.Contains(said.String(), "level=ERROR") {
		t.Errorf("no cgroup (a local run): %v, log %q; want no error", err, said.String())
	}
}

// TestGCPercentIsTheFlagsUnlessGOGCIsSet: the aggregator's heap in use
// runs up to GOGC% past its live heap and stacks; --gc-percent sets it
// (Prometheus's 50 by default), GOGC in the environment, read by the
// runtime at start, is kept, and 0 keeps Go's default.
func TestGCPercentIsTheFlagsUnlessGOGCIsSet(t *testing.T) {
	prev := runtimedebug.SetGCPercent(100)
	t.Cleanup(func() { runtimedebug.SetGCPercent(prev) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Setenv("GOGC", "")
	if got := SetGCPercent(50, log); got != 50 || GCPercent() != 50 {
		t.Errorf("--gc-percent 50: %d, in effect %d; want 50", got, GCPercent())
	}
	runtimedebug.SetGCPercent(100)
	if got := SetGCPercent(0, log); got != 100 || GCPercent() != 100 {
		t.Errorf("--gc-percent 0: %d, in effect %d; want Go's default, 100", got, GCPercent())
	}
	t.Setenv("GOGC", "80")
	runtimedebug.SetGCPercent(80) // as the runtime read it at start
	var said strings.Builder
	if got := SetGCPercent(50, slog.New(slog.NewTextHandler(&said, nil))); got != 80 || GCPercent() != 80 || !strings.Contains(said.String(), "percent=80") {
		t.Errorf("GOGC=80 and --gc-percent 50: %d, in effect %d, log %q; want GOGC's 80 kept and said", got, GCPercent(), said.String())
	}
	runtimedebug.SetGCPercent(-1)
	if GCPercent() != -1 {
		t.Errorf("GC off reads %d, want -1", GCPercent())
	}
}

// TestAddressesNeedTheirParts: net.SplitHostPort alone took "host:" (no
// port) and ":port" (no host): an aggregator listened on a port the kernel
// chose, and a provisioned ScaledObject's scalerAddress ":9090" was dialled
// on KEDA's own loopback.
func TestAddressesNeedTheirParts(t *testing.T) {
	for addr, ok := range map[string]bool{"127.0.0.1:0": true, ":9090": true, "[::1]:9090": true,
		"127.0.0.1:": false, ":": false, "": false, "host": false, "127.0.0.1:http": false, "127.0.0.1:70000": false} {
		if err := ListenAddr(addr); (err == nil) != ok {
			t.Errorf("ListenAddr(%q) = %v, want ok %v", addr, err, ok)
		}
	}
	for addr, ok := range map[string]bool{"pulse-aggregator.pulse-system.svc:9090": true, "[::1]:9090": true,
		":9090": false, "svc:": false, "svc:0": false, "svc:65536": false, "": false} {
		if err := DialAddr(addr); (err == nil) != ok {
			t.Errorf("DialAddr(%q) = %v, want ok %v", addr, err, ok)
		}
	}
}

// TestHeadersPastTheBoundAreRefused: a request whose headers pass
// MaxHeaderBytes is answered 431 and its connection closed, and what it
// allocates is bounded by the bound, not by the header lines sent; one
// within it is served. At Go's default bound (1 MiB) one request of 1 MiB
// of empty header lines held about 17 MB of parsed header map.
func TestHeadersPastTheBoundAreRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewHTTPServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), slog.New(slog.DiscardHandler))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	send := func(lines int) (int, uint64) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		var b strings.Builder
		b.WriteString("GET /metrics HTTP/1.1\r\nHost: x\r\n")
		for i := range lines {
			fmt.Fprintf(&b, "%x:\r\n", i)
		}
		b.WriteString("\r\n")
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		go func() { _, _ = io.WriteString(c, b.String()) }() // refused, the rest may not be read
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		runtime.ReadMemStats(&m1)
		return resp.StatusCode, m1.TotalAlloc - m0.TotalAlloc
	}
	if code, _ := send(1000); code != http.StatusOK {
		t.Errorf("1,000 header lines (about 7 KB): %d, want 200", code)
	}
	code, alloc := send(150_000) // about 1 MiB
	if code != http.StatusRequestHeaderFieldsTooLarge || alloc > 4<<20 {
		t.Errorf("about 1 MiB of header lines: %d after allocating %d KB; want 431, within a few MB", code, alloc>>10)
	}
}
