// Package app is what pulse's two binaries share around their components:
// flags, the logger, validation, signals and the exit code.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/version"
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

// Main parses the flags into o, validates them, builds the logger, wires
// with build and runs until SIGINT or SIGTERM. A bad flag exits 2, any other
// error 1, each said in one line (a multi-error, one line per problem).
func Main(name string, o Options, build func(*slog.Logger) (Runner, error)) {
	if code, done := Parse(name, os.Args[1:], os.Stdout, os.Stderr, o); done {
		os.Exit(code)
	}
	if err := run(o, build); err != nil {
		Report(os.Stderr, name, err)
		os.Exit(1)
	}
}

// Parse parses args into o's flags. done is true when the program should
// exit with code: after --help (the flags, on stdout, 0), --version (the
// name and version, on stdout, 0) or a bad flag (the
// error and a pointer at --help, on stderr, 2) rather than the whole usage.
func Parse(name string, args []string, stdout, stderr io.Writer, o Options) (code int, done bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the flag package prints the whole usage on any error
	fs.Usage = func() {}
	o.AddFlags(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	err := fs.Parse(args)
	switch {
	case err == nil && *showVersion:
		fmt.Fprintf(stdout, "%s %s\n", name, version.Version)
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(stdout, "Usage of %s:\n", name)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return 0, true
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for its flags.\n", name, err, name)
		return 2, true
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "%s: unexpected argument %q (flags only)\nRun '%s --help' for its flags.\n", name, fs.Arg(0), name)
		return 2, true
	}
	return 0, false
}

// Report writes err as the program's last words: name, the error, a newline.
func Report(w io.Writer, name string, err error) {
	fmt.Fprintf(w, "%s: %v\n", name, err)
}

func run(o Options, build func(*slog.Logger) (Runner, error)) error {
	if err := o.Validate(); err != nil {
		return err
	}
	lo := o.LogOptions()
	log, err := lo.Logger(os.Stderr)
	if err != nil {
		return err
	}
	// client-go's own lines (leader election, watches) in the same format.
	klog.SetSlogLogger(log.With(logging.KeyComponent, "client-go"))
	r, err := build(log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal starts the graceful stop; a second one ends the
	// process at once (the default action, restored once the first came).
	go func() { <-ctx.Done(); stop() }()
	return r.Run(ctx)
}
