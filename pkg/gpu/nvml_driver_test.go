//go:build nvml

// Run on a machine with an NVIDIA driver: make gpu-check, or
// go test -tags nvml -run TestRealDriver -bench BenchmarkRealRead -v ./pkg/gpu
package gpu

import (
	"log/slog"
	"math"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestRealDriver(t *testing.T) {
	n, err := OpenNVML(nvml.New(), ModeOn, time.Second, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for round := range 3 {
		devs, err := n.Read()
		if err != nil {
			t.Fatal(err)
		}
		if len(devs.ByUUID) == 0 {
			t.Fatal("no device")
		}
		for uuid, d := range devs.ByUUID {
			t.Logf("round %d: %s utilization %.3f (has %v) memory %d/%d", round, uuid, d.Utilization, d.HasUtilization, d.MemUsed, d.MemTotal)
			if d.HasUtilization && (d.Utilization < 0 || d.Utilization > 1) {
				t.Errorf("%s: utilization %v out of 0..1", uuid, d.Utilization)
			}
			if d.MemTotal == 0 || d.MemUsed > d.MemTotal {
				t.Errorf("%s: memory %d/%d", uuid, d.MemUsed, d.MemTotal)
			}
		}
		time.Sleep(time.Second)
	}
}

// realGPU0 initializes the driver's NVML until the test ends, and returns
// it with GPU 0.
func realGPU0(tb testing.TB) (nvml.Interface, nvml.Device) {
	tb.Helper()
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		tb.Fatalf("init: %s", nvml.ErrorString(ret))
	}
	tb.Cleanup(func() { _ = lib.Shutdown() })
	dev, ret := lib.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		tb.Fatalf("GPU 0: %s", nvml.ErrorString(ret))
	}
	return lib, dev
}

// TestRealDriverSamples: the driver keeps the utilization samples that a
// read at an interval of SamplesFrom or more averages (GetSamples), each
// with its time, none ahead of the clock (a read takes the newest time as
// where the next read starts).
func TestRealDriverSamples(t *testing.T) {
	_, dev := realGPU0(t)
	time.Sleep(2 * time.Second) // the driver's buffer fills from Init
	vt, samples, ret := dev.GetSamples(nvml.GPU_UTILIZATION_SAMPLES, 0)
	if ret != nvml.SUCCESS || len(samples) < 2 {
		t.Fatalf("GetSamples: %s, %d samples: the agent would fall back to one instant a read", nvml.ErrorString(ret), len(samples))
	}
	now := uint64(time.Now().UnixMicro())
	lo, hi, zero, future, back := uint64(math.MaxUint64), uint64(0), 0, 0, 0
	for i, sm := range samples {
		switch {
		case sm.TimeStamp == 0:
			zero++
			continue
		case sm.TimeStamp > now+uint64(time.Minute/time.Microsecond):
			future++
		}
		if i > 0 && sm.TimeStamp < samples[i-1].TimeStamp {
			back++
		}
		lo, hi = min(lo, sm.TimeStamp), max(hi, sm.TimeStamp)
	}
	t.Logf("%d samples of value type %d: %d with no time, %d more than a minute ahead of the clock, %d older than the one before; the rest span %.2f s, the newest %.2f s before now",
		len(samples), vt, zero, future, back, float64(hi-lo)/1e6, (float64(now)-float64(hi))/1e6)
	if future > 0 {
		t.Errorf("%d samples ahead of the clock: a read would take them as newest and drop every later sample", future)
	}
}

// BenchmarkRealRead: one read of every device, as the agent makes each
// interval: below SamplesFrom (the default 1 s) and from it.
func BenchmarkRealRead(b *testing.B) {
	for _, interval := range []time.Duration{time.Second, SamplesFrom} {
		b.Run("interval="+interval.String(), func(b *testing.B) {
			n, err := OpenNVML(nvml.New(), ModeOn, interval, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			defer n.Close()
			cpu := func() time.Duration {
				var ru syscall.Rusage
				if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
					b.Fatal(err)
				}
				return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			}
			before := cpu()
			for b.Loop() {
				if _, err := n.Read(); err != nil {
					b.Fatal(err)
				}
			}
			// The process's CPU time (user and system) a read, beside its wall time.
			b.ReportMetric(float64(cpu()-before)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkRealCalls: each NVML call a read makes, alone.
func BenchmarkRealCalls(b *testing.B) {
	lib, dev := realGPU0(b)
	calls := []struct {
		name string
		call func() nvml.Return
	}{
		{"DeviceGetCount", func() nvml.Return { _, r := lib.DeviceGetCount(); return r }},
		{"DeviceGetHandleByIndex", func() nvml.Return { _, r := lib.DeviceGetHandleByIndex(0); return r }},
		{"GetUUID", func() nvml.Return { _, r := dev.GetUUID(); return r }},
		{"GetSamplesAll", func() nvml.Return { _, _, r := dev.GetSamples(nvml.GPU_UTILIZATION_SAMPLES, 0); return r }},
		{"GetSamplesNewest", func() nvml.Return {
			_, s, r := dev.GetSamples(nvml.GPU_UTILIZATION_SAMPLES, uint64(time.Now().Add(-time.Second).UnixMicro()))
			_ = s
			return r
		}},
		{"GetUtilizationRates", func() nvml.Return { _, r := dev.GetUtilizationRates(); return r }},
		{"GetMemoryInfo", func() nvml.Return { _, r := dev.GetMemoryInfo(); return r }},
		{"GetMigMode", func() nvml.Return { _, _, r := dev.GetMigMode(); return r }},
	}
	for _, c := range calls {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if r := c.call(); r != nvml.SUCCESS && r != nvml.ERROR_NOT_SUPPORTED {
					b.Fatal(nvml.ErrorString(r))
				}
			}
		})
	}
}
