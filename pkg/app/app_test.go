package app

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/version"
)

type opts struct {
	addr string
	log  logging.Options
}

func (o *opts) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.addr, "addr", ":80", "where to listen")
	o.log.AddFlags(fs)
}
func (o *opts) Validate() error             { return nil }
func (o *opts) LogOptions() logging.Options { return o.log }

// TestBadFlagIsOneLineAndAPointer: a bad flag says what is wrong and where
// the flags are, in two lines, and exits 2 (it used to print the whole
// usage: 44 lines for the agent).
func TestBadFlagIsOneLineAndAPointer(t *testing.T) {
	var out, errs bytes.Buffer
	code, done := Parse("pulse-agent", []string{"--scrape-intervall=2s"}, &out, &errs, &opts{})
	want := "pulse-agent: flag provided but not defined: -scrape-intervall\nRun 'pulse-agent --help' for its flags.\n"
	if !done || code != 2 || errs.String() != want || out.Len() != 0 {
		t.Fatalf("done %v code %d stdout %q stderr %q, want stderr %q", done, code, out.String(), errs.String(), want)
	}
	errs.Reset()
	if code, done := Parse("pulse-agent", []string{"--addr=:1", "extra"}, &out, &errs, &opts{}); !done || code != 2 || !strings.Contains(errs.String(), `unexpected argument "extra"`) {
		t.Fatalf("positional argument: done %v code %d %q", done, code, errs.String())
	}
}

func TestHelpPrintsTheFlags(t *testing.T) {
	var out, errs bytes.Buffer
	code, done := Parse("pulse-agent", []string{"--help"}, &out, &errs, &opts{})
	if !done || code != 0 || !strings.Contains(out.String(), "-addr") || !strings.Contains(out.String(), "where to listen") || errs.Len() != 0 {
		t.Fatalf("done %v code %d stdout %q stderr %q", done, code, out.String(), errs.String())
	}
}

func TestVersion(t *testing.T) {
	var out, errs bytes.Buffer
	code, done := Parse("pulse-agent", []string{"--version"}, &out, &errs, &opts{})
	if !done || code != 0 || out.String() != "pulse-agent "+version.Version+"\n" || errs.Len() != 0 {
		t.Fatalf("done %v code %d stdout %q stderr %q", done, code, out.String(), errs.String())
	}
}

func TestGoodFlagsParse(t *testing.T) {
	o := &opts{}
	var out, errs bytes.Buffer
	if code, done := Parse("pulse-agent", []string{"--addr=:9", "--log-format=text"}, &out, &errs, o); done || code != 0 || o.addr != ":9" || o.log.Format != "text" {
		t.Fatalf("done %v code %d opts %+v", done, code, o)
	}
}

// TestReportEndsTheLine: an error (the aggregator's --agent-auth one, say)
// ends with a newline, a multi-error with one line per problem.
func TestReportEndsTheLine(t *testing.T) {
	var b bytes.Buffer
	Report(&b, "pulse-aggregator", errors.Join(errors.New(`--agent-auth "maybe": want none or tokenreview`), errors.New("--namespace is required")))
	want := "pulse-aggregator: --agent-auth \"maybe\": want none or tokenreview\n--namespace is required\n"
	if b.String() != want {
		t.Fatalf("%q, want %q", b.String(), want)
	}
}
