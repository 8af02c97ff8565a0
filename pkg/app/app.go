// Package app is what pulse's two binaries share around their components:
// flags, the logger, validation, signals and the exit code.
package app

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/pulse-io/pulse/pkg/logging"
)

// Options is a binary's option set.
type Options interface {
	AddFlags(fs *flag.FlagSet)
	Validate() error
	// LogOptions returns the --log-format and --log-level values.
	LogOptions() logging.Options
}

// Runner is a wired component.
type Runner interface {
	Run(ctx context.Context) error
}

// Main parses the flags into o, builds the logger, validates, wires with
// build and runs until SIGINT or SIGTERM. It exits 1 on any error.
func Main(name string, o Options, build func(*slog.Logger) (Runner, error)) {
	o.AddFlags(flag.CommandLine)
	flag.Parse()
	if err := run(o, build); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

func run(o Options, build func(*slog.Logger) (Runner, error)) error {
	lo := o.LogOptions()
	log, err := lo.Logger(os.Stderr)
	if err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return err
	}
	r, err := build(log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return r.Run(ctx)
}
