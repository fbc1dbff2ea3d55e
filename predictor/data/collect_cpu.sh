#!/usr/bin/env bash
# Collect the shipped CPU profile dataset (run from the repository root, in the background):
#   nohup predictor/data/collect_cpu.sh > /work/h3data/collect.log 2>&1 &
# Phase 1: 200 D-optimal configurations for each of the paper's five models (single-process and
# 2-process dp / fsdp / tp / pp plans). Phase 2: the full BERT grid of single, dp and tp plans
# (D-optimal vs random vs full comparisons draw from it). Both resume where a killed run stopped.
# `python -m predictor.dataset_snapshot`-style copies into predictor/data/cpu are made separately.
set -euo pipefail
LIVE=${LIVE:-/work/h3data/cpu}
PY=.venv/bin/python
COMMON="--steps 3 --warmup 1 --layer-repeats 3 --timeout 90 --resume --out $LIVE"
echo "phase 1 start $(date -u +%FT%TZ)"
$PY -m orchestrator.cli profile --families t5,gpt2,bert,vit,deit --design doptimal --budget 200 $COMMON
echo "phase 1 end $(date -u +%FT%TZ)"
$PY -m orchestrator.cli profile --families bert --design full --plans single,dp,tp $COMMON
echo "phase 2 end $(date -u +%FT%TZ)"
