// Package gpu reads GPU utilization and memory with NVML and attributes GPUs
// to pods through the kubelet's pod-resources API.
//
// NVML is reached only through nvml.Interface, and every call after Init is
// made only once Init succeeded: with no driver, a call past a failed Init
// kills the process.
package gpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/pulse-io/pulse/pkg/logging"
)

// NVML modes of the agent's --nvml flag.
const (
	ModeAuto = "auto" // use NVML when a driver is there; say once when not
	ModeOn   = "on"   // require NVML: no driver is an error
	ModeOff  = "off"  // never load NVML
)

// Device is one GPU, or one MIG device, at one read.
type Device struct {
	UUID string
	// Utilization is 0..1: the driver's last sample period, or at intervals
	// of SamplesFrom or more the mean of its samples since the last read;
	// HasUtilization is false where NVML has none (a MIG device).
	Utilization    float64
	HasUtilization bool
	MemUsed        uint64
	MemTotal       uint64
}

// Devices are the devices of one read, by UUID, with full GPUs also by
// index (the device plugin's index ID strategy).
type Devices struct {
	ByUUID  map[string]Device
	ByIndex map[string]string // "0" → UUID
	// ByMinor: full GPUs by their /dev/nvidiaN minor number, which GKE's
	// device plugin names them by ("nvidia3"); NVML does not promise it
	// follows the index.
	ByMinor map[string]string
}

// SamplesFrom is the shortest read interval at which a GPU's utilization is
// the mean of the driver's samples since the last read (GetSamples; the
// driver keeps about 14 s of them on an H200). That call costs about 2 ms of
// CPU a GPU whatever span it is asked for (one H200, docs/performance.md):
// 0.2 % of a core a GPU at a 1 s interval, more than the rest of the agent
// on a node of two GPUs or more. At shorter intervals a read takes the
// driver's last sample period (GetUtilizationRates, microseconds; 1/6 s to
// 1 s by product; the H200's samples come every 200 ms): one period an
// interval, whose mean over a window estimates the window's utilization.
const SamplesFrom = 5 * time.Second

// migEvery is how often a GPU's MIG mode is read again (0.14 ms a GPU on an
// H200; the mode changes only with a GPU reset or unbind): MIG devices of a
// GPU put in MIG mode are listed within a minute, and until then their pods'
// devices count as unknown. The MIG devices of a GPU in MIG mode are listed
// at every read.
const migEvery = time.Minute

// NVML reads the node's devices.
type NVML struct {
	lib     nvml.Interface
	lost    bool              // the driver went away: shut down, no call but Init until Reopen
	samples bool              // average the driver's samples (see SamplesFrom)
	every   time.Duration     // the read interval
	last    map[string]uint64 // per GPU UUID, the newest utilization sample seen
	mig     map[string]migMode
	now     func() time.Time
	// mismatchOnly: every Init of this process found the driver at another
	// version than the library (the host's library upgraded, its driver
	// not reloaded yet: a reboot pending). A new container mounts the same
	// library, so that is no upgrade under the agent (ErrVersionMismatch),
	// and the agent waits for the driver without restarting.
	mismatchOnly bool
}

// migMode is a GPU's MIG mode as read at a time.
type migMode struct {
	enabled bool
	at      time.Time
}

// ErrUnavailable is returned by OpenNVML in ModeOn when no driver is there.
var ErrUnavailable = errors.New("NVML is not available")

// OpenNVML initializes NVML as mode says, for reads every interval (see
// SamplesFrom). In ModeAuto with no driver library it logs once and
// returns nil, nil: the agent goes on without GPU values (nothing mounts
// the library into a running container: under the GPU Operator, an agent
// started before the NVIDIA runtime was the node's default has none for
// its life; the README says to give it the runtime's class). With the
// library there and its driver not loaded yet (a host's driver package
// installed, its module not loaded), it returns NVML lost: the agent
// initializes it again (Reopen) until the driver is there, as after a
// driver went away (it was off for the agent's life).
func OpenNVML(lib nvml.Interface, mode string, interval time.Duration, log *slog.Logger) (*NVML, error) {
	switch mode {
	case ModeOff:
		return nil, nil
	case ModeAuto, ModeOn:
	default:
		return nil, fmt.Errorf("--nvml %q: want auto, on or off", mode)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		err := fmt.Errorf("%w: init: %s", ErrUnavailable, nvml.ErrorString(ret))
		switch {
		case mode == ModeOn:
			return nil, err
		case driverGone(ret):
			// The library loaded (ERROR_LIBRARY_NOT_FOUND is not this):
			// Init may be called again, and nothing else until it works.
			mismatch := ret == nvml.ERROR_LIB_RM_VERSION_MISMATCH
			if mismatch {
				log.Warn("the NVIDIA driver loaded is not the version of the NVML library mounted in the agent's container (the host's driver upgraded, not reloaded yet: a reboot pending?); GPU utilization is read once they agree (NVML initialized again every interval, backing off to 30s); a restart of the agent mounts the same library", logging.KeyErr, err)
			} else {
				log.Info("NVML's driver is not loaded yet; GPU utilization is read once it is (NVML initialized again every interval, backing off to 30s)", logging.KeyErr, err)
			}
			return &NVML{lib: lib, lost: true, mismatchOnly: mismatch, samples: interval >= SamplesFrom, every: interval, last: map[string]uint64{}, mig: map[string]migMode{}, now: time.Now}, nil
		}
		log.Info("NVML unavailable; GPU utilization will not be reported (on a GPU node: the container was made without the NVIDIA runtime's libraries; with the GPU Operator, set the chart's runtimeClassName to nvidia)", logging.KeyErr, err)
		return nil, nil
	}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		log.Info("NVML initialized", logging.KeyDriver, v)
	}
	return &NVML{lib: lib, samples: interval >= SamplesFrom, every: interval, last: map[string]uint64{}, mig: map[string]migMode{}, now: time.Now}, nil
}

// Close shuts NVML down.
func (n *NVML) Close() {
	if n != nil && !n.lost {
		_ = n.lib.Shutdown() // at exit: nothing to do if it fails
	}
}

// ErrLost is a read's error when the driver went away (unloaded, reloaded
// at another version): NVML is shut down, and no call but Reopen's Init is
// made until Reopen succeeds.
var ErrLost = errors.New("the NVIDIA driver went away")

// driverGone says whether ret means NVML must be initialized again.
func driverGone(ret nvml.Return) bool {
	return ret == nvml.ERROR_UNINITIALIZED || ret == nvml.ERROR_DRIVER_NOT_LOADED || ret == nvml.ERROR_LIB_RM_VERSION_MISMATCH
}

// Lost reports whether NVML is shut down after the driver went away.
func (n *NVML) Lost() bool { return n.lost }

// ErrVersionMismatch is Reopen's error when the driver loaded is not the
// version of the NVML library this process loaded: a driver upgraded while
// the agent runs (not so when every Init of the process found that: then
// its error is ErrUnavailable's, as a driver not loaded yet). The library stays mapped in the process, and the
// container's is the one mounted at its start, so only a new container
// (the driver's library mounted into it) reads the GPUs again.
var ErrVersionMismatch = errors.New("the NVIDIA driver loaded is not this process's NVML library's version")

// Reopen initializes NVML again after ErrLost (a driver reloaded or
// upgraded); nil when it is open.
func (n *NVML) Reopen() error {
	if !n.lost {
		return nil
	}
	ret := n.lib.Init()
	if ret != nvml.ERROR_LIB_RM_VERSION_MISMATCH {
		n.mismatchOnly = false
	}
	if ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIB_RM_VERSION_MISMATCH && !n.mismatchOnly {
			return fmt.Errorf("%w: init: %s", ErrVersionMismatch, nvml.ErrorString(ret))
		}
		return fmt.Errorf("%w: init: %s", ErrUnavailable, nvml.ErrorString(ret))
	}
	n.lost = false
	clear(n.last) // the samples' clock starts again with the driver
	clear(n.mig)
	return nil
}

// Read reads every device. A device that fails is left out and its error
// joined into the returned one; the others are returned.
func (n *NVML) Read() (Devices, error) {
	out := Devices{ByUUID: map[string]Device{}, ByIndex: map[string]string{}, ByMinor: map[string]string{}}
	if n.lost {
		return out, ErrLost
	}
	count, ret := n.lib.DeviceGetCount()
	if driverGone(ret) {
		_ = n.lib.Shutdown()
		n.lost = true
		return out, fmt.Errorf("%w: count GPUs: %s", ErrLost, nvml.ErrorString(ret))
	}
	if ret != nvml.SUCCESS {
		return out, fmt.Errorf("count GPUs: %s", nvml.ErrorString(ret))
	}
	var errs []error
	for i := range count {
		dev, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("GPU %d: handle: %s", i, nvml.ErrorString(ret)))
			continue
		}
		d, err := n.readGPU(dev)
		if err != nil {
			errs = append(errs, fmt.Errorf("GPU %d: %w", i, err))
			continue
		}
		out.ByUUID[d.UUID] = d
		out.ByIndex[strconv.Itoa(i)] = d.UUID
		if minor, ret := dev.GetMinorNumber(); ret == nvml.SUCCESS {
			out.ByMinor[strconv.Itoa(minor)] = d.UUID
		}
		for _, m := range n.readMIG(dev, d.UUID) {
			out.ByUUID[m.UUID] = m.Device
			// A MIG device's index as the NVIDIA device plugin
			// writes it, "<GPU>:<slot>" (internal/rm/nvml_devices.go,
			// newMigDevice), for a plugin that lists devices so
			// (NVIDIA's lists UUIDs to the kubelet whatever its
			// --device-id-strategy), as a GPU's index is.
			out.ByIndex[strconv.Itoa(i)+":"+strconv.Itoa(m.slot)] = m.UUID
		}
	}
	return out, errors.Join(errs...)
}

func (n *NVML) readGPU(dev nvml.Device) (Device, error) {
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("uuid: %s", nvml.ErrorString(ret))
	}
	d := Device{UUID: uuid}
	d.Utilization, d.HasUtilization = n.utilization(dev, uuid)
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		d.MemUsed, d.MemTotal = mem.Used, mem.Total
	}
	return d, nil
}

// utilization is, at intervals of SamplesFrom or more, the mean of the
// driver's utilization samples newer than the last read (GetSamples);
// otherwise, or where there are none, the driver's last sample period
// (GetUtilizationRates).
func (n *NVML) utilization(dev nvml.Device, uuid string) (float64, bool) {
	if n.samples {
		if u, ok := n.sampled(dev, uuid); ok {
			return u, true
		}
	}
	if u, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		return math.Min(float64(u.Gpu)/100, 1), true
	}
	return 0, false
}

// sampled averages the driver's utilization samples newer than the last
// read; false when there are none. The first read (at the start, after a
// Reopen) takes the samples of one interval before the newest, as every
// later read does: the driver's buffer reaches further back, to a pod the
// GPU held before the pods it is read for now.
func (n *NVML) sampled(dev nvml.Device, uuid string) (float64, bool) {
	since := n.last[uuid]
	vt, samples, ret := dev.GetSamples(nvml.GPU_UTILIZATION_SAMPLES, since)
	if ret == nvml.SUCCESS && len(samples) > 0 {
		// At most one interval before the newest sample, at every read: a
		// read that took none (GetSamples failed, the GPU not read) left
		// the mark where it was, and the next reached back to a pod the
		// GPU held before the one the agent reads it for.
		since = max(since, firstSince(samples, n.every))
		var sum float64
		newest := since
		k := 0
		for _, s := range samples {
			if s.TimeStamp <= since {
				continue
			}
			newest = max(newest, s.TimeStamp)
			// A NaN, a negative or an infinite value is no utilization.
			if v := sampleValue(vt, s.SampleValue); v >= 0 && !math.IsInf(v, 1) {
				sum += v
				k++
			}
		}
		n.last[uuid] = newest
		if k > 0 {
			return math.Min(sum/float64(k)/100, 1), true
		}
	}
	return 0, false
}

// firstSince is the earliest mark a read takes samples after: one
// interval (in the samples' microseconds) before the newest of them, or 0.
func firstSince(samples []nvml.Sample, every time.Duration) uint64 {
	var newest uint64
	for _, s := range samples {
		newest = max(newest, s.TimeStamp)
	}
	if back := uint64(every / time.Microsecond); newest > back {
		return newest - back
	}
	return 0
}

// sampleValue decodes an NVML sample (a C union) of type vt.
func sampleValue(vt nvml.ValueType, v [8]byte) float64 {
	switch vt {
	case nvml.VALUE_TYPE_DOUBLE:
		return math.Float64frombits(binary.LittleEndian.Uint64(v[:]))
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		return float64(binary.LittleEndian.Uint64(v[:]))
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return float64(int64(binary.LittleEndian.Uint64(v[:])))
	case nvml.VALUE_TYPE_SIGNED_INT:
		return float64(int32(binary.LittleEndian.Uint32(v[:4])))
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return float64(binary.LittleEndian.Uint16(v[:2]))
	}
	return float64(binary.LittleEndian.Uint32(v[:4]))
}

// migDevice is a MIG device read, with its slot on its GPU (the index
// NVML's GetMigDeviceHandleByIndex takes).
type migDevice struct {
	Device
	slot int
}

// readMIG reads the MIG devices of a GPU in MIG mode: memory only, since
// NVML reports no utilization per MIG device. The mode is read again once
// it is migEvery old; a read that fails (other than NOT_SUPPORTED: no MIG
// on this GPU) is not kept, and is tried again at the next read.
func (n *NVML) readMIG(dev nvml.Device, uuid string) []migDevice {
	now := n.now()
	m, ok := n.mig[uuid]
	if !ok || now.Sub(m.at) >= migEvery {
		mode, _, ret := dev.GetMigMode()
		m = migMode{enabled: ret == nvml.SUCCESS && mode == nvml.DEVICE_MIG_ENABLE, at: now}
		if ret == nvml.SUCCESS || ret == nvml.ERROR_NOT_SUPPORTED {
			n.mig[uuid] = m
		}
	}
	if !m.enabled {
		return nil
	}
	maxCount, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil
	}
	var out []migDevice
	for j := range maxCount {
		mig, ret := dev.GetMigDeviceHandleByIndex(j)
		if ret != nvml.SUCCESS {
			continue // an empty slot
		}
		uuid, ret := mig.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		d := Device{UUID: uuid}
		if mem, ret := mig.GetMemoryInfo(); ret == nvml.SUCCESS {
			d.MemUsed, d.MemTotal = mem.Used, mem.Total
		}
		out = append(out, migDevice{d, j})
	}
	return out
}
