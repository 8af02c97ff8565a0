package agent

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/test/fakenode"
)

// TestADriverUpgradedUnderTheAgentRestartsIt: a driver upgraded while the
// agent runs leaves the process with the old NVML library (mapped in it,
// and the one mounted into its container), so every initialization after
// finds the driver at another version, for good: the GPUs had no values
// until someone restarted the agent, one Warn said so, and /livez stayed
// green. Now /livez fails once the mismatch has lasted
// nvmlMismatchRestart, naming it, and the kubelet restarts the agent with
// the driver's library; a driver back at the library's version clears it.
func TestADriverUpgradedUnderTheAgentRestartsIt(t *testing.T) {
	defer func(d time.Duration) { nvmlMismatchRestart = d }(nvmlMismatchRestart)
	nvmlMismatchRestart = 0
	gpus := fakenode.GPUs(func(int) uint32 { return 0 })
	var upgraded atomic.Bool
	count, initNVML := gpus.DeviceGetCountFunc, gpus.InitFunc
	gpus.DeviceGetCountFunc = func() (int, nvml.Return) {
		if upgraded.Load() {
			return 0, nvml.ERROR_LIB_RM_VERSION_MISMATCH
		}
		return count()
	}
	gpus.InitFunc = func() nvml.Return {
		if upgraded.Load() {
			return nvml.ERROR_LIB_RM_VERSION_MISMATCH
		}
		return initNVML()
	}
	a := newIdleAgent(t)
	n, err := gpu.OpenNVML(gpus, gpu.ModeOn, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	livez := withNVML(a, n)
	var failing bool
	read := func() {
		a.nvmlLostTry = time.Time{} // the next try is due
		a.readNVML(&failing)
	}
	read()
	if code, body := livez(); code != http.StatusOK {
		t.Fatalf("with the driver at the library's version: %d %s", code, body)
	}
	upgraded.Store(true)
	read() // finds the driver gone: NVML shut down
	read() // initialized again: the version is not the library's
	if code, body := livez(); code != http.StatusInternalServerError || !strings.Contains(body, "upgraded") {
		t.Fatalf("the driver at another version than the library: %d %q; want /livez failing, naming the upgrade", code, body)
	}
	upgraded.Store(false)
	read() // initialized again: the versions agree
	if code, body := livez(); code != http.StatusOK {
		t.Fatalf("the driver back at the library's version: %d %s", code, body)
	}
}

// TestADriverAtAnotherVersionFromTheStartIsNoReasonToRestart: the host's
// NVML library already at another version than the driver loaded when the
// agent starts (the driver's package upgraded, its reboot pending): no
// restart changes that (a new container mounts the same library), yet
// /livez failed after 2 minutes, and the kubelet restarted the agent for
// ever, every pod of the node without its samples for most of each
// back-off. /livez holds; once the process has found the driver otherwise
// (not loaded, or at the library's version), a mismatch after is an
// upgrade under it, and restarts it.
func TestADriverAtAnotherVersionFromTheStartIsNoReasonToRestart(t *testing.T) {
	defer func(d time.Duration) { nvmlMismatchRestart = d }(nvmlMismatchRestart)
	nvmlMismatchRestart = 0
	gpus := fakenode.GPUs(func(int) uint32 { return 0 })
	var ret atomic.Int32
	ret.Store(int32(nvml.ERROR_LIB_RM_VERSION_MISMATCH))
	gpus.InitFunc = func() nvml.Return { return nvml.Return(ret.Load()) }
	a := newIdleAgent(t)
	n, err := gpu.OpenNVML(gpus, gpu.ModeAuto, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil || n == nil {
		t.Fatalf("OpenNVML: %v, %v", n, err)
	}
	livez := withNVML(a, n)
	var failing bool
	for range 3 {
		a.nvmlLostTry = time.Time{}
		a.readNVML(&failing)
	}
	if code, body := livez(); code != http.StatusOK {
		t.Fatalf("a mismatch since the start: /livez %d %q; want it holding", code, body)
	}
	ret.Store(int32(nvml.ERROR_DRIVER_NOT_LOADED)) // the driver unloaded
	a.nvmlLostTry = time.Time{}
	a.readNVML(&failing)
	ret.Store(int32(nvml.ERROR_LIB_RM_VERSION_MISMATCH)) // and loaded at another version
	a.nvmlLostTry = time.Time{}
	a.readNVML(&failing)
	if code, body := livez(); code != http.StatusInternalServerError || !strings.Contains(body, "upgraded") {
		t.Fatalf("a mismatch after the driver was otherwise: /livez %d %q; want it failing, naming the upgrade", code, body)
	}
}

// withNVML gives a n, its scrape loop ticking, and returns its /livez.
func withNVML(a *Agent, n *gpu.NVML) func() (int, string) {
	a.nvml = n
	a.lastTick.Store(int64(time.Since(monoStart))) // the scrape loop ticks
	mux := http.NewServeMux()
	a.healthHandlers(mux)
	return func() (int, string) {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/livez", nil))
		return w.Code, w.Body.String()
	}
}
