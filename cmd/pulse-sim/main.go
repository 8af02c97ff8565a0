// Command pulse-sim replays a request trace against simulated vLLM replicas
// and scores autoscaling pipelines side by side (docs/simulation.md).
package main

import (
	"os"
	"runtime/debug"

	"github.com/pulse-io/pulse/pkg/sim/cli"
)

// gcPercent is the GC's target for pulse-sim unless GOGC is set: a suite is
// CPU-bound runs over a small live heap, and at Go's default of 100 the GC
// took about a fifth of a suite's time (the benchmark suite at one seed:
// 106 s at 100, 84 s at 400, for 121 MB of peak RSS against 245 MB;
// docs/performance.md, "pulse-sim's own speed").
const gcPercent = 400

func main() {
	if os.Getenv("GOGC") == "" { // as the Makefile's ${GOGC:-400}
		debug.SetGCPercent(gcPercent)
	}
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
