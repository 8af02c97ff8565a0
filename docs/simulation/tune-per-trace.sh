#!/usr/bin/env bash
# Tunes a threshold trigger on each trace of the benchmark and five of the nine
# held-out suites (not heldout-headroom.yaml, the two heldout-learning
# suites or heldout-drain.yaml), that trace alone
# (docs/planner.md, "Against each trace's own best threshold"): `pulse-sim
# tune --suite` sweeps metrics × thresholds × scale-up
# policies (its defaults), 3 seeds, on tuned-scaledobject.yaml, for each trace ×
# profile of a suite with the suite's rate scales and settings; each sweep goes
# to docs/simulation/tune-per-trace/NAME-PROFILE.json. About 35 minutes on 2
# cores. Run from the repository root after `make build`.
set -euo pipefail
for suite in suite heldout heldout-surge heldout-final heldout-lulls heldout-lulls-heavy; do
  bin/pulse-sim tune --suite "docs/simulation/$suite.yaml" --scaledobject docs/simulation/tuned-scaledobject.yaml \
    --seeds 3 --target-slo 0.95 --out docs/simulation/tune-per-trace
done
