#!/usr/bin/env bash
# Collect a GPU profile dataset on a machine with one CUDA GPU, within a time limit
# (run from the repository root):
#   predictor/data/collect_gpu.sh OUT_DIR [SECONDS=420]
# 1. The device profile (bf16/fp16/fp32 matmul FLOP/s, copy bandwidth) into OUT_DIR/device.json
#    (kept when it is there already).
# 2. A smoke test: one GPT-2 configuration; the script stops (exit 1) if it does not measure,
#    so a broken set-up costs seconds, not the whole limit.
# 3. D-optimal single-GPU configurations of the paper's five models at realistic sizes (the
#    `gpu` grid of predictor/measure/design.py, bf16): 12 per family first, so that every family is
#    covered if time runs short, then up to 40 per family, the time left shared out evenly.
# Each configuration (whole iteration + per-layer timings) is appended atomically, so a run
# stopped by the limit keeps everything it measured; running the script again resumes it.
# DEVICE=cpu DTYPE=float32 GRID=gpu FLOP_CAP=2e10 exercise the same steps on a CPU.
set -uo pipefail
OUT=${1:?usage: collect_gpu.sh OUT_DIR [SECONDS]}
LIMIT=${2:-420}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
FAMILIES=(t5 gpt2 bert vit deit)
start=$(date +%s)
left() { echo $((LIMIT - ($(date +%s) - start))); }
COMMON=(--device "$DEVICE" --dtype "${DTYPE:-bfloat16}" --grid "${GRID:-gpu}" --procs 1 --steps 5 --warmup 2
        --layer-repeats 5 --timeout 60 --resume --out "$OUT")
[ -n "${FLOP_CAP:-}" ] && COMMON+=(--flop-cap "$FLOP_CAP")
profile() { timeout -k 10 "$1" "$PY" -m orchestrator.cli profile --design doptimal "${@:2}" "${COMMON[@]}"; }

echo "device profile $(date -u +%FT%TZ)"
[ -f "$OUT/device.json" ] || "$PY" -c "import json, sys; from predictor.data.collect import record_device_profile as r
d = r(sys.argv[1], sys.argv[2]); print(json.dumps({k: d[k] for k in ('fingerprint', 'peak_flops', 'mem_bandwidth')}))" \
  "$OUT" "$DEVICE" || exit 1

echo "smoke test $(date -u +%FT%TZ)"
profile 120 --families gpt2 --budget 1 || { echo "smoke test failed: not collecting"; exit 1; }

for budget in 12 40; do
  for i in "${!FAMILIES[@]}"; do
    share=$(( $(left) / (${#FAMILIES[@]} - i) ))
    [ "$share" -gt 15 ] || continue
    echo "pass budget=$budget family=${FAMILIES[$i]} seconds=$share $(date -u +%FT%TZ)"
    profile "$share" --families "${FAMILIES[$i]}" --budget "$budget"
  done
done
echo "done $(date -u +%FT%TZ)"
