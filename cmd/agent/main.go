// Command pulse-agent scrapes the vLLM pods of its node every second and
// streams their values to the pulse aggregators. See README.md for its flags.
package main

import (
	"log/slog"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/app"
)

func main() {
	o := agent.NewOptions()
	app.Main("pulse-agent", o, func(log *slog.Logger) (app.Runner, error) { return agent.New(o, log) })
}
