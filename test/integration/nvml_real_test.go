//go:build nvml

// The agent on a machine with a real NVIDIA driver: make gpu-check, or,
// from the repository root (the test runs in its package's directory),
//
//	PULSE_GPU_LOAD="python3 $PWD/test/integration/gpuload.py 40" \
//	  go test -tags nvml -run TestRealGPUThroughTheAgent -v ./test/integration
package integration

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/pulse-io/pulse/test/fakenode"
)

// TestRealGPUThroughTheAgent runs the agent with the driver's NVML and a
// kubelet that names GPU 0 three ways (its UUID, its index, a time-slicing
// replica of it). Every pod must show GPU 0's memory as NVML reads it, an
// idle GPU as idle, and, while PULSE_GPU_LOAD runs, a busy one as busy.
func TestRealGPUThroughTheAgent(t *testing.T) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("this test needs an NVIDIA driver: init: %s", nvml.ErrorString(ret))
	}
	defer func() { _ = lib.Shutdown() }()
	dev, ret := lib.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU 0: %s", nvml.ErrorString(ret))
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU 0 UUID: %s", nvml.ErrorString(ret))
	}
	name, _ := dev.GetName()
	driver, _ := lib.SystemGetDriverVersion()
	t.Logf("GPU 0: %s %s, driver %s", name, uuid, driver)
	memShare := func() float64 {
		m, ret := dev.GetMemoryInfo()
		if ret != nvml.SUCCESS || m.Total == 0 {
			t.Fatalf("GPU 0 memory: %s", nvml.ErrorString(ret))
		}
		return float64(m.Used) / float64(m.Total)
	}

	agg := runGPUAgent(t, nil, // the driver's NVML
		fakenode.Pod("demo", "by-uuid", "nvidia.com/gpu", uuid),
		fakenode.Pod("demo", "by-index", "nvidia.com/gpu", "0"),
		fakenode.Pod("demo", "time-sliced", "nvidia.com/gpu", uuid+"::3"))

	// gpuValues waits until every pod shows GPU values that pass check.
	gpuValues := func(what string, check func(util, mem float64) error) {
		t.Helper()
		eventually(t, what, func() error {
			w, err := workload(agg.HTTPAddr(), "llama")
			if err != nil {
				return err
			}
			if len(w.Pods) != 3 {
				return fmt.Errorf("%d pods, want 3", len(w.Pods))
			}
			for _, p := range w.Pods {
				util, okU := p.Values["gpuUtilization"]
				mem, okM := p.Values["gpuMemoryUsage"]
				if !okU || !okM {
					return fmt.Errorf("%s: no GPU values: %v", p.Name, p.Values)
				}
				if util < 0 || util > 1 || mem < 0 || mem > 1 {
					return fmt.Errorf("%s: gpuUtilization %v gpuMemoryUsage %v out of 0..1", p.Name, util, mem)
				}
				if err := check(util, mem); err != nil {
					return fmt.Errorf("%s: %w", p.Name, err)
				}
			}
			for _, p := range w.Pods {
				t.Logf("%s: %s: gpuUtilization %v gpuMemoryUsage %.4f", what, p.Name, p.Values["gpuUtilization"], p.Values["gpuMemoryUsage"])
			}
			t.Logf("%s: NVML reads memory %.4f now", what, memShare())
			return nil
		})
	}
	// Memory is read at the agent's interval (200 ms here) and moves little
	// at rest: within 2 points of what NVML reads now.
	sameMemory := func(mem float64) error {
		if now := memShare(); math.Abs(mem-now) > 0.02 {
			return fmt.Errorf("gpuMemoryUsage %.4f, NVML reads %.4f now", mem, now)
		}
		return nil
	}
	gpuValues("idle", func(util, mem float64) error {
		if util > 0.1 {
			return fmt.Errorf("gpuUtilization %v on an idle GPU", util)
		}
		return sameMemory(mem)
	})

	load := os.Getenv("PULSE_GPU_LOAD")
	if load == "" {
		t.Fatal("PULSE_GPU_LOAD is empty: name a command that keeps GPU 0 busy (make gpu-check does)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "sh", "-c", load)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	idleMem := memShare()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-exited; err != nil {
				t.Logf("the load ended: %v", err) // killed, if it ran on
			}
		}
	}
	defer stop()
	// A load takes some seconds to start (CUDA's context, its allocation).
	deadline := time.Now().Add(60 * time.Second)
	for memShare() < idleMem+0.01 {
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("the load %q ended before it held GPU memory: %v", load, err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the load %q holds no GPU memory after 60 s", load)
		}
	}
	gpuValues("busy", func(util, mem float64) error {
		if util < 0.5 {
			return fmt.Errorf("gpuUtilization %v on a busy GPU", util)
		}
		if mem < idleMem+0.01 {
			return fmt.Errorf("gpuMemoryUsage %.4f: the load's memory is not there (idle %.4f)", mem, idleMem)
		}
		return nil
	})
	stop()
	gpuValues("idle again", func(util, mem float64) error {
		if util > 0.1 {
			return fmt.Errorf("gpuUtilization %v after the load ended", util)
		}
		return sameMemory(mem)
	})
}
