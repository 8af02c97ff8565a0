#!/usr/bin/env bash
# Runs the planner beside the hindsight reference (perfect measurement, no
# foresight; docs/simulation.md, "The model") on the four design
# suites (docs/planner-history.md, "Measured": what perfect measurement reaches): each
# suite with the planner's ScaledObject only and, as its pipelines, pulse
# and hindsight at utilisations 0.35, 0.5, 0.7 and 1 with a hold of one
# startup, 15 minutes and an hour. Scoreboards go to
# docs/simulation/hindsight/SUITE/. About 5 minutes on 2 cores. Run from
# the repository root after `make build`.
set -euo pipefail
pipelines='- "pulse"'
for hold in "" ",hold=15m" ",hold=1h"; do
  for u in 0.35 0.5 0.7 1; do
    pipelines+=$'\n'"- \"hindsight:utilisation=$u$hold\""
  done
done
for suite in suite heldout heldout-surge heldout-final; do
  tmp="docs/simulation/.hindsight-$suite.yaml" # beside the suite: its paths are relative
  trap 'rm -f "$tmp"' EXIT
  # The suite with its scaledObjects list replaced by the planner's alone.
  awk -v pipelines="$pipelines" '
    /^scaledObjects:/ { print "pipelines:"; print pipelines; print; print "- default-scaledobject.yaml"; skip = 1; next }
    skip && /^(- |#)/ { next }
    { skip = 0; print }' "docs/simulation/$suite.yaml" > "$tmp"
  bin/pulse-sim bench --suite "$tmp" --out "docs/simulation/hindsight/$suite" | tail -1
  rm -f "$tmp"
done
