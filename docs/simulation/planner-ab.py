#!/usr/bin/env python3
"""A/B of two planners over every suite's planner cases (docs/planner-history.md,
"A trend fitted by least squares, tried").

The references a suite scores (the fixed fleets, the switches, the
clairvoyant sweep) do not depend on any pipeline, so two builds of the
planner are compared by its pipeline alone: each suite is run by each
binary as `pulse-sim bench --references=false --pipelines pulse --metric
replicas` (the suite's own cases, rates, SLO, warm-up and seeds, read by
pulse-sim itself): 4 min 22 s for two binaries over the 22 suites of
docs/simulation/ on 2 cores (16 min 43 s with --static), where the whole
suites take hours. Run from
the repository root:

    python3 docs/simulation/planner-ab.py [--static] BEFORE_BIN AFTER_BIN [SUITE.yaml ...]

(--static anywhere among the arguments; --json=FILE anywhere writes every
case's scores by both binaries to FILE: {"before": {case: [attainment %,
GPU-hours, Δ static or null]}, "after": {...}}, for the cases no line
prints.)

Both binaries run with this script's environment: to compare one binary
under two environments, give a wrapper script that sets one of them.
Prints every case whose attainment after the warm-up moved by more than
half a point or whose GPU-hours after it moved by more than 5 % (with
--static, or that came onto the static frontier or left it), then the
totals. With --static each binary runs the fixed fleets beside the
planner (`--references=static`: static:1 … maxReplicaCount, no switch and
no clairvoyant sweep), and the lines and totals
give the planner's distance to the static frontier too (Δ static, in
points), the cases on or above it (within half a point, or using fewer
GPU-hours than any fixed fleet), and of those the ones at 95 % or more
(the goal asks for both at once; the totals line gives 95 % or more
alone). The clairvoyant frontier is its
suite's to measure, with `pulse-sim bench` on the suite as it is.
"""
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed


def suites(args):
    files = args or sorted(glob.glob('docs/simulation/*.yaml'))
    # A suite has traces; the directory's ScaledObjects do not.
    return [f for f in files if re.search(r'^traces:', open(f).read(), re.M)]


def run(binary, suite, out, refs):
    """The planner's scores in suite, by case: (attainment %, GPU-hours,
    Δ static in points or None, GPU-hours over the cheapest fixed fleet's
    as good or None)."""
    r = subprocess.run([binary, 'bench', '--suite', suite, '--references=' + refs, '--pipelines', 'pulse',
                        '--metric', 'replicas', '--out', out], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError('%s bench --suite %s: %s' % (binary, suite, r.stderr.strip()[-1000:]))
    sb = json.load(open(os.path.join(out, 'scoreboard.json')))
    scores = {}
    for c in sb['cases']:
        for p in c['pipelines']:
            key = '%s %s ×%g %s %s' % (os.path.basename(suite), c['trace'], c['rateScale'], c['profile'],
                                        os.path.basename(c['scaledObject']))
            if key in scores:
                raise RuntimeError('%s: case %s twice' % (suite, key))
            to = p.get('toStatic')
            scores[key] = (100 * p['sloAfterWarmup'], p['gpuHoursAfterWarmup'], None if to is None else 100 * to,
                           p.get('staticCost'))
    return scores


def on_frontier(to):
    """On or above the static frontier: within half a point, or cheaper
    than any fixed fleet (no distance), at any attainment: no fixed fleet
    that cheap dominates it. Only a pipeline that may scale to zero can be
    cheaper than static:1; every planner case here has a minimum of 1, so
    none is (a review found a scale-to-zero pipeline at 0 % so counted)."""
    return to is None or to >= -0.5


# DEAR: a plan costing more than this times the cheapest fixed fleet as
# good (staticCost) is counted apart.
DEAR = 1.1


def both(v):
    """On or above the static frontier, and at 95 % or more."""
    return on_frontier(v[2]) and v[0] >= 95


def cheap(v):
    """No dearer than DEAR times a fixed fleet as good. Where no fixed
    fleet attains as much there is nothing to compare with: not counted
    (it was counted cheap), and counted apart in the summary."""
    return v[3] is not None and v[3] <= DEAR


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float('nan')


def dist(to):
    return '—' if to is None else '%+.2f' % to


def main():
    dump = [a[len('--json='):] for a in sys.argv[1:] if a.startswith('--json=')]
    args = [a for a in sys.argv[1:] if a != '--static' and not a.startswith('--json=')]
    static = '--static' in sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    binaries, todo = args[:2], suites(args[2:])
    if not todo:
        sys.exit('no suite (a YAML file with traces) among %s' % (args[2:] or 'docs/simulation/*.yaml'))
    refs = 'static' if static else 'false'
    results = [{}, {}]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        jobs = {ex.submit(run, b, s, os.path.join(tmp, '%d-%d' % (i, j)), refs): i
                for i, b in enumerate(binaries) for j, s in enumerate(todo)}
        for f in as_completed(jobs):
            try:
                results[jobs[f]].update(f.result())
            except (RuntimeError, OSError) as e:
                ex.shutdown(cancel_futures=True)
                sys.exit(str(e))
    a, b = results
    if a.keys() != b.keys():
        sys.exit('the two binaries ran different cases: %s' % sorted(a.keys() ^ b.keys()))
    n = len(a)
    if n == 0:
        sys.exit('no planner case in %s' % ' '.join(todo))
    for path in dump:
        with open(path, 'w') as f:
            json.dump({'before': a, 'after': b}, f, indent=1, sort_keys=True)
    moved = sorted((b[k][0] - a[k][0], k) for k in a)
    for d, k in moved:
        (sa, ga, ta, _), (sb, gb, tb, _) = a[k], b[k]
        if abs(d) > 0.5 or abs(gb - ga) > 0.05 * ga or static and on_frontier(ta) != on_frontier(tb):
            line = '%+5.1f  %s: %.1f %% at %.2f -> %.1f %% at %.2f' % (d, k, sa, ga, sb, gb)
            if static:
                line += ' (Δ static %s -> %s)' % (dist(ta), dist(tb))
            print(line)
    ga, gb = sum(v[1] for v in a.values()), sum(v[1] for v in b.values())
    print('%d cases of %d suites: mean SLO after the warm-up %.2f %% -> %.2f %%; at 95 %% or more %d -> %d; '
          'up by more than half a point %d, down %d; GPU-hours after the warm-up %.1f -> %.1f (%+.1f %%)' % (
              n, len(todo), sum(v[0] for v in a.values()) / n, sum(v[0] for v in b.values()) / n,
              sum(v[0] >= 95 for v in a.values()), sum(v[0] >= 95 for v in b.values()),
              sum(d > 0.5 for d, _ in moved), sum(d < -0.5 for d, _ in moved), ga, gb, 100 * (gb / ga - 1) if ga else 0))
    if static:
        print('on or above the static frontier (within half a point, or cheaper than any fixed fleet) %d -> %d; '
              'on it and at 95 %% or more, both at once %d -> %d' % (
                  sum(on_frontier(v[2]) for v in a.values()), sum(on_frontier(v[2]) for v in b.values()),
                  sum(on_frontier(v[2]) and v[0] >= 95 for v in a.values()),
                  sum(on_frontier(v[2]) and v[0] >= 95 for v in b.values())))
        # The frontier's test is of height alone: beside it, what a fixed
        # fleet as good costs.
        print('of those, no more than %.1f× the GPU-hours of the cheapest fixed fleet as good (within half a point) %d -> %d, '
              'with no fixed fleet as good %d -> %d; '
              'GPU-hours over a fixed fleet as good, geometric mean over the %d -> %d cases one attains as much: %.3f -> %.3f' % (
                  DEAR, sum(both(v) and cheap(v) for v in a.values()), sum(both(v) and cheap(v) for v in b.values()),
                  sum(both(v) and v[3] is None for v in a.values()), sum(both(v) and v[3] is None for v in b.values()),
                  sum(v[3] is not None for v in a.values()), sum(v[3] is not None for v in b.values()),
                  geomean(v[3] for v in a.values()), geomean(v[3] for v in b.values())))


if __name__ == '__main__':
    main()
