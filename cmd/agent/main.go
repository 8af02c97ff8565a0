// Command pulse-agent scrapes the vLLM pods of its node every second and
// streams their values to the pulse aggregators. See README.md for its flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/logging"
)

func main() {
	o := agent.NewOptions()
	o.AddFlags(flag.CommandLine)
	flag.Parse()
	log, err := logging.New(os.Stderr, o.LogFormat, o.LogLevel)
	if err == nil {
		err = o.Validate()
	}
	var a *agent.Agent
	if err == nil {
		a, err = agent.New(o, log)
	}
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = a.Run(ctx)
		stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pulse-agent:", err)
		os.Exit(1)
	}
}
