// Command pulse-relay carries many agents' streams to the aggregator
// replicas on a few connections (pkg/relay). See README.md for its flags.
package main

import (
	"log/slog"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/relay"
)

func main() {
	o := relay.NewOptions()
	app.Main("pulse-relay", o, func(log *slog.Logger) (app.Runner, error) { return relay.NewServer(o, log) })
}
