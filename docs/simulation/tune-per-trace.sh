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
# `tune-per-trace.sh table` runs nothing: it prints docs/planner.md's table
# (the planner's whole runs, from the suites' committed scoreboards, against
# the committed sweeps) and its counts; it needs python3.
# `tune-per-trace.sh after` sweeps the benchmark suite alone into
# docs/simulation/tune-per-trace-after/ (about 8 minutes), ranked as the
# benchmark scores (after the warm-up, to the last arrival: tune since
# 2026-12-02); `tune-per-trace.sh after-table` prints the planner's rows of
# the benchmark's scoreboard against those sweeps, after the warm-up.
set -euo pipefail
if [ "${1:-}" = after ]; then
  exec bin/pulse-sim tune --suite docs/simulation/suite.yaml --scaledobject docs/simulation/tuned-scaledobject.yaml \
    --seeds 3 --target-slo 0.95 --out docs/simulation/tune-per-trace-after
fi
if [ "${1:-}" = after-table ]; then
  exec python3 - <<'EOF'
import json
def fmt(a, g):
    return f"{a * 100:.1f} % at {g:.2f}"
def named(x):
    if not x:
        return 'none'
    return (f"{fmt(x['sloAfterWarmup'], x['gpuHoursAfterWarmup'])} "
            f"(`{x['metric']}`/{x['threshold']:g}, {x['scaleUpPods']} pod/{x['scaleUpPeriodSeconds']}s)")
print("| case | planner | best tuned within the planner's GPU-hours | the tuned pick (cheapest ≥ 95 %, else the best) | "
      "cheapest tuned keeping the planner's attainment | a tuned threshold dominates |")
print('|---|---|---|---|---|---|')
n = dominated_n = beats_pick = 0
for c in json.load(open('docs/simulation/bench/scoreboard.json'))['cases']:
    if c['metric'] != 'replicas':
        continue
    p = c['pipelines'][0]
    a, g = p['sloAfterWarmup'], p['gpuHoursAfterWarmup']
    sweep = json.load(open(f"docs/simulation/tune-per-trace-after/{c['trace']}-{c['profile']}.json"))
    pick = sweep[0]  # tune's ranking: the cheapest meeting the target, else the best
    within = [x for x in sweep if x['gpuHoursAfterWarmup'] <= g]
    keeps = [x for x in sweep if x['sloAfterWarmup'] >= a]
    best = max(within, key=lambda x: (x['sloAfterWarmup'], -x['gpuHoursAfterWarmup'])) if within else None
    cheapest = min(keeps, key=lambda x: (x['gpuHoursAfterWarmup'], -x['sloAfterWarmup'])) if keeps else None
    dominated = any(x['gpuHoursAfterWarmup'] <= g and (x['sloAfterWarmup'] > a or x['gpuHoursAfterWarmup'] < g) for x in keeps)
    # The planner at or ahead of the pick: as much attainment (within half
    # a point, the seeds' noise) for no more GPU-hours, or more for at most
    # 2 % more.
    beats = (a >= pick['sloAfterWarmup'] - 0.005 and g <= pick['gpuHoursAfterWarmup']) or \
            (a > pick['sloAfterWarmup'] + 0.005 and g <= pick['gpuHoursAfterWarmup'] * 1.02)
    n += 1
    dominated_n += dominated
    beats_pick += beats
    profile = '8B' if '8b' in c['profile'] else '70B'
    print(f"| {c['trace']} ×{c['rateScale']:g}, {profile} | {fmt(a, g)} | {named(best)} | {named(pick)} | "
          f"{named(cheapest)} | {'**yes**' if dominated else 'no'} |")
print(f"{n} cases: a tuned threshold dominates the planner on {dominated_n}; the planner at or ahead of the tuned pick on {beats_pick}")
EOF
fi
if [ "${1:-}" = table ]; then
  exec python3 - <<'EOF'
import json
# suite: the directory of its scoreboard
suites = {'suite': 'bench', 'heldout': 'heldout', 'heldout-surge': 'heldout-surge', 'heldout-final': 'heldout-final',
          'heldout-lulls': 'heldout-lulls', 'heldout-lulls-heavy': 'heldout-lulls-heavy'}
def fmt(x):
    return f"{x['sloAttainment'] * 100:.1f} % at {x['gpuHours']:.2f}"
def named(x):
    return f"{fmt(x)} (`{x['metric']}`/{x['threshold']:g}, {x['scaleUpPods']} pod/{x['scaleUpPeriodSeconds']}s)" if x else 'none'
print("| case | planner (whole run) | best tuned within the planner's GPU-hours | "
      "cheapest tuned keeping the planner's attainment | a tuned threshold dominates |")
print('|---|---|---|---|---|')
counts = {}
for suite, out in suites.items():
    group = 'lull suites' if 'lulls' in suite else 'design suites'
    for c in json.load(open(f'docs/simulation/{out}/scoreboard.json'))['cases']:
        if c['metric'] != 'replicas':
            continue
        p = c['pipelines'][0]
        a, g = p['sloAttainment'], p['gpuHours']
        sweep = json.load(open(f"docs/simulation/tune-per-trace/{c['trace']}-{c['profile']}.json"))
        within = [x for x in sweep if x['gpuHours'] <= g]
        keeps = [x for x in sweep if x['sloAttainment'] >= a]
        best = max(within, key=lambda x: (x['sloAttainment'], -x['gpuHours'])) if within else None
        cheapest = min(keeps, key=lambda x: (x['gpuHours'], -x['sloAttainment'])) if keeps else None
        dominated = any(x['gpuHours'] <= g and (x['sloAttainment'] > a or x['gpuHours'] < g) for x in keeps)
        n = counts.setdefault(group, [0, 0, 0])
        n[0] += 1
        n[1] += dominated
        n[2] += cheapest is None
        profile = '8B' if '8b' in c['profile'] else '70B'
        print(f"| {c['trace']} ×{c['rateScale']:g}, {profile} | {a * 100:.1f} % at {g:.2f} | {named(best)} | "
              f"{named(cheapest)} | {'**yes**' if dominated else 'no'} |")
for group, (n, dominated, none) in counts.items():
    print(f'{group}: {n} cases, a tuned threshold dominates on {dominated}, none keeps the attainment on {none}')
EOF
fi
for suite in suite heldout heldout-surge heldout-final heldout-lulls heldout-lulls-heavy; do
  bin/pulse-sim tune --suite "docs/simulation/$suite.yaml" --scaledobject docs/simulation/tuned-scaledobject.yaml \
    --seeds 3 --target-slo 0.95 --out docs/simulation/tune-per-trace
done
