"""Memory as each framework allocates it: per-rank parts against measurements, and the published recipes' fit.

1. ../shared/ground_truth/simumax_b200_llama70b.csv: 12 real Megatron-LM + Transformer Engine runs (Llama 3 70B,
   12 layers, 8 B200). Per row: the predicted parts of the peak rank (weights, gradients, optimizer, activations,
   backward working set, buffers, runtime), allocated and reserved, against the measured peak allocated and
   reserved. Allocated memory has no fitted constant (derived from the code: the in-file and cross-validated
   figures are the same); reserved = allocated · (1 + f), with the allocator's slack f chosen on the other plans
   (leave-one-plan-out: the three micro-batch counts of a plan are held out together) and on every plan (in-file).
2. ../shared/ground_truth/megatron_bridge_2511.csv: every recipe plan with the memory levers its Megatron-Bridge
   recipe sets (`scripts/performance/configs/*/*_workload_base_configs.py` and the mixed-precision and optimizer
   recipes; RECIPE_LEVERS below), against its GPU's capacity.

    flock /tmp/scaledl-heavy.lock .venv/bin/python -m bench.memory_eval > bench/results/memory_eval.txt
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bench import common
from predictor.costs.parallel import apply_plan
from predictor.data.evaluate import bridge_workload
from predictor.frameworks import FRAMEWORKS
from predictor.graph.cache import graph_for
from predictor.memory.accounting import GIB_COLUMNS, RankMemory, rank_memory
from predictor.memory.facts import GIB
from predictor.memory.lever_settings import Levers
from predictor.plan import Plan
from predictor.spec.resolver import get_device
from predictor.spec.workload import WorkloadSpec, parse_spec

SIMUMAX = "simumax_b200_llama70b.csv"
BRIDGE = "megatron_bridge_2511.csv"
FRAGMENTATION_GRID = tuple(np.round(np.arange(0.0, 0.1001, 0.005), 3))

# Levers each 25.11 recipe sets, from NVIDIA-NeMo/Megatron-Bridge scripts/performance: recompute_modules,
# recompute_num_layers (full, per stage) and cpu_offloading_num_layers in the workload base configs
# (configs/*/*_workload_base_configs.py, applied by utils/overrides.py); FP8 parameter gather in the mixed-precision
# recipes (bf16_with_fp8_current_scaling_mixed, bf16_with_mxfp8_mixed); the MoE recipes' precision-aware optimizer
# (BF16 moments). Every recipe reduces gradients in BF16 (set_llama3_common_configs, set_llama31_common_configs,
# set_deepseek_v3_common_configs: grad_reduce_in_fp32 = False; the MoE recipes' main_grads_dtype = bf16) and uses
# Transformer Engine's cross-entropy (_set_common_perf_overrides: cross_entropy_fusion_impl = "te"). Keyed by
# (system, model). DGX-H100 Llama 3 8B sets none: the row ran Megatron-FSDP (fsdp=8), the recipe version whose
# LLAMA3_8B_H100_FP8_CS_BASE_CONFIG sets use_megatron_fsdp=True and no recompute_num_layers (the version with
# recompute_num_layers=5 there runs no FSDP).
_MOE_OPTIMIZER = {"bf16_moments": True}
_EVERY_RECIPE = {"bf16_grads": True, "te_cross_entropy": True}
RECIPE_LEVERS: dict[tuple[str, str], dict] = {
    ("DGX-GB300", "LLAMA3_70B"): {"offload_layers": 20},
    ("DGX-GB200", "LLAMA3_70B"): {"offload_layers": 40},
    ("DGX-GB300", "DeepSeekV3 (w/o MTP)"): {"recompute": frozenset({"mla_up_proj"}), **_MOE_OPTIMIZER},
    ("DGX-GB200", "DeepSeekV3 (w/o MTP)"): {"recompute": frozenset({"mla_up_proj"}), **_MOE_OPTIMIZER},
    ("DGX-B200", "DeepSeekV3 (w/ MTP)"): {"recompute": frozenset({"mla_up_proj"}), **_MOE_OPTIMIZER},
    ("DGX-GB200", "GPT_OSS_120B"): {"recompute": frozenset({"layernorm", "moe_act"})},
    ("DGX-B200", "GPT_OSS_120B"): {"recompute": frozenset({"layernorm", "moe_act"})},
    ("DGX-H100", "GPT_OSS_120B"): {"recompute": frozenset({"layernorm", "moe_act"})},
}
_QWEN = ("Qwen3_30B_a3B", "Qwen3_235B_a22B")


def recipe_levers(row: dict) -> Levers:
    """The levers of one Megatron-Bridge row's recipe."""
    kwargs = {**_EVERY_RECIPE, **RECIPE_LEVERS.get((row["system"], row["model"]), {})}
    if row["model"] in _QWEN:
        kwargs.update(_MOE_OPTIMIZER)
    if row["precision"].startswith("FP8"):
        kwargs.update(fp8_param_gather=True, fp8_format="mx" if row["precision"] == "FP8-MX" else "cs")
    return Levers(**kwargs)


def recipe_plan(row: dict, plan: Plan) -> Plan:
    """The row's plan with the levers of its recipe that are plan fields."""
    levers = recipe_levers(row)
    changes: dict[str, object] = {}
    if levers.full:
        changes.update(recompute="full", recompute_layers=levers.recompute_layers or 0)
    elif levers.recompute:
        changes["recompute"] = "+".join(sorted(levers.recompute))
    if levers.offload_layers:
        changes["offload"] = f"layers:{levers.offload_layers}"
    if levers.bf16_moments:
        changes["moments"] = "bf16"
    if levers.bf16_grads:
        changes["grads"] = "bf16"
    return plan.with_(**changes)


def recipe_workload(row: dict) -> tuple[WorkloadSpec, Plan] | None:
    """One Megatron-Bridge row's workload and plan as its recipe ran: `bridge_workload`'s parallel plan with the
    levers of its recipe that are plan fields (`recipe_plan`); None where no preset describes the model."""
    built = bridge_workload(row)
    return None if built is None else (built[0], recipe_plan(row, built[1]))


def simumax_workload(row: dict) -> tuple[WorkloadSpec, Plan]:
    """One SimuMax row as it ran: Llama 3 70B at the row's depth on one node of 8 B200, BF16 Megatron-Core with the
    distributed optimizer, sequence parallelism under tp, and no communication overlapped (the file's header)."""
    spec = parse_spec({"model": {"preset": "llama3-70b", "layers": int(row["layers"]), "seq_len": int(row["seq_len"])},
                       "training": {"global_batch": int(row["global_batch"]), "precision": "bf16",
                                    "framework": "megatron"},
                       "cluster": {"device": "b200", "nodes": 1, "gpus_per_node": 8}})
    plan = Plan(dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), cp=int(row["cp"]), mbs=int(row["mbs"]),
                zero=1, sp=int(row["tp"]) > 1, overlap="none")
    return spec, plan


def _simumax_memory(row: dict, fragmentation: float) -> RankMemory:
    spec, plan = simumax_workload(row)
    device = get_device(spec.cluster.device)
    graph = graph_for(spec.model)
    return rank_memory(spec, graph, apply_plan(spec, graph, plan, device), FRAMEWORKS["megatron"].memory, Levers(),
                       device.mem_capacity, fragmentation=fragmentation)


def _reserved_error(pred_alloc: np.ndarray, measured: np.ndarray, f: float) -> float:
    return float(np.mean(np.abs(pred_alloc * (1 + f) - measured) / measured))


def choose_fragmentation(pred_alloc: np.ndarray, measured_reserved: np.ndarray) -> float:
    """The grid's slack with the lowest mean relative error of reserved memory on these rows."""
    scores = [_reserved_error(pred_alloc, measured_reserved, f) for f in FRAGMENTATION_GRID]
    return float(FRAGMENTATION_GRID[int(np.argmin(scores))])


def simumax_table(path: Path) -> None:
    df = pd.read_csv(path, comment="#")
    rows = df.to_dict("records")
    memories = [_simumax_memory(r, 0.0) for r in rows]
    alloc = np.array([m.peak_allocated for m in memories]) / GIB
    meas_alloc, meas_res = df["peak_allocated_gib"].to_numpy(), df["peak_reserved_gib"].to_numpy()
    plans = df[["tp", "pp", "dp"]].astype(str).agg("/".join, axis=1).to_numpy()
    cv_f = {p: choose_fragmentation(alloc[plans != p], meas_res[plans != p]) for p in sorted(set(plans))}
    in_file_f = choose_fragmentation(alloc, meas_res)
    res_cv = np.array([a * (1 + cv_f[p]) for a, p in zip(alloc, plans)])
    res_in = alloc * (1 + in_file_f)
    print(f"## {SIMUMAX}: per-rank peak of the peak stage (GiB), Megatron-Core + TE accounting, no fitted constant "
          f"in allocated")
    head = " ".join(f"{p[:6]:>7}" for p in GIB_COLUMNS)
    print(f"{'tp/pp/dp':<9} {'m':>3} {head} {'runtime':>7} | {'alloc':>6} {'meas':>6} {'err':>6} | "
          f"{'res(in)':>7} {'res(cv)':>7} {'meas':>6} {'err in':>7} {'err cv':>7}")
    for j, (r, m) in enumerate(zip(rows, memories)):
        g = m.gib()
        parts = " ".join(f"{g[p]:>7.2f}" for p in GIB_COLUMNS)
        print(f"{plans[j]:<9} {int(r['micro_batches']):>3} {parts} {g['runtime']:>7.2f} | {alloc[j]:>6.2f} "
              f"{meas_alloc[j]:>6.2f} {100 * (alloc[j] / meas_alloc[j] - 1):>+5.1f}% | {res_in[j]:>7.2f} "
              f"{res_cv[j]:>7.2f} {meas_res[j]:>6.2f} {100 * (res_in[j] / meas_res[j] - 1):>+6.1f}% "
              f"{100 * (res_cv[j] / meas_res[j] - 1):>+6.1f}%")
    err = np.abs(alloc / meas_alloc - 1)
    print(f"peak allocated: mean |error| {100 * err.mean():.1f}%, max {100 * err.max():.1f}% (in-file = "
          f"cross-validated: nothing fitted); rows within 5%: {int((err <= 0.05).sum())}/{len(err)}")
    for name, res in (("in-file", res_in), ("leave-one-plan-out", res_cv)):
        e = np.abs(res / meas_res - 1)
        print(f"peak reserved, {name}: mean |error| {100 * e.mean():.1f}%, max {100 * e.max():.1f}%")
    print("fragmentation chosen without each plan: " + ", ".join(f"{p}: {f}" for p, f in cv_f.items())
          + f"; on every plan (in-file, recorded in MemoryFacts): {in_file_f}")


def bridge_table(path: Path, headroom_gib: float) -> None:
    df = pd.read_csv(path, comment="#")
    print(f"\n## {BRIDGE}: each recipe plan with its recipe's levers against its GPU (GiB; fits: reserved + runtime "
          f"<= capacity - {headroom_gib:g})")
    print(f"{'system':<10} {'model':<21} {'prec':<6} {'plan':<40} {'levers':<44} {'stage':>5} "
          + " ".join(f"{p[:6]:>7}" for p in GIB_COLUMNS) + f" {'used':>7} {'cap':>6} fits")
    fit = 0
    for r in df.to_dict("records"):
        built = bridge_workload(r)
        if built is None:
            continue
        spec, plan = built
        device = get_device(spec.cluster.device)
        graph = graph_for(spec.model)
        levers = recipe_levers(r)
        m = rank_memory(spec, graph, apply_plan(spec, graph, plan, device), FRAMEWORKS["megatron"].memory, levers,
                        device.mem_capacity, headroom=headroom_gib * GIB)
        g = m.gib()
        fit += m.fits
        short = f"dp={plan.dp},tp={plan.tp},pp={plan.pp},cp={plan.cp},v={plan.v},mbs={plan.mbs},z={plan.zero},ep={plan.ep}"
        print(f"{r['system']:<10} {r['model']:<21} {r['precision']:<6} {short:<40} {_lever_text(levers):<44} "
              f"{m.peak_stage:>5} " + " ".join(f"{g[p]:>7.1f}" for p in GIB_COLUMNS)
              + f" {m.used / GIB:>7.1f} {device.mem_capacity / GIB:>6.1f} {'yes' if m.fits else 'NO'}")
    print(f"recipes predicted to fit with their own levers: {fit}/{len(df)}")


def _lever_text(levers: Levers) -> str:
    out = []
    if levers.recompute:
        out.append("recompute=" + "+".join(sorted(levers.recompute)) +
                   (f",layers={levers.recompute_layers}" if levers.recompute_layers is not None else ""))
    if levers.offload_layers:
        out.append(f"offload=layers:{levers.offload_layers}")
    if levers.bf16_moments:
        out.append("bf16 moments")
    if levers.fp8_param_gather:
        out.append(f"fp8 params ({levers.fp8_format})")
    return ", ".join(out) or "-"


def main() -> int:
    parser = common.parser(__doc__, shared=True)
    parser.add_argument("--headroom-gib", type=float, default=0.0, help="memory kept free on each GPU")
    args = parser.parse_args()
    simumax, bridge = common.ground_truth(args.shared, SIMUMAX, BRIDGE)
    t0 = time.perf_counter()
    simumax_table(simumax)
    bridge_table(bridge, args.headroom_gib)
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
