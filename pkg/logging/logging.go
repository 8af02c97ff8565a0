// Package logging builds the binaries' slog loggers.
package logging

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// Options are the --log-format and --log-level flags every binary takes.
type Options struct{ Format, Level string }

// DefaultOptions: JSON at info.
func DefaultOptions() Options { return Options{Format: "json", Level: "info"} }

// AddFlags registers --log-format and --log-level.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Format, "log-format", o.Format, "log format: json or text")
	fs.StringVar(&o.Level, "log-level", o.Level, "log level: debug, info, warn or error")
}

// Validate reports a format or level pulse cannot log with.
func (o *Options) Validate() error {
	_, err := New(io.Discard, o.Format, o.Level)
	return err
}

// Logger returns the logger the options describe, writing to w.
func (o *Options) Logger(w io.Writer) (*slog.Logger, error) { return New(w, o.Format, o.Level) }

// New returns a logger writing format ("json" or "text") at level.
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", format)
}
