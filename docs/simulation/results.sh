#!/usr/bin/env bash
# Regenerates every result of docs/simulation.md (about 45 minutes on 2
# cores): each command's table goes to docs/simulation/results/NAME.txt,
# its report and pictures to docs/simulation/NAME/ where the document shows
# them. Run from the repository root after `make build`.
set -euo pipefail
sim=bin/pulse-sim
trace=pkg/sim/trace/testdata/azure-llm-2023-conv.csv
out=docs/simulation/results
mkdir -p "$out"
run() { # name, then pulse-sim's arguments
  local name=$1; shift
  echo "== $name: pulse-sim $*" | tee "$out/$name.txt"
  "$sim" "$@" | grep -v '^ *\(static\|switch\|clairvoyant\):' >> "$out/$name.txt"
}
# Checked against the real thing: the step, 100 seeds.
run step --trace steps:rates=5/60,step=5m,prompt=1000,output=200 \
  --scaledobject docs/simulation/step-scaledobject.yaml --pipelines pulse,prometheus \
  --runs 100 --scrape-interval 500ms --out /tmp/pulse-sim-step
cp /tmp/pulse-sim-step/runs.json "$out/step-runs.json"
# (a) The baseline; (b) tune and the tuned ScaledObject; the 70B fleet.
run baseline --trace $trace --scaledobject pkg/sim/testdata/baseline-scaledobject.yaml --rate-scale 6 --runs 10 \
  --references --out docs/simulation/baseline
echo "== tune" > "$out/tune.txt"
"$sim" tune --trace $trace --scaledobject pkg/sim/testdata/baseline-scaledobject.yaml --rate-scale 6 --seeds 3 \
  --target-slo 0.95 --out /tmp/pulse-sim-tune >> "$out/tune.txt"
run tuned --trace $trace --scaledobject docs/simulation/tuned-scaledobject.yaml --rate-scale 6 --runs 10 \
  --references --out docs/simulation/tuned
for so in baseline:pkg/sim/testdata/baseline-scaledobject.yaml tuned:docs/simulation/tuned-scaledobject.yaml; do
  run "70b-${so%%:*}" --trace $trace --scaledobject "${so#*:}" --profile llama-3.3-70b-h100x4 --rate-scale 1.5 --runs 10 \
    --references --out "/tmp/pulse-sim-70b-${so%%:*}"
done
# (d) and (f): other signals, pulse and the oracle.
for so in waiting saturation saturation-running ttft-p90 ttft-mean itl-p90; do
  run "signals-$so" --trace $trace --rate-scale 6 --runs 10 --scaledobject "docs/simulation/signals/$so-scaledobject.yaml" \
    --pipelines pulse,oracle --references --out "/tmp/pulse-sim-signals-$so"
done
# (g) Demand at zero.
run zero --trace $trace --rate-scale 1 --runs 10 --scaledobject docs/simulation/signals/zero-waiting-scaledobject.yaml \
  --pipelines pulse,oracle --references --out /tmp/pulse-sim-zero
run zero-demand --trace $trace --rate-scale 1 --runs 10 --scaledobject docs/simulation/signals/zero-waiting-scaledobject.yaml \
  --pipelines pulse,oracle --demand-source --references --out /tmp/pulse-sim-zero-demand
# The planner (docs/planner.md): the ScaledObject pulse provisions, on the
# shipped trace, both profiles.
run planner --trace $trace --scaledobject docs/simulation/default-scaledobject.yaml --rate-scale 6 --runs 10 \
  --references --out docs/simulation/planner
run 70b-planner --trace $trace --scaledobject docs/simulation/default-scaledobject.yaml --profile llama-3.3-70b-h100x4 \
  --rate-scale 1.5 --runs 10 --references --out /tmp/pulse-sim-70b-planner
# Traffic the planner was not designed on (docs/planner.md, "Held out"),
# and the two suites written after its surge rule.
"$sim" bench --suite docs/simulation/heldout.yaml --out docs/simulation/heldout | tail -1 > "$out/heldout.txt"
"$sim" bench --suite docs/simulation/heldout-surge.yaml --out docs/simulation/heldout-surge | tail -1 > "$out/heldout-surge.txt"
"$sim" bench --suite docs/simulation/heldout-final.yaml --out docs/simulation/heldout-final | tail -1 > "$out/heldout-final.txt"
# Written before the rule for falls (docs/planner-history.md, "Measured"),
# and the same traffic at four times the rate.
"$sim" bench --suite docs/simulation/heldout-lulls.yaml --out docs/simulation/heldout-lulls | tail -1 > "$out/heldout-lulls.txt"
"$sim" bench --suite docs/simulation/heldout-lulls-heavy.yaml --out docs/simulation/heldout-lulls-heavy | tail -1 > "$out/heldout-lulls-heavy.txt"
# Written before the headroom on the surge rule's level was tried (not shipped).
"$sim" bench --suite docs/simulation/heldout-headroom.yaml --out docs/simulation/heldout-headroom | tail -1 > "$out/heldout-headroom.txt"
# Written for the tries at learning the capacity past the planned load (not shipped).
"$sim" bench --suite docs/simulation/heldout-learning.yaml --out docs/simulation/heldout-learning | tail -1 > "$out/heldout-learning.txt"
"$sim" bench --suite docs/simulation/heldout-learning-2.yaml --out docs/simulation/heldout-learning-2 | tail -1 > "$out/heldout-learning-2.txt"
# Written before the per-replica drain was tried (docs/planner-history.md, "Measured").
"$sim" bench --suite docs/simulation/heldout-drain.yaml --out docs/simulation/heldout-drain | tail -1 > "$out/heldout-drain.txt"
# Written before the drain's second form was tried (docs/planner-history.md, "Measured").
"$sim" bench --suite docs/simulation/heldout-drain-2.yaml --out docs/simulation/heldout-drain-2 | tail -1 > "$out/heldout-drain-2.txt"
# Written before the regret was counted of replicas gone (docs/planner-history.md, "Measured").
"$sim" bench --suite docs/simulation/heldout-next.yaml --out docs/simulation/heldout-next | tail -1 > "$out/heldout-next.txt"
# Written before the HPA's tolerance was taken into the plan (docs/planner-history.md, "Measured").
"$sim" bench --suite docs/simulation/heldout-tolerance.yaml --out docs/simulation/heldout-tolerance | tail -1 > "$out/heldout-tolerance.txt"
# Written before the rise beyond the utilisation's headroom was tried at the
# utilisation (docs/planner-history.md, "Measured": not shipped in that form).
"$sim" bench --suite docs/simulation/heldout-rises.yaml --out docs/simulation/heldout-rises | tail -1 > "$out/heldout-rises.txt"
# Written before the level's surge was tried (docs/planner-history.md, "Measured": shipped).
"$sim" bench --suite docs/simulation/heldout-levels.yaml --out docs/simulation/heldout-levels | tail -1 > "$out/heldout-levels.txt"
# Written before a plan for the load's trend was tried (its first form,
# not shipped, was run on it; docs/planner-history.md, "Measured").
"$sim" bench --suite docs/simulation/heldout-trends.yaml --out docs/simulation/heldout-trends | tail -1 > "$out/heldout-trends.txt"
# Written after the first form's run and before the form shipped was run on
# any suite (docs/planner-history.md, "Measured").
"$sim" bench --suite docs/simulation/heldout-trends-2.yaml --out docs/simulation/heldout-trends-2 | tail -1 > "$out/heldout-trends-2.txt"
# The benchmark suite.
"$sim" bench --suite docs/simulation/suite.yaml --out docs/simulation/bench | tail -1 > "$out/bench.txt"
# The benchmark suite's planner cases on a default 1.33 HPA (the
# HPAConfigurableTolerance gate off; docs/planner-history.md, "Measured").
"$sim" bench --suite docs/simulation/suite-default-tolerance.yaml --out docs/simulation/default-tolerance | tail -1 > "$out/default-tolerance.txt"
# The planner's lead time held out (the shipped profiles with only their
# startup changed, docs/simulation/profiles/): written before its first
# run, which showed a replica just ready counted as if it had served the
# whole window (docs/planner-history.md, "Measured"); heldout-startups-2 was
# written after that run and before the change for it was run on any suite.
"$sim" bench --suite docs/simulation/heldout-startups.yaml --out docs/simulation/heldout-startups | tail -1 > "$out/heldout-startups.txt"
"$sim" bench --suite docs/simulation/heldout-startups-2.yaml --out docs/simulation/heldout-startups-2 | tail -1 > "$out/heldout-startups-2.txt"
# The SLO held out (every suite above scores 2 s): the planner asked for
# 1 s and 5 s beside the default, written before their first run
# (docs/planner-history.md, "Measured").
"$sim" bench --suite docs/simulation/heldout-slo-1s.yaml --out docs/simulation/heldout-slo-1s | tail -1 > "$out/heldout-slo-1s.txt"
"$sim" bench --suite docs/simulation/heldout-slo-5s.yaml --out docs/simulation/heldout-slo-5s | tail -1 > "$out/heldout-slo-5s.txt"
# Mixes of lengths that change within a trace, written before their first
# run (docs/planner-history.md, "Measured": a mix that changes).
"$sim" bench --suite docs/simulation/heldout-mix.yaml --out docs/simulation/heldout-mix | tail -1 > "$out/heldout-mix.txt"
