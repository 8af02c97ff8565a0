// Command pulsectl checks ScaledObjects and workload annotations offline
// with the aggregator's own parser and limits, asks a running scaler what
// KEDA would, and watches its decisions (README.md, "Checking and asking: pulsectl").
package main

import (
	"os"

	"github.com/pulse-io/pulse/pkg/ctl"
)

func main() { os.Exit(ctl.Main(os.Args[1:], os.Stdout, os.Stderr)) }
