//go:build nvml

// Run on a machine with an NVIDIA driver: go test -tags nvml -run TestRealDriver -v ./pkg/gpu
package gpu

import (
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestRealDriver(t *testing.T) {
	n, err := OpenNVML(nvml.New(), ModeOn, slog.New(slog.NewTextHandler(os.Stderr, nil)))
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
