// Command pulse-relay carries many agents' streams to the aggregator
// replicas on a few connections (pkg/relay). See README.md for its flags.
package main

import (
	"log/slog"
	"os"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/relay"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		// The kubelet's exec probe of --health-addr (deploy/aggregator's
		// relay).
		os.Exit(app.Probe("pulse-relay", os.Args[2:], os.Stdout))
	}
	o := relay.NewOptions()
	app.Main("pulse-relay", o, func(log *slog.Logger) (app.Runner, error) { return relay.NewServer(o, log) })
}
