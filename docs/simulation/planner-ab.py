#!/usr/bin/env python3
"""A/B of two planners over every suite's planner cases (docs/planner.md,
"A trend fitted by least squares, tried").

The references a suite scores (the fixed fleets, the switches, the
clairvoyant sweep) do not depend on any pipeline, so two builds of the
planner are compared by its pipeline alone: each suite is run by each
binary as `pulse-sim bench --references=false --pipelines pulse --metric
replicas` (the suite's own cases, rates, SLO, warm-up and seeds, read by
pulse-sim itself): about 2 minutes a binary for the 22 suites of
docs/simulation/ on 2 cores, where the whole suites take hours. Run from
the repository root:

    python3 docs/simulation/planner-ab.py BEFORE_BIN AFTER_BIN [SUITE.yaml ...]

Both binaries run with this script's environment: to compare one binary
under two environments, give a wrapper script that sets one of them.
Prints every case whose attainment after the warm-up moved by more than
half a point or whose GPU-hours after it moved by more than 5 %, then the
totals. A case's distance to the frontiers is its suite's to measure, with
`pulse-sim bench` on the suite as it is.
"""
import glob
import json
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


def run(binary, suite, out):
    """The planner's scores in suite, by case: (attainment %, GPU-hours)."""
    r = subprocess.run([binary, 'bench', '--suite', suite, '--references=false', '--pipelines', 'pulse',
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
            scores[key] = (100 * p['sloAfterWarmup'], p['gpuHoursAfterWarmup'])
    return scores


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    binaries, todo = sys.argv[1:3], suites(sys.argv[3:])
    if not todo:
        sys.exit('no suite (a YAML file with traces) among %s' % (sys.argv[3:] or 'docs/simulation/*.yaml'))
    results = [{}, {}]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        jobs = {ex.submit(run, b, s, os.path.join(tmp, '%d-%d' % (i, j))): i
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
    moved = sorted((b[k][0] - a[k][0], k) for k in a)
    for d, k in moved:
        (sa, ga), (sb, gb) = a[k], b[k]
        if abs(d) > 0.5 or abs(gb - ga) > 0.05 * ga:
            print('%+5.1f  %s: %.1f %% at %.2f -> %.1f %% at %.2f' % (d, k, sa, ga, sb, gb))
    n = len(a)
    if n == 0:
        sys.exit('no planner case in %s' % ' '.join(todo))
    ga, gb = sum(v[1] for v in a.values()), sum(v[1] for v in b.values())
    print('%d cases of %d suites: mean SLO after the warm-up %.2f %% -> %.2f %%; at 95 %% or more %d -> %d; '
          'up by more than half a point %d, down %d; GPU-hours after the warm-up %.1f -> %.1f (%+.1f %%)' % (
              n, len(todo), sum(v[0] for v in a.values()) / n, sum(v[0] for v in b.values()) / n,
              sum(v[0] >= 95 for v in a.values()), sum(v[0] >= 95 for v in b.values()),
              sum(d > 0.5 for d, _ in moved), sum(d < -0.5 for d, _ in moved), ga, gb, 100 * (gb / ga - 1) if ga else 0))


if __name__ == '__main__':
    main()
