#!/usr/bin/env bash
# Measures the clairvoyant frontier against two wider families
# (docs/simulation.md, "The model": where it does not hold): each of the
# eleven suites of docs/simulation/ with
#   holds:     every clairvoyant plan also with a hold of 15 minutes and of
#              an hour (clairvoyant.holds), the planner's ScaledObject alone;
#   hindsight: the sweep's hindsight plans in the family
#              (clairvoyant.hindsight), every ScaledObject;
# then compares each pipeline's Δ clairvoyant with the committed
# scoreboard's (the same seeds reproduce it to the digit). Scoreboards go
# to OUT/holds/SUITE and OUT/hindsight/SUITE (OUT: the first argument, or
# /tmp/pulse-sim-families); SUITES narrows the suites. About 45 minutes on
# 2 cores. Run from the repository root after `make build`; needs python3.
set -euo pipefail
out=${1:-/tmp/pulse-sim-families}
suites=${SUITES:-suite heldout heldout-surge heldout-final heldout-lulls heldout-lulls-heavy heldout-headroom heldout-learning heldout-learning-2 heldout-drain heldout-drain-2}
for suite in $suites; do
  for family in holds hindsight; do
    tmp="docs/simulation/.families-$suite.yaml" # beside the suite: its paths are relative
    trap 'rm -f "$tmp"' EXIT
    awk -v family="$family" '
      /^clairvoyant:/ { print; print (family == "holds" ? "  holds: [0s, 15m, 1h]" : "  hindsight: true"); next }
      family == "holds" && /^  holds:/ { next } # a suite that holds already (suite.yaml): the line above replaces it
      family == "hindsight" && /^  hindsight:/ { next }
      family == "holds" && /^scaledObjects:/ { print; print "- default-scaledobject.yaml"; skip = 1; next }
      skip && /^(- |#)/ { next }
      { skip = 0; print }' "docs/simulation/$suite.yaml" > "$tmp"
    res=$(bin/pulse-sim bench --suite "$tmp" --out "$out/$family/$suite" | tail -1) # fails the script if the bench fails
    echo "$family $suite: ${res%%;*}"
    rm -f "$tmp"
  done
done
python3 - "$out" $suites <<'EOF'
import json, sys
out, suites = sys.argv[1], sys.argv[2:]
def cases(path):
    return {(c['trace'], c['profile'], c['scaledObject']): c for c in json.load(open(path))['cases']}
for family in ('holds', 'hindsight'):
    n = moved = above_before = above_after = points = wider = planner_before = planner_after = 0
    planner_moved = 0.0
    for suite in suites:
        before = cases(f"docs/simulation/{'bench' if suite == 'suite' else suite}/scoreboard.json")
        for key, c in cases(f"{out}/{family}/{suite}/scoreboard.json").items():
            points += len(c['clairvoyantFrontier'])
            wider += sum(('hold=' in p['pipeline']) or p['pipeline'].startswith('hindsight') for p in c['clairvoyantFrontier'])
            was = {s['pipeline']: s for s in before[key]['pipelines']}
            for s in c['pipelines']:
                a, b = was[s['pipeline']]['toClairvoyant'], s['toClairvoyant']
                if a is None or b is None:
                    continue
                n += 1
                above_before += a > 1e-9
                above_after += b > 1e-9
                if s['pipeline'] == 'pulse' and key[2] == 'default-scaledobject.yaml':
                    planner_moved = max(planner_moved, abs(a - b))
                    planner_before += a > 1e-9
                    planner_after += b > 1e-9
                if abs(a - b) > 0.0005:
                    moved += 1
                    print(f"{family}: {suite}: {key[0]} · {key[1]} · {key[2]}: {s['pipeline']}: Δ clairvoyant {100*a:+.2f} → {100*b:+.2f}")
    print(f"{family}: {wider} of {points} frontier points are the wider family's; {moved} of {n} pipeline scores move by more than 0.05 points "
          f"(the planner's by at most {100*planner_moved:.2f}); above the frontier {above_before} → {above_after} "
          f"(the planner {planner_before} → {planner_after})")
EOF
