#!/usr/bin/env bash
# Tunes a threshold trigger on each trace of the benchmark and the three held-out
# suites, that trace alone (docs/planner.md, "Against each trace's own best
# threshold"): `pulse-sim tune` sweeps metrics × thresholds × scale-up
# policies (its defaults), 3 seeds, on the suite's ScaledObject
# tuned-scaledobject.yaml; each case's sweep goes to
# docs/simulation/tune-per-trace/NAME-PROFILE.json. About 20 minutes on 2
# cores. Run from the repository root after `make build`.
set -euo pipefail
sim=bin/pulse-sim
out=docs/simulation/tune-per-trace
mkdir -p "$out"
azure=pkg/sim/trace/testdata/azure-llm-2023-conv.csv
mooncake=pkg/sim/trace/testdata/mooncake-synthetic.jsonl
tune_case() { # name, trace, 8B rate scale, 70B rate scale
  local name=$1 trace=$2
  for p in "llama-3.1-8b-h100:$3" "llama-3.3-70b-h100x4:$4"; do
    local profile=${p%%:*} scale=${p#*:}
    "$sim" tune --trace "$trace" --rate-scale "$scale" --profile "$profile" --seeds 3 --target-slo 0.95 \
      --scaledobject docs/simulation/tuned-scaledobject.yaml --out "/tmp/pulse-sim-tune-$name-$profile" > /dev/null
    cp "/tmp/pulse-sim-tune-$name-$profile/tune.json" "$out/$name-$profile.json"
    echo "$name $profile"
  done
}
# docs/simulation/suite.yaml
tune_case azure-conv $azure 6 1.5
tune_case mooncake $mooncake 1 0.25
tune_case prefill-heavy-diurnal diurnal:min=1,max=12,duration=1h,prompt=12000,output=300,lengths=lognormal 1 0.25
tune_case decode-heavy-bursts bursts:base=0,peak=30,on=3m,off=7m,duration=1h,prompt=200,output=1000,lengths=lognormal 1 0.25
tune_case chat-ramp ramp:from=2,to=60,duration=1h,lengths=lognormal 1 0.25
# docs/simulation/heldout.yaml
tune_case azure-conv-x3 $azure 3 0.75
tune_case azure-conv-x10 $azure 10 2.5
tune_case steady-rag poisson:rate=8,duration=1h,prompt=4000,output=150,lengths=lognormal 1 0.25
tune_case steps-chat steps:rates=5/40/10/60/20,step=12m,lengths=lognormal 1 0.25
tune_case bursts-summarise bursts:base=2,peak=12,on=5m,off=10m,duration=1h,prompt=6000,output=400,lengths=lognormal 1 0.25
# docs/simulation/heldout-surge.yaml
tune_case bursts-chat bursts:base=3,peak=25,on=3m,off=12m,duration=1h,lengths=lognormal 1 0.25
tune_case diurnal-chat diurnal:min=2,max=40,duration=1h,lengths=lognormal 1 0.25
tune_case ramp-down-chat ramp:from=50,to=5,duration=1h,lengths=lognormal 1 0.25
tune_case steps-rag steps:rates=20/4/30/8,step=15m,prompt=4000,output=150,lengths=lognormal 1 0.25
# docs/simulation/heldout-final.yaml
tune_case short-bursts-rag bursts:base=1,peak=8,on=2m,off=8m,duration=1h,prompt=3000,output=200,lengths=lognormal 1 0.25
tune_case diurnal-decode diurnal:min=5,max=60,duration=1h,prompt=300,output=600,lengths=lognormal 1 0.25
tune_case steps-code steps:rates=10/35/15/50/5,step=12m,prompt=2000,output=250,lengths=lognormal 1 0.25
tune_case ramp-up-chat ramp:from=5,to=45,duration=1h,lengths=lognormal 1 0.25
