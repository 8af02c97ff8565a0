// Command pulse-sim replays a request trace against simulated vLLM replicas
// and scores autoscaling pipelines side by side (docs/simulation.md).
package main

import (
	"os"

	"github.com/pulse-io/pulse/pkg/sim/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
