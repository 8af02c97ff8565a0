#!/usr/bin/env python3
"""A/B of two planners over every suite's planner cases (docs/planner.md,
"A trend fitted by least squares, tried").

The references a suite scores (the fixed fleets, the switches, the
clairvoyant sweep) do not depend on the planner, so two planners are
compared by running the `pulse` pipeline alone: each suite's cases whose
ScaledObject is a planner's (`metric: replicas`), at the suite's rates,
SLO, warm-up, copies and seeds, through two pulse-sim binaries. About 9
minutes a binary for the 22 suites on 2 cores, where `pulse-sim bench`
takes hours. Run from the repository root:

    python3 docs/simulation/planner-ab.py BEFORE_BIN AFTER_BIN [SUITE.yaml ...]

Each binary may be the same one with another environment (the script
passes its own on). Prints every case that moved by more than half a
point, then the totals: the mean attainment after the warm-up, the cases
at 95 % or more, and the GPU-hours after it. Needs PyYAML.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import yaml


def cases(suite_files):
    for sf in suite_files:
        d = os.path.dirname(sf)
        s = yaml.safe_load(open(sf))
        if not isinstance(s, dict) or 'traces' not in s:
            continue
        for so in s['scaledObjects']:
            sop = os.path.normpath(os.path.join(d, so))
            if 'metric: replicas' not in open(sop).read():
                continue
            for prof in s['profiles']:
                for t in s['traces']:
                    tr = t['trace']
                    if not tr.split(':')[0].isalpha() or '=' not in tr:
                        tr = os.path.normpath(os.path.join(d, tr))
                    p = os.path.join(d, prof) if prof.endswith('.yaml') else prof
                    rs = t.get('rateScaleByProfile', {}).get(prof, t.get('rateScale', 1))
                    args = ['run', '--trace', tr, '--scaledobject', sop, '--profile', p,
                            '--rate-scale', str(rs), '--runs', str(s.get('seeds', 3)), '--pipelines', 'pulse',
                            '--ttft-slo', s.get('ttftSlo', '2s'), '--warmup', s.get('warmup', '10m'),
                            '--copy-jitter', s.get('copyJitter', '30s'),
                            '--copy-lengths', s.get('copyLengths', 'resample')]
                    if 'hpaConfigurableTolerance' in s:
                        args.append('--hpa-configurable-tolerance=' + str(s['hpaConfigurableTolerance']).lower())
                    yield '%s %s %s %s' % (os.path.basename(sf), os.path.basename(so), t['name'], os.path.basename(prof)), args


def run(binary, key, args):
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run([binary] + args + ['--out', out], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit('%s: %s: %s' % (binary, key, r.stderr.strip()[-500:]))
        runs = json.load(open(os.path.join(out, 'runs.json')))
    n = len(runs)
    return (100 * sum(x['sloAfterWarmup'] for x in runs) / n, sum(x['gpuHoursAfterWarmup'] for x in runs) / n)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    before, after = sys.argv[1], sys.argv[2]
    suites = sys.argv[3:] or sorted(glob.glob('docs/simulation/*.yaml'))
    todo = list(cases(suites))
    with ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        a = list(ex.map(lambda c: run(before, *c), todo))
        b = list(ex.map(lambda c: run(after, *c), todo))
    moved = sorted((y[0] - x[0], k, x, y) for (k, _), x, y in zip(todo, a, b))
    for d, k, x, y in moved:
        if abs(d) > 0.5:
            print('%+5.1f  %s: %.1f %% at %.2f -> %.1f %% at %.2f' % (d, k, x[0], x[1], y[0], y[1]))
    n = len(todo)
    ga, gb = sum(x[1] for x in a), sum(y[1] for y in b)
    print('%d cases: mean SLO after the warm-up %.2f %% -> %.2f %%; at 95 %% or more %d -> %d; '
          'up by more than half a point %d, down %d; GPU-hours %.1f -> %.1f (%+.1f %%)' % (
              n, sum(x[0] for x in a) / n, sum(y[0] for y in b) / n,
              sum(x[0] >= 95 for x in a), sum(y[0] >= 95 for y in b),
              sum(d > 0.5 for d, *_ in moved), sum(d < -0.5 for d, *_ in moved), ga, gb, 100 * (gb / ga - 1)))


if __name__ == '__main__':
    main()
