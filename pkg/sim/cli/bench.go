package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/pulse-io/pulse/pkg/sim/bench"
)

// benchCmd runs a suite: pulse-sim bench --suite FILE --out DIR.
func benchCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	suite := fs.String("suite", "", "the suite YAML: traces × profiles × ScaledObjects × seeds (docs/simulation/suite.yaml)")
	out := fs.String("out", "bench", "directory for scoreboard.md, scoreboard.json and the frontier pictures")
	format := fs.String("format", "png", "picture format: png or svg")
	seeds := fs.Int("seeds", 0, "override the suite's number of seeds (0: the suite's)")
	references := referencesFlag("true")
	fs.Var(&references, "references", "true, static or false: true: also run the references (static:1 … maxReplicaCount, the switches, the clairvoyant sweep) and score every pipeline against their frontiers; static: the fixed fleets alone of them, so the static frontier and no clairvoyant one, at a small part of the cost; false: the pipelines alone, no frontier (a change to one pipeline compared in minutes: docs/simulation/planner-ab.py)")
	pipelines := fs.String("pipelines", "", "override the suite's pipelines, comma-separated (default: the suite's, else every one that can express each ScaledObject's trigger)")
	metric := fs.String("metric", "", "run only the ScaledObjects whose pulse trigger asks for this metric (replicas: the planner's), refused when none does; default: every one")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	var errs []error
	if *suite == "" {
		errs = append(errs, errors.New("--suite is required"))
	}
	if *format != "png" && *format != "svg" {
		errs = append(errs, fmt.Errorf("--format %q: png or svg", *format))
	}
	if *seeds < 0 || *seeds > 100 {
		errs = append(errs, errors.New("--seeds must be from 0 (the suite's) to 100"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s, err := bench.Read(*suite)
	if err != nil {
		return err
	}
	if *seeds > 0 {
		s.Seeds = *seeds
	}
	if *pipelines != "" {
		if err := s.SetPipelines(splitPipelines(*pipelines)); err != nil {
			return fmt.Errorf("--pipelines: %w", err)
		}
	}
	s.NoReferences, s.StaticOnly, s.Metric = references == "false", references == "static", *metric
	start := time.Now()
	sb, _, err := s.Run(*suite, stdout)
	if err != nil {
		return err
	}
	files, err := bench.Write(sb, *out, *format)
	if err != nil {
		return err
	}
	if len(sb.AboveClairvoyant) > 0 {
		fmt.Fprintf(stdout, "above the clairvoyant frontier: %s\n", strings.Join(sb.AboveClairvoyant, "; "))
	}
	fmt.Fprintf(stdout, "%d cases in %.0fs; wrote %s\n", len(sb.Cases), time.Since(start).Seconds(), strings.Join(files, ", "))
	return nil
}

// referencesFlag is bench's --references: true, false (as the boolean
// flag it was, in any form strconv.ParseBool reads) or static. It needs a
// value (--references=static or --references static): a bare
// --references, which the boolean flag read as true (its default), is now
// refused.
type referencesFlag string

func (r *referencesFlag) String() string { return string(*r) }

func (r *referencesFlag) Set(v string) error {
	if v == "static" {
		*r = "static"
		return nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("%q: true, false or static", v)
	}
	*r = referencesFlag(strconv.FormatBool(b))
	return nil
}
