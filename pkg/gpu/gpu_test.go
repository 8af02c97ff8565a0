package gpu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	nvmlmock "github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/pulse-io/pulse/test/fakenode"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// readOnce opens lib at an interval of SamplesFrom (its reads take the
// driver's samples) and reads every device once.
func readOnce(t *testing.T, lib nvml.Interface) (*NVML, Devices) {
	t.Helper()
	n, err := OpenNVML(lib, ModeOn, SamplesFrom, quiet())
	if err != nil {
		t.Fatal(err)
	}
	devs, err := n.Read()
	if err != nil {
		t.Fatal(err)
	}
	return n, devs
}

func mockGPUs(t *testing.T) *dgxa100.Server {
	t.Helper()
	return fakenode.GPUs(func(i int) uint32 { return uint32(10 * i) })
}

func TestOpenNVMLModes(t *testing.T) {
	noDriver := &nvmlmock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	if n, err := OpenNVML(noDriver, ModeAuto, time.Second, quiet()); n != nil || err != nil {
		t.Fatalf("auto without a driver: %v, %v; want nil, nil", n, err)
	}
	if _, err := OpenNVML(noDriver, ModeOn, time.Second, quiet()); err == nil || !strings.Contains(err.Error(), "NVML is not available") {
		t.Fatalf("on without a driver: %v", err)
	}
	// off never calls Init (the mock would panic on an unset function).
	if n, err := OpenNVML(&nvmlmock.Interface{}, ModeOff, time.Second, quiet()); n != nil || err != nil {
		t.Fatalf("off: %v, %v", n, err)
	}
	if _, err := OpenNVML(noDriver, "maybe", time.Second, quiet()); err == nil {
		t.Fatal("a bad mode was accepted")
	}
}

func TestPodHoldingGPUs2And5(t *testing.T) {
	lib := mockGPUs(t)
	n, devs := readOnce(t, lib)
	uuid := func(i int) string { u, _ := lib.Devices[i].GetUUID(); return u }
	got, unknown := Attribute(devs, map[string][]string{
		"ns/llama-0": {uuid(2), uuid(5)}, // 20% by samples, 50% by rates
		"ns/phi-0":   {"3"},              // the index ID strategy
		"ns/odd-0":   {"GPU-not-on-this-node"},
	}, nil)
	if g := got["ns/llama-0"]; !g.HasUtilization || math.Abs(g.Utilization-0.35) > 1e-9 || math.Abs(g.Memory-(2.0+5)/2/40) > 1e-9 {
		t.Fatalf("llama-0 = %+v, want utilization 0.35, memory %v", g, (2.0+5)/2/40)
	}
	if g := got["ns/phi-0"]; math.Abs(g.Utilization-0.30) > 1e-9 {
		t.Fatalf("phi-0 = %+v, want 0.30", g)
	}
	if _, ok := got["ns/odd-0"]; ok || len(unknown) != 1 || unknown[0] != "GPU-not-on-this-node" {
		t.Fatalf("unknown IDs: %v, odd-0 %+v", unknown, got["ns/odd-0"])
	}
	// A second read averages only the samples newer than the first read's.
	devs, _ = n.Read()
	if d := devs.ByUUID[uuid(2)]; math.Abs(d.Utilization-0.2) > 1e-9 {
		t.Fatalf("second read of GPU 2 = %v", d.Utilization)
	}
}

// TestSharedGPUs: time-sliced and MPS-shared replicas of a GPU (the NVIDIA
// device plugin's "<id>::<n>") and GKE's shared and plain GPUs
// ("nvidia<i>/vgpu<n>", "nvidia<i>") count as that GPU: two pods sharing one
// each get its utilization. They counted as unknown before.
func TestSharedGPUs(t *testing.T) {
	lib := mockGPUs(t)
	devs, uuid := readAll(t, lib)
	got, unknown := Attribute(devs, map[string][]string{
		"ns/a":   {uuid(2) + "::0"},
		"ns/b":   {uuid(2) + "::1"},
		"ns/mps": {"4::3"},                           // index ID strategy, shared
		"ns/gke": {"nvidia6/vgpu0"},                  // GKE time-sharing
		"ns/two": {uuid(2) + "::2", uuid(2) + "::3"}, // two replicas of one GPU: counted once
		"ns/idx": {"nvidia1"},
	}, nil)
	want := map[string]float64{"ns/a": 0.2, "ns/b": 0.2, "ns/mps": 0.4, "ns/gke": 0.6, "ns/two": 0.2, "ns/idx": 0.1}
	for pod, w := range want {
		if g := got[pod]; !g.HasUtilization || math.Abs(g.Utilization-w) > 1e-9 {
			t.Errorf("%s = %+v, want utilization %v", pod, g, w)
		}
	}
	if len(unknown) != 0 {
		t.Errorf("unknown IDs: %v", unknown)
	}
}

// migOnGPU0 reads mock GPUs whose first is in MIG mode with two slots,
// one MIG device (MIG-1111, half its memory used) in slot.
func migOnGPU0(t *testing.T, slot int) Devices {
	t.Helper()
	lib := mockGPUs(t)
	gpu0 := lib.Devices[0].(*dgxa100.Device)
	mig := &nvmlmock.Device{
		GetUUIDFunc:       func() (string, nvml.Return) { return "MIG-1111", nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 10 << 30, Used: 5 << 30}, nvml.SUCCESS },
	}
	gpu0.GetMigModeFunc = func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS }
	gpu0.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 2, nvml.SUCCESS }
	gpu0.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		if j == slot {
			return mig, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	n, _ := OpenNVML(lib, ModeOn, time.Second, quiet())
	devs, err := n.Read()
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

func TestMIGDevicesReportMemoryOnly(t *testing.T) {
	devs := migOnGPU0(t, 0)
	got, unknown := Attribute(devs, map[string][]string{"ns/small-0": {"MIG-1111"}}, nil)
	g := got["ns/small-0"]
	if len(unknown) != 0 || g.HasUtilization || !g.HasMemory || g.Memory != 0.5 {
		t.Fatalf("MIG pod = %+v, unknown %v: want memory 0.5 and no utilization", g, unknown)
	}
}

// TestAMIGDeviceByTheDevicePluginsIndexIsKnown: a MIG device's index as
// the NVIDIA device plugin writes it, "<GPU>:<slot>" (its newMigDevice),
// and time-sliced "<GPU>:<slot>::<n>", is mapped as a GPU's index is, for
// a plugin that lists devices so to the kubelet (NVIDIA's lists UUIDs
// whatever its --device-id-strategy). Such IDs were counted as unknown.
func TestAMIGDeviceByTheDevicePluginsIndexIsKnown(t *testing.T) {
	devs := migOnGPU0(t, 1) // slot 0 empty
	got, unknown := Attribute(devs, map[string][]string{"ns/small-0": {"0:1"}, "ns/small-1": {"0:1::2"}, "ns/none": {"0:0"}}, nil)
	for _, pod := range []string{"ns/small-0", "ns/small-1"} {
		if g := got[pod]; g.HasUtilization || !g.HasMemory || g.Memory != 0.5 {
			t.Errorf("%s = %+v: want MIG 0:1's memory 0.5 and no utilization", pod, g)
		}
	}
	if g, ok := got["ns/none"]; ok && g.HasMemory || !slices.Equal(unknown, []string{"0:0"}) {
		t.Errorf("an empty slot's index: %+v, unknown %v; want it unknown", g, unknown)
	}
}

func TestPodResourcesOverAUnixSocketSurvivesAKubeletRestart(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	k := &fakenode.Kubelet{}
	all := []*podresourcesv1.PodResources{
		fakenode.Pod("ns", "llama-0", "nvidia.com/gpu", "GPU-a", "GPU-b"),
		fakenode.Pod("ns", "small-0", "nvidia.com/mig-1g.10gb", "MIG-c"),
		fakenode.Pod("ns", "cpu-0", "example.com/fpga", "fpga-0"),
	}
	k.SetPods(all...)
	stop := k.Serve(t, socket)
	pr, ctx := dialed(t, socket)
	got, ambiguous, err := pr.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got["ns/llama-0"]) != 2 || got["ns/small-0"][0] != "MIG-c" || len(ambiguous) != 0 {
		t.Fatalf("List = %v, %v left out", got, ambiguous)
	}

	// The kubelet restarts: the socket goes away and comes back.
	stop()
	k.SetPods(all[0])
	k.Serve(t, socket)
	for {
		got, _, err = pr.List(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("never reconnected: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(got) != 1 {
		t.Fatalf("after the restart: %v", got)
	}

	// A StatefulSet's pod recreated under its name, listed beside the one
	// it replaces: neither's GPUs are the name's (they were merged: the new
	// pod read the old one's GPUs as its own), until one is gone.
	k.SetPods(all[0], fakenode.Pod("ns", "llama-0", "nvidia.com/gpu", "GPU-c"), all[1])
	if got, ambiguous, err = pr.List(ctx); err != nil || len(got) != 1 || got["ns/small-0"] == nil || len(ambiguous) != 1 || len(ambiguous["ns/llama-0"]) != 3 {
		t.Fatalf("with llama-0 listed twice: List = %v, %v left out, %v; want small-0 alone, llama-0 left out", got, ambiguous, err)
	}
	k.SetPods(fakenode.Pod("ns", "llama-0", "nvidia.com/gpu", "GPU-c"), all[1])
	if got, ambiguous, err = pr.List(ctx); err != nil || !slices.Equal(got["ns/llama-0"], []string{"GPU-c"}) || len(ambiguous) != 0 {
		t.Fatalf("the old llama-0 gone: List = %v, %v left out, %v; want the new one's GPU-c", got, ambiguous, err)
	}
}

// TestShortIntervalsReadTheLastSamplePeriod: below SamplesFrom a read takes
// the driver's last sample period (GetUtilizationRates, microseconds), never
// GetSamples (about 2 ms of CPU a GPU); from it on, the samples' mean.
func TestShortIntervalsReadTheLastSamplePeriod(t *testing.T) {
	for _, c := range []struct {
		interval time.Duration
		samples  bool
		want     float64 // GPU 2: 20 % by its samples' mean, 25 % by its last period
	}{{time.Second, false, 0.25}, {SamplesFrom - time.Millisecond, false, 0.25}, {SamplesFrom, true, 0.20}, {time.Minute, true, 0.20}} {
		lib := mockGPUs(t)
		gpu2 := lib.Devices[2].(*dgxa100.Device)
		var sampled, rated int
		samples, rates := gpu2.GetSamplesFunc, gpu2.GetUtilizationRatesFunc
		gpu2.GetSamplesFunc = func(st nvml.SamplingType, last uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
			sampled++
			return samples(st, last)
		}
		gpu2.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			rated++
			u, r := rates()
			u.Gpu += 5
			return u, r
		}
		n, err := OpenNVML(lib, ModeOn, c.interval, quiet())
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			devs, err := n.Read()
			if err != nil {
				t.Fatal(err)
			}
			uuid, _ := gpu2.GetUUID()
			if d := devs.ByUUID[uuid]; math.Abs(d.Utilization-c.want) > 1e-9 || !d.HasUtilization {
				t.Fatalf("interval %v: GPU 2 utilization %v (%v), want %v", c.interval, d.Utilization, d.HasUtilization, c.want)
			}
		}
		if c.samples && (sampled != 3 || rated != 0) || !c.samples && (sampled != 0 || rated != 3) {
			t.Fatalf("interval %v: GetSamples %d times, GetUtilizationRates %d times over 3 reads", c.interval, sampled, rated)
		}
	}
}

// TestMIGModeIsReadOnceAMinute: a GPU's MIG mode changes only with a
// reset, and reading it costs 0.14 ms a GPU (an H200): read at the first
// read, then once it is a minute old.
func TestMIGModeIsReadOnceAMinute(t *testing.T) {
	lib := mockGPUs(t)
	gpu0 := lib.Devices[0].(*dgxa100.Device)
	reads, mode := 0, nvml.DEVICE_MIG_DISABLE
	gpu0.GetMigModeFunc = func() (int, int, nvml.Return) { reads++; return mode, mode, nvml.SUCCESS }
	gpu0.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 1, nvml.SUCCESS }
	gpu0.GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) {
		return &nvmlmock.Device{
			GetUUIDFunc:       func() (string, nvml.Return) { return "MIG-2222", nvml.SUCCESS },
			GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 10 << 30, Used: 1 << 30}, nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	n, _ := OpenNVML(lib, ModeOn, time.Second, quiet())
	now := time.Unix(1_700_000_000, 0)
	n.now = func() time.Time { return now }
	read := func() Devices {
		t.Helper()
		devs, err := n.Read()
		if err != nil {
			t.Fatal(err)
		}
		return devs
	}
	read()
	mode = nvml.DEVICE_MIG_ENABLE // enabled (after a reset) between reads
	for range 59 {
		now = now.Add(time.Second)
		if _, ok := read().ByUUID["MIG-2222"]; ok {
			t.Fatalf("MIG device listed %v after the mode was read as disabled", now.Sub(time.Unix(1_700_000_000, 0)))
		}
	}
	if reads != 1 {
		t.Fatalf("MIG mode read %d times in 59 s of reads, want once", reads)
	}
	now = now.Add(time.Second)
	if _, ok := read().ByUUID["MIG-2222"]; !ok || reads != 2 {
		t.Fatalf("a minute on: MIG mode read %d times, MIG device listed %v; want 2 and listed", reads, ok)
	}
	// A read that fails is not kept: the next read tries again.
	now = now.Add(time.Minute)
	gpu0.GetMigModeFunc = func() (int, int, nvml.Return) { reads++; return 0, 0, nvml.ERROR_UNKNOWN }
	if _, ok := read().ByUUID["MIG-2222"]; ok {
		t.Fatal("MIG device listed on a failed mode read")
	}
	gpu0.GetMigModeFunc = func() (int, int, nvml.Return) { reads++; return mode, mode, nvml.SUCCESS }
	now = now.Add(time.Second)
	if _, ok := read().ByUUID["MIG-2222"]; !ok || reads != 4 {
		t.Fatalf("after a failed mode read: read %d times, MIG device listed %v; want 4 and listed", reads, ok)
	}
}

// TestAGPUSharedAcrossTenantsIsNobodys: a GPU time-sliced between pods of
// two namespaces gave each the whole GPU's utilization and memory: one
// tenant read the other's load, and scaled on it. Such a GPU is now left
// out of both pods' values (a GPU a pod holds alone is still read), while
// pods of one namespace sharing a GPU each still get it. And GKE's
// "nvidia<N>" names the /dev/nvidiaN minor number, which NVML does not
// promise equals its index: it is looked up by minor number.
func TestAGPUSharedAcrossTenantsIsNobodys(t *testing.T) {
	lib := mockGPUs(t)
	// GPUs 1 and 7 with each other's minor numbers.
	lib.Devices[1].(*dgxa100.Device).Minor, lib.Devices[7].(*dgxa100.Device).Minor = 7, 1
	devs, uuid := readAll(t, lib)
	got, unknown := Attribute(devs, map[string][]string{
		"tenant-a/llama": {uuid(2) + "::0", uuid(3)},
		"tenant-b/phi":   {uuid(2) + "::1"},
		"tenant-c/x":     {uuid(4) + "::0"},
		"tenant-c/y":     {uuid(4) + "::1"},
		"tenant-d/gke":   {"nvidia7"}, // GPU 1, whose minor number is 7
	}, nil)
	if g := got["tenant-a/llama"]; !g.HasUtilization || math.Abs(g.Utilization-0.3) > 1e-9 {
		t.Errorf("tenant-a/llama = %+v, want GPU 3's 0.3 alone (GPU 2 is shared with tenant-b)", g)
	}
	if g, ok := got["tenant-b/phi"]; ok {
		t.Errorf("tenant-b/phi = %+v, want nothing: its GPU is shared with tenant-a", g)
	}
	for _, pod := range []string{"tenant-c/x", "tenant-c/y"} {
		if g := got[pod]; math.Abs(g.Utilization-0.4) > 1e-9 {
			t.Errorf("%s = %+v, want GPU 4's 0.4 (shared within one namespace)", pod, g)
		}
	}
	if g := got["tenant-d/gke"]; math.Abs(g.Utilization-0.1) > 1e-9 {
		t.Errorf("tenant-d/gke = %+v, want GPU 1's 0.1 (minor number 7)", g)
	}
	if len(unknown) != 0 {
		t.Errorf("unknown IDs: %v", unknown)
	}
}

// readAll reads lib's GPUs once, and names the UUID of GPU i.
func readAll(t *testing.T, lib *dgxa100.Server) (Devices, func(int) string) {
	t.Helper()
	n, err := OpenNVML(lib, ModeOn, time.Second, quiet())
	if err != nil {
		t.Fatal(err)
	}
	devs, err := n.Read()
	if err != nil {
		t.Fatal(err)
	}
	return devs, func(i int) string { u, _ := lib.Devices[i].GetUUID(); return u }
}

// TestADriverThatGoesAwayIsOpenedAgain: a driver unloaded, or reloaded at
// another version, made every read fail for good (NVML was initialized
// once), with pulse_agent_nvml_available still 1. Now such a read shuts
// NVML down (ErrLost), no call but Init is made until Reopen succeeds, and
// the GPUs are read again after it.
func TestADriverThatGoesAwayIsOpenedAgain(t *testing.T) {
	lib := mockGPUs(t)
	n, err := OpenNVML(lib, ModeOn, time.Second, quiet())
	if err != nil {
		t.Fatal(err)
	}
	count := lib.DeviceGetCountFunc
	var gone bool
	var counts, inits, shutdowns int
	lib.DeviceGetCountFunc = func() (int, nvml.Return) {
		counts++
		if gone {
			return 0, nvml.ERROR_DRIVER_NOT_LOADED
		}
		return count()
	}
	init, shutdown := lib.InitFunc, lib.ShutdownFunc
	lib.InitFunc = func() nvml.Return {
		inits++
		if gone {
			return nvml.ERROR_DRIVER_NOT_LOADED
		}
		return init()
	}
	lib.ShutdownFunc = func() nvml.Return { shutdowns++; return shutdown() }

	gone = true
	if _, err := n.Read(); !errors.Is(err, ErrLost) || !n.Lost() || shutdowns != 1 {
		t.Fatalf("a read with the driver gone: %v, lost %v, %d shutdowns; want ErrLost and NVML shut down", err, n.Lost(), shutdowns)
	}
	before := counts
	if _, err := n.Read(); !errors.Is(err, ErrLost) || counts != before {
		t.Fatalf("a read while lost: %v, %d NVML calls; want ErrLost and none", err, counts-before)
	}
	if err := n.Reopen(); err == nil || !n.Lost() || inits != 1 {
		t.Fatalf("Reopen with the driver still gone: %v (lost %v, %d inits)", err, n.Lost(), inits)
	}
	gone = false
	if err := n.Reopen(); err != nil || n.Lost() {
		t.Fatalf("Reopen with the driver back: %v", err)
	}
	devs, err := n.Read()
	if err != nil || len(devs.ByIndex) != 8 {
		t.Fatalf("a read once opened again: %d GPUs, %v", len(devs.ByIndex), err)
	}
	n.Close()
	if shutdowns != 2 {
		t.Fatalf("%d shutdowns, want 2 (one when lost, one at Close)", shutdowns)
	}
}

// TestAPodWithAGPUNotReadHasNoValueOfTheOthers: a pod on two GPUs one of
// which was not read (its handle or UUID failed, a GPU lost), or whose
// utilization read failed, has no utilization: the other's alone was sent
// as the pod's, and could drive a scale-down (the agent's warning and
// pulse_agent_nvml_errors_total's help say its pods then have none).
func TestAPodWithAGPUNotReadHasNoValueOfTheOthers(t *testing.T) {
	read := Device{UUID: "GPU-a", Utilization: 0.2, HasUtilization: true, MemUsed: 1, MemTotal: 4}
	devs := Devices{ByUUID: map[string]Device{"GPU-a": read}, ByIndex: map[string]string{}, ByMinor: map[string]string{}}
	got, unknown := Attribute(devs, map[string][]string{"ns/lost": {"GPU-a", "GPU-b"}, "ns/whole": {"GPU-a"}}, nil)
	if g := got["ns/lost"]; g.HasUtilization || g.HasMemory {
		t.Errorf("a pod one of whose GPUs was not read: %+v, want no value", g)
	}
	if g := got["ns/whole"]; !g.HasUtilization || g.Utilization != 0.2 || !g.HasMemory {
		t.Errorf("a pod whose GPU was read: %+v", g)
	}
	if len(unknown) != 1 || unknown[0] != "GPU-b" {
		t.Errorf("unknown %v, want GPU-b", unknown)
	}
	devs.ByUUID["GPU-b"] = Device{UUID: "GPU-b", MemUsed: 2, MemTotal: 4} // its utilization read failed
	got, _ = Attribute(devs, map[string][]string{"ns/half": {"GPU-a", "GPU-b"}}, nil)
	if g := got["ns/half"]; g.HasUtilization || !g.HasMemory || g.Memory != 0.375 {
		t.Errorf("a pod one of whose GPUs' utilization was not read: %+v, want its memory alone", g)
	}
}

// TestAGPUSharedWithAPodListedTwiceIsStillShared: a pod the kubelet lists
// twice under one name gets no GPU value, but its devices still count as
// its namespace's: left out whole, the time-sliced GPU it shares with
// another tenant's pod looked like that tenant's alone, which read the
// whole GPU's utilization, the first tenant's load with it.
func TestAGPUSharedWithAPodListedTwiceIsStillShared(t *testing.T) {
	devs := Devices{ByUUID: map[string]Device{"GPU-a": {UUID: "GPU-a", Utilization: 0.9, HasUtilization: true, MemUsed: 1, MemTotal: 4}},
		ByIndex: map[string]string{}, ByMinor: map[string]string{}}
	got, _ := Attribute(devs, map[string][]string{"tenant-b/phi-0": {"GPU-a::1"}}, map[string][]string{"tenant-a/llama-0": {"GPU-a::0", "GPU-a::2"}})
	if g, ok := got["tenant-b/phi-0"]; ok {
		t.Fatalf("tenant-b/phi-0 = %+v beside tenant-a's pod listed twice on its GPU; want no value", g)
	}
	if _, ok := got["tenant-a/llama-0"]; ok {
		t.Fatal("a pod listed twice got a value")
	}
}

// TestADriverNotLoadedYetIsOpenedLater: with --nvml=auto, a driver whose
// library is there and that is not loaded yet (the GPU Operator's driver
// container starting after the agent) turned NVML off for the agent's
// life. It is now opened lost: no call but Init until Reopen succeeds. A
// node with no library at all is still off, and --nvml=on still fails.
func TestADriverNotLoadedYetIsOpenedLater(t *testing.T) {
	lib := mockGPUs(t)
	init := lib.InitFunc
	loaded, inits := false, 0
	lib.InitFunc = func() nvml.Return {
		inits++
		if !loaded {
			return nvml.ERROR_DRIVER_NOT_LOADED
		}
		return init()
	}
	count := lib.DeviceGetCountFunc
	calls := 0
	lib.DeviceGetCountFunc = func() (int, nvml.Return) { calls++; return count() }
	if _, err := OpenNVML(lib, ModeOn, time.Second, quiet()); err == nil {
		t.Fatal("--nvml=on with the driver not loaded: no error")
	}
	n, err := OpenNVML(lib, ModeAuto, time.Second, quiet())
	if err != nil || n == nil || !n.Lost() {
		t.Fatalf("--nvml=auto with the driver not loaded: %v, %v; want NVML opened lost", n, err)
	}
	if _, err := n.Read(); !errors.Is(err, ErrLost) || calls != 0 {
		t.Fatalf("a read before the driver: %v, %d NVML calls; want ErrLost and none", err, calls)
	}
	if err := n.Reopen(); err == nil || !n.Lost() {
		t.Fatalf("Reopen with the driver still not loaded: %v", err)
	}
	loaded = true
	if err := n.Reopen(); err != nil || n.Lost() {
		t.Fatalf("Reopen with the driver loaded: %v", err)
	}
	if devs, err := n.Read(); err != nil || len(devs.ByIndex) != 8 {
		t.Fatalf("a read once the driver is loaded: %d GPUs, %v", len(devs.ByIndex), err)
	}
	n.Close()
}

// TestALargeNodesPodResourcesAreRead: List answers every container of
// every pod on the node, and past gRPC's 4 MiB it failed at every
// interval: a tenant's pods of thousands of containers cost every pod of
// the node its GPU values. Up to the kubelet's own 16 MiB it is read.
func TestALargeNodesPodResourcesAreRead(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	k := &fakenode.Kubelet{}
	big := fakenode.Pod("tenant", "many", "example.com/none")
	name := strings.Repeat("c", 250)
	for i := range 20000 { // about 5 MB
		big.Containers = append(big.Containers, &podresourcesv1.ContainerResources{Name: fmt.Sprintf("%s-%d", name, i)})
	}
	k.SetPods(fakenode.Pod("ns", "llama-0", "nvidia.com/gpu", "GPU-a"), big)
	k.Serve(t, socket)
	pr, ctx := dialed(t, socket)
	got, _, err := pr.List(ctx)
	if err != nil || len(got["ns/llama-0"]) != 1 {
		t.Fatalf("List of a node answering about 5 MB: %v, %v", got, err)
	}
}

// dialed is a client of the kubelet at socket, closed when the test ends,
// and a context of 10 s for its calls.
func dialed(t *testing.T, socket string) (*PodResources, context.Context) {
	t.Helper()
	pr, err := DialPodResources(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pr.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return pr, ctx
}

// TestTheDevicePluginsSharedNamesAreGPUs: with time-slicing or MPS and
// renameByDefault, the NVIDIA device plugin advertises nvidia.com/gpu.shared
// (and nvidia.com/mig-<profile>.shared): their pods had no GPU values.
func TestTheDevicePluginsSharedNamesAreGPUs(t *testing.T) {
	for name, want := range map[string]bool{
		"nvidia.com/gpu": true, "nvidia.com/gpu.shared": true, "nvidia.com/mig-1g.10gb": true, "nvidia.com/mig-1g.10gb.shared": true,
		"nvidia.com/gpu-shared": false, "example.com/gpu.shared": false, "nvidia.com/gpux": false, ".shared": false,
	} {
		if IsGPUResource(name) != want {
			t.Errorf("IsGPUResource(%q) = %v, want %v", name, !want, want)
		}
	}
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	k := &fakenode.Kubelet{}
	// A resource the device plugin's config renames (resources.gpus[].name,
	// sharing's rename) is nvidia.com's with GPU or MIG UUIDs: their pods
	// had no GPU value. The network operator's nvidia.com devices are not.
	k.SetPods(fakenode.Pod("ns", "llama-0", "nvidia.com/gpu.shared", "GPU-a::0"), fakenode.Pod("ns", "a100-0", "nvidia.com/a100", "GPU-b"),
		fakenode.Pod("ns", "ts-0", "nvidia.com/gpu-ts", "GPU-c::1"), fakenode.Pod("ns", "nic-0", "nvidia.com/rdma_shared_device_a", "0000:3b:00.0"))
	k.Serve(t, socket)
	pr, ctx := dialed(t, socket)
	got, _, err := pr.List(ctx)
	if err != nil || len(got["ns/llama-0"]) != 1 || len(got["ns/a100-0"]) != 1 || len(got["ns/ts-0"]) != 1 || len(got["ns/nic-0"]) != 0 {
		t.Fatalf("List = %v, %v; want llama-0's shared GPU, a100-0's and ts-0's renamed ones, and nic-0's NIC left out", got, err)
	}
}

// utilizationSamples is a GetSamplesFunc of the driver's buffer: one
// sample a second, seconds 0 to newest(), each value(second) percent, those
// past the mark asked for.
func utilizationSamples(newest func() uint64, value func(uint64) uint32) func(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
	const base, second = uint64(1_700_000_000_000_000), uint64(1_000_000)
	return func(_ nvml.SamplingType, last uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
		var out []nvml.Sample
		for i := uint64(0); i <= newest(); i++ {
			var sv [8]byte
			binary.LittleEndian.PutUint32(sv[:4], value(i))
			if ts := base + i*second; ts > last {
				out = append(out, nvml.Sample{TimeStamp: ts, SampleValue: sv})
			}
		}
		return nvml.VALUE_TYPE_UNSIGNED_INT, out, nvml.SUCCESS
	}
}

// podChange is a GPU's utilization, a second at a time: the pod before's
// 100 % until second at, then 20 %.
func podChange(at uint64) func(uint64) uint32 {
	return func(i uint64) uint32 {
		if i < at {
			return 100
		}
		return 20
	}
}

// TestAFirstSampledReadReachesBackOneInterval: the driver keeps its
// utilization samples for longer than a read interval, and the first read
// (at the agent's start, after a Reopen) took the mean of all of them: a
// GPU busy for a pod gone before was read as busy for the pod it holds
// now. The first read takes one interval before the newest sample, as
// every later read does.
func TestAFirstSampledReadReachesBackOneInterval(t *testing.T) {
	lib := mockGPUs(t)
	gpu1 := lib.Devices[1].(*dgxa100.Device)
	// 15 s of the pod before at 100 %, then 5 s at 20 %.
	gpu1.GetSamplesFunc = utilizationSamples(func() uint64 { return 19 }, podChange(15))
	_, devs := readOnce(t, lib)
	uuid, _ := gpu1.GetUUID()
	if d := devs.ByUUID[uuid]; !d.HasUtilization || math.Abs(d.Utilization-0.20) > 1e-9 {
		t.Fatalf("the first read: utilization %v (%v), want 0.20, the last interval's samples alone", d.Utilization, d.HasUtilization)
	}
}

// TestASampleThatIsNoUtilizationIsLeftOut: NVML's samples are a C union
// whose type the driver names; a double that is NaN or infinite, or a
// signed value below 0, is no utilization. The mean took them in: a NaN
// sample made the GPU's utilization NaN, with HasUtilization set (the
// wire's encoder sent it as 0, an idle GPU), an infinite one 1, a negative
// one a utilization below 0. A read's utilization is within 0..1 from the
// samples that are, or (none being so) the last sample period's.
func TestASampleThatIsNoUtilizationIsLeftOut(t *testing.T) {
	dbl := func(v float64) (b [8]byte) { binary.LittleEndian.PutUint64(b[:], math.Float64bits(v)); return }
	i32 := func(v int32) (b [8]byte) { binary.LittleEndian.PutUint32(b[:4], uint32(v)); return }
	for name, c := range map[string]struct {
		vt     nvml.ValueType
		values [][8]byte
	}{
		"a NaN double":       {nvml.VALUE_TYPE_DOUBLE, [][8]byte{dbl(40), dbl(math.NaN()), dbl(40)}},
		"an infinite double": {nvml.VALUE_TYPE_DOUBLE, [][8]byte{dbl(40), dbl(math.Inf(1)), dbl(40)}},
		"a negative int":     {nvml.VALUE_TYPE_SIGNED_INT, [][8]byte{i32(40), i32(-1000), i32(40)}},
		"only a NaN":         {nvml.VALUE_TYPE_DOUBLE, [][8]byte{dbl(math.NaN())}},
	} {
		lib := mockGPUs(t)
		gpu1 := lib.Devices[1].(*dgxa100.Device)
		gpu1.GetSamplesFunc = func(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
			var out []nvml.Sample
			for i, v := range c.values {
				out = append(out, nvml.Sample{TimeStamp: uint64(1_700_000_000_000_000 + i*200_000), SampleValue: v})
			}
			return c.vt, out, nvml.SUCCESS
		}
		_, devs := readOnce(t, lib)
		uuid, _ := gpu1.GetUUID()
		d := devs.ByUUID[uuid]
		if !d.HasUtilization && name != "only a NaN" || d.HasUtilization && !(d.Utilization >= 0 && d.Utilization <= 1) {
			t.Errorf("%s: utilization %v (%v), want one within 0..1 (none only of a NaN alone)", name, d.Utilization, d.HasUtilization)
		} else if d.HasUtilization && name != "only a NaN" && math.Abs(d.Utilization-0.4) > 1e-9 {
			t.Errorf("%s: utilization %v, want 0.4 (the samples that are utilizations)", name, d.Utilization)
		}
	}
}

// TestASampledReadAfterAGapReachesBackOneInterval: at intervals of
// SamplesFrom or more a read averages the driver's samples since the
// newest one the last read of that GPU took. A read whose GetSamples
// failed (or found none newer) kept that mark, so the next read reached
// back two intervals (more after more such reads, up to the driver's 14 s)
// though the agent takes its values as beginning at the read before it
// (README: "a read's values begin at the read before it"): a pod listed
// after the earlier read, and before the failed one, was given the load of
// the pod the GPU held before it. Every read takes at most one interval
// before its newest sample, as the first does.
func TestASampledReadAfterAGapReachesBackOneInterval(t *testing.T) {
	lib := mockGPUs(t)
	gpu1 := lib.Devices[1].(*dgxa100.Device)
	now, fail := uint64(5), false // the driver's newest sample, in seconds
	// The pod before at 100 % until second 7, then this one's 20 %.
	samples := utilizationSamples(func() uint64 { return now }, podChange(8))
	gpu1.GetSamplesFunc = func(st nvml.SamplingType, last uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
		if fail {
			return 0, nil, nvml.ERROR_UNKNOWN
		}
		return samples(st, last)
	}
	n, _ := readOnce(t, lib) // second 5
	fail, now = true, 10     // second 10: GetSamples fails, the last period read
	if _, err := n.Read(); err != nil {
		t.Fatal(err)
	}
	fail, now = false, 15 // second 15: the interval (10, 15] is the new pod's alone
	devs, err := n.Read()
	if err != nil {
		t.Fatal(err)
	}
	uuid, _ := gpu1.GetUUID()
	if d := devs.ByUUID[uuid]; !d.HasUtilization || math.Abs(d.Utilization-0.20) > 1e-9 {
		t.Fatalf("the read after a failed one: utilization %v (%v), want 0.20, the last interval's samples alone (the pod before's from seconds 6-7 taken in)", d.Utilization, d.HasUtilization)
	}
}
