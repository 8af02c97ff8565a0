package fakenode

import (
	"encoding/binary"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// GPUs is a DGX A100 (go-nvml's mock) whose GPU i is busy(i) percent busy
// and holds i GiB of its 40. The mock wires no utilization call, so GPUs
// sets them: GPUs 0-3 answer GetSamples (two samples per read, busy-5 and
// busy+5, so their mean is busy), the others answer NOT_SUPPORTED there and
// are read through GetUtilizationRates.
func GPUs(busy func(i int) uint32) *dgxa100.Server {
	s := dgxa100.New()
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.MemoryInfo = nvml.Memory{Total: 40 << 30, Used: uint64(i) << 30}
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: busy(i)}, nvml.SUCCESS
		}
		var ts uint64
		dev.GetSamplesFunc = func(st nvml.SamplingType, last uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
			if i >= 4 || st != nvml.GPU_UTILIZATION_SAMPLES {
				return 0, nil, nvml.ERROR_NOT_SUPPORTED
			}
			b := busy(i)
			lo := b - min(b, 5)
			var out []nvml.Sample
			for _, v := range []uint32{lo, 2*b - lo} {
				ts++
				var sv [8]byte
				binary.LittleEndian.PutUint32(sv[:4], v)
				out = append(out, nvml.Sample{TimeStamp: last + ts, SampleValue: sv})
			}
			return nvml.VALUE_TYPE_UNSIGNED_INT, out, nvml.SUCCESS
		}
	}
	return s
}

// UUID returns GPU i's UUID.
func UUID(s *dgxa100.Server, i int) string {
	u, _ := s.Devices[i].GetUUID()
	return u
}
