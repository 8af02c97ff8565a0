// Command pulse-aggregator holds per-pod state fed by pulse agents and serves
// it to KEDA as an external-push scaler. See README.md for its flags.
package main

import (
	"log/slog"
	"os"

	"github.com/pulse-io/pulse/pkg/aggregator"
	"github.com/pulse-io/pulse/pkg/app"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		// The kubelet's exec probe of --health-addr (deploy/aggregator).
		os.Exit(app.Probe("pulse-aggregator", os.Args[2:], os.Stdout))
	}
	o := aggregator.NewOptions()
	app.Main("pulse-aggregator", o, func(log *slog.Logger) (app.Runner, error) {
		app.SetGCPercent(o.Store.GCPercent, log)
		return aggregator.New(o, log)
	})
}
