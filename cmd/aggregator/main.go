// Command pulse-aggregator holds per-pod state fed by pulse agents and serves
// it to KEDA as an external-push scaler. See README.md for its flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/pulse-io/pulse/pkg/aggregator"
	"github.com/pulse-io/pulse/pkg/logging"
)

func main() {
	o := aggregator.NewOptions()
	o.AddFlags(flag.CommandLine)
	flag.Parse()
	log, err := logging.New(os.Stderr, o.LogFormat, o.LogLevel)
	if err == nil {
		err = o.Validate()
	}
	var a *aggregator.Aggregator
	if err == nil {
		a, err = aggregator.New(o, log)
	}
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = a.Run(ctx)
		stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pulse-aggregator:", err)
		os.Exit(1)
	}
}
