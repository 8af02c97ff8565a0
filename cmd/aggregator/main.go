// Command pulse-aggregator holds per-pod state fed by pulse agents and serves
// it to KEDA as an external-push scaler. See README.md for its flags.
package main

import (
	"log/slog"

	"github.com/pulse-io/pulse/pkg/aggregator"
	"github.com/pulse-io/pulse/pkg/app"
)

func main() {
	o := aggregator.NewOptions()
	app.Main("pulse-aggregator", o, func(log *slog.Logger) (app.Runner, error) { return aggregator.New(o, log) })
}
