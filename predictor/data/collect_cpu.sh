#!/usr/bin/env bash
# Collect the shipped CPU profile dataset (run from the repository root, in the background):
#   nohup predictor/data/collect_cpu.sh [PHASE...] > /work/h3data/collect.log 2>&1 &
# Phase 1: 200 D-optimal configurations for each of the paper's five models (single-process and
# 2-process dp / fsdp / tp / pp plans). Phase 2: the full BERT grid of single-process plans
# (D-optimal vs random vs full comparisons draw from it; its D-optimal picks are measured in
# phase 1 and skipped). Phase 3: 20 configurations re-measured for the noise (bench/noise.py).
# Phase 4: the device profile (matmul FLOP/s, bandwidth, collectives) into device.json.
# Phase 5: the full BERT grid extended to dp=2 and tp=2 plans (967 configurations), random order.
# Phase 6: the next decade of sizes (grid cpu-large, 3e9-3e10 FLOPs), labelled doptimal-large so the
# paper's protocols (doptimal rows) are unchanged: per model and design seed (0 and 1), 4 each of
# dp, fsdp, tp, pp-gpipe, pp-1f1b and 8 single-process configurations (the two seeds' exchanges
# end on many of the same picks); the checkpoint trains on them (--designs all).
# Every phase resumes where a killed run stopped. Default: phases 1 3 4 2 5 (the order used).
set -euo pipefail
LIVE=${LIVE:-/work/h3data/cpu}
PY=.venv/bin/python
COMMON="--steps 3 --warmup 1 --layer-repeats 3 --timeout 90 --resume --out $LIVE"
for phase in "${@:-1 3 4 2 5}"; do
  echo "phase $phase start $(date -u +%FT%TZ)"
  case $phase in
    1) $PY -m orchestrator.cli profile --families t5,gpt2,bert,vit,deit --design doptimal --budget 200 $COMMON ;;
    2) $PY -m orchestrator.cli profile --families bert --design full --plans single $COMMON ;;
    3) $PY bench/noise.py --data "$LIVE" --configs 20 --repeats 2 --seed 0 ;;
    5) $PY -m orchestrator.cli profile --families bert --design full --plans single,dp,tp $COMMON ;;
    6) LARGE="--design doptimal --grid cpu-large --label doptimal-large --families t5,gpt2,bert,vit,deit"
       for seed in 0 1; do
         $PY -m orchestrator.cli profile $LARGE --seed $seed --plans dp,fsdp,tp,pp-gpipe,pp-1f1b --budget 20 $COMMON
       done
       for seed in 0 1; do $PY -m orchestrator.cli profile $LARGE --seed $seed --plans single --budget 8 $COMMON; done ;;
    4) $PY -c "import sys; from predictor.data.collect import record_device_profile as r; print(r(sys.argv[1])['peak_flops'])" "$LIVE" ;;
  esac
done
echo "done $(date -u +%FT%TZ)"
