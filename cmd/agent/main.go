// Command pulse-agent scrapes the vLLM pods of its node every second and
// streams their values to the pulse aggregators. See README.md for its flags.
package main

import (
	"log/slog"
	"os"
	"runtime"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/app"
)

func main() {
	// The agent's work is a few milliseconds of CPU a second; more Ps than
	// two only add idle threads to wake (on a 16-P runtime it cost 60 %
	// more CPU: docs/performance.md). GOMAXPROCS, when set, wins.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(min(runtime.GOMAXPROCS(0), agent.MaxProcs))
	}
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		// The kubelet's exec probe of --health-addr (deploy/daemonset).
		os.Exit(app.Probe("pulse-agent", os.Args[2:], os.Stdout))
	}
	o := agent.NewOptions()
	app.Main("pulse-agent", o, func(log *slog.Logger) (app.Runner, error) { return agent.New(o, log) })
}
