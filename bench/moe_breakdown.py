"""Where the MoE rows of megatron_bridge_2511.csv spend their predicted time, and how their errors group.

bench.modern_eval gives each MoE row's error; finding the mechanism behind the worst of them needs the parts: per row,
with the recorded Megatron-Core constants, the slowest pipeline stage's seconds per micro-batch in the expert grouped
GEMMs, attention (MLA included), the router, the other linears (attention projections, dense layers, shared
experts), the host's own pace beyond the kernels and the MoE dispatcher's host waits (`expert_host_s`), and its
token all-to-alls with where the ep group sits (ranks per NVLink domain x domains: a second factor above 1 crosses
InfiniBand); then the iteration's exposed parts and what overlap hid. The errors are then grouped by model, system,
the ep group's placement and precision, so a shared mechanism shows as a group's signed mean.

    .venv/bin/python -m bench.moe_breakdown [--shared PATH]
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from bench import common
from bench.modern_eval import FILE, Rows, load_rows, recipe_rows
from predictor.costs.parallel import apply_plan
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.roofline import framework_config, layer_times
from predictor.models.stage_costs import compute_parts, ep_stage_time
from predictor.plan import nvlink_domain
from predictor.spec.resolver import get_device, resolve

# Node groups of the stage's kernel time, each a predicate on the sharded nodes (kind, experts, attention).
KERNEL_GROUPS: tuple[str, ...] = ("experts", "attention", "router", "linear", "other")


@dataclass(frozen=True)
class RowParts:
    """One MoE row's predicted parts: per micro-batch on the slowest stage (`stage`), per iteration (`iteration`)."""

    label: dict[str, str]
    measured_s: float
    predicted_s: float
    stage: dict[str, float]
    iteration: dict[str, float]

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def placement(spec, plan, group) -> str:
    """Where the ep group's all-to-alls run: inside one NVLink domain (a node, or an NVL72 rack) or across domains."""
    where = "NVL72 rack" if nvlink_domain(spec) > spec.cluster.gpus_per_node else "node"
    return f"in one {where}" if group.n_inter == 1 else f"over {where}s (InfiniBand)"


def row_parts(spec, graph, plan, measured_s: float, label: dict[str, str]) -> RowParts:
    """The predicted parts of one row under the constants its framework and device generation record."""
    resolved = resolve(spec, get_device(spec.cluster.device))  # the catalogue device, without the cluster's links
    device = resolved.device
    cfg = framework_config(resolved.framework, resolved.generation, device.name)
    lay = apply_plan(spec, graph, plan, device)
    t_f, t_b, host_f, host_b, sync_f, sync_b, *_ = compute_parts(resolved, graph, lay, cfg)
    slowest = int(np.argmax(t_f + t_b + sync_f + sync_b))
    fwd, bwd = layer_times(resolved, graph, lay.share, plan.mbs, cfg)
    nodes, counts = lay.nodes, lay.stage_counts[slowest]
    kind = np.asarray(nodes.kind)
    masks = {"experts": nodes.experts, "attention": nodes.attention, "router": kind == "router",
             "linear": (kind == "linear") & ~nodes.experts}
    masks["other"] = ~np.logical_or.reduce(list(masks.values()))
    stage = {name: float(counts[mask] @ (fwd + bwd)[mask]) for name, mask in masks.items()}
    stage.update(host=float(host_f[slowest] + host_b[slowest]), expert_host=float(sync_f[slowest] + sync_b[slowest]),
                 a2a=float(ep_stage_time(resolved, lay, cfg)[slowest]))
    prediction = AnalyticalPredictor(None).predict(spec, graph, [plan])[0]
    iteration = {k: v for k, v in prediction.breakdown.items() if v}
    iteration.update({f"hidden {k}": v for k, v in prediction.hidden_comm.items()})
    label = {**label, "placement": placement(spec, plan, lay.groups["ep"]),
             "plan": f"ep={plan.ep} ({lay.groups['ep'].n_intra}x{lay.groups['ep'].n_inter}) tp={plan.tp} pp={plan.pp} "
                     f"v={plan.v} mbs={plan.mbs} m={plan.microbatches(spec.training.global_batch)} "
                     f"experts/rank={(spec.model.experts or 0) // plan.ep}"}
    return RowParts(label, measured_s, prediction.iter_time_s, stage, iteration)


def moe_rows(path) -> list[RowParts]:
    """Every MoE row of the file with its predicted parts."""
    df = load_rows(path)
    rows = Rows.of(df, recipe_rows(df), moe=True)
    out = []
    for (spec, graph, plan), measured, (_, r) in zip(rows.rows, rows.measured, rows.frame.iterrows()):
        label = {"system": r["system"], "model": r["model"], "precision": r["precision"]}
        out.append(row_parts(spec, graph, plan, float(measured), label))
    return out


def grouped(rows: list[RowParts], key: str) -> dict[str, tuple[int, float, float]]:
    """Per value of `key`: rows, mean |error| and mean signed error (fractions)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        groups[row.label[key]].append(row.error)
    return {k: (len(v), float(np.mean(np.abs(v))), float(np.mean(v))) for k, v in sorted(groups.items())}


def main() -> int:
    args = common.parser(__doc__, shared=True).parse_args()
    (path,) = common.ground_truth(args.shared, FILE)
    rows = moe_rows(path)
    for row in rows:
        lab = row.label
        print(f"{lab['system']:<10} {lab['model']:<21} {lab['precision']:<7} {lab['plan']}: measured "
              f"{row.measured_s:.2f} s, predicted {row.predicted_s:.2f} s ({100 * row.error:+.1f} %)")
        print("    per micro-batch, slowest stage (s): " + ", ".join(f"{k} {v:.3f}" for k, v in row.stage.items()))
        print("    iteration (s): " + ", ".join(f"{k} {v:.3f}" for k, v in row.iteration.items()))
    print(f"\nMAPE {100 * np.mean([abs(r.error) for r in rows]):.1f} % over {len(rows)} MoE rows (recorded constants)")
    for key in ("model", "system", "placement", "precision"):
        print(f"by {key}: " + "; ".join(f"{k} n={n} |err| {100 * a:.1f} % (signed {100 * s:+.1f} %)"
                                        for k, (n, a, s) in grouped(rows, key).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
