"""The profiling runner: choose configurations, measure them for real, append to a dataset.

For each configuration: the whole training iteration under its plan (`measure_iteration`
on a persistent pool of rank processes) and the per-layer forward/backward times at its
micro-batch (`time_layers`, on rank 0). Each configuration's rows are appended as soon as
they exist, layers first and the iteration row last: the iteration row marks the
configuration done, so a run killed at any point and restarted with `resume=True` skips
exactly the finished configurations and re-measures the rest (layer rows of an unfinished
one are replaced, not duplicated, by the dataset's dedupe on (config_id, node)).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from predictor.data import dataset
from predictor.measure.design import GRIDS, ProfileConfig, candidates, choose
from predictor.measure.iteration import WorkerPool, measure_iteration
from predictor.plan import Plan
from predictor.spec.workload import ModelSpec, WorkloadSpec


class ProfileError(ValueError):
    """A profiling request that cannot run as given; the message says what to change."""


@dataclass
class ProfileSettings:
    steps: int = 3
    warmup: int = 1
    layer_repeats: int = 3
    layers: bool = True
    timeout_s: float = 300.0
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 1
    procs: int = 2


@dataclass
class ProfileSummary:
    planned: int = 0
    skipped: int = 0
    measured: int = 0
    failed: int = 0
    seconds: float = 0.0
    by_status: dict[str, int] = field(default_factory=dict)


def select(families: list[str], design: str, budget: int, seed: int = 0, max_procs: int = 2,
           strata: list[str] | None = None, flop_cap: float | None = None,
           grid: str = "cpu", label: str | None = None) -> list[tuple[ProfileConfig, str]]:
    """(config, design label) for every family, in family order (one family finishes before the next).

    The label (default: the design's name) is what the dataset's `design` column records.
    """
    label = label or design
    out: list[tuple[ProfileConfig, str]] = []
    for family in families:
        pool = candidates(family, max_procs=max_procs, flop_cap=flop_cap, grid=grid)
        if strata:
            unknown = set(strata) - {c.stratum for c in pool}
            if unknown:
                raise ProfileError(f"--plans {','.join(sorted(unknown))} matches no {family} candidate; "
                                   f"available: {', '.join(sorted({c.stratum for c in pool}))}")
            pool = [c for c in pool if c.stratum in strata]
        if not pool:
            cap = GRIDS[grid].flop_cap if flop_cap is None else flop_cap
            raise ProfileError(f"no {family} candidates of the {grid} grid fit the FLOP cap {cap:g}; raise --flop-cap")
        if design == "full":  # in random order: a run stopped early still covers the grid uniformly
            order = np.random.default_rng(seed).permutation(len(pool))
            out += [(pool[i], label) for i in order]
        else:
            out += [(cfg, label) for cfg in choose(pool, min(budget, len(pool)), design, seed)]
    return out


SPEC_MICRO_BATCHES = (1, 2, 4, 8)
SPEC_BLOCKS = 2  # blocks of a spec's model measured: layers are timed per block, and an iteration of two shows the step


def reduced_model(model: ModelSpec, blocks: int = SPEC_BLOCKS) -> ModelSpec:
    """The spec's model cut to `blocks` repeated blocks (an MoE model keeps one dense block before its MoE ones; a
    T5 splits them between encoder and decoder), every width as the spec has it: a layer's time depends on its
    shapes, not on how many copies follow it, and a 405B model's full depth fits no single device. A `module:`
    or `hf_config:` model without a `layers` field is measured as given."""
    if model.layers is None or model.layers <= blocks:
        return model
    update: dict = {"layers": blocks}
    if model.dense_layers:
        update["dense_layers"] = 1
    if model.decoder_layers:
        update.update(layers=max(1, blocks // 2), decoder_layers=max(1, blocks // 2))
    return ModelSpec.model_validate({**model.model_dump(exclude_none=True), **update})


def spec_configs(spec: WorkloadSpec, label: str = "spec") -> list[tuple[ProfileConfig, str]]:
    """A spec's own model (reduced in depth) at one process and micro-batches 1-8 up to its global batch: what
    `scaledl profile --spec` measures so that the learned predictor sees the user's layers, not only the paper's
    five families."""
    model = reduced_model(spec.model)
    batches = [b for b in SPEC_MICRO_BATCHES if b <= spec.training.global_batch] or [1]
    return [(ProfileConfig(model, b, Plan(dp=1, mbs=b)), label) for b in batches]


def config_row(cfg: ProfileConfig) -> dict:
    m, p = cfg.model, cfg.plan
    return {"config_id": cfg.config_id, "family": cfg.family, "spec_json": cfg.spec_json, "batch": cfg.batch,
            "plan": str(p), "dp": p.dp, "tp": p.tp, "pp": p.pp, "mbs": p.mbs, "zero": p.zero, "schedule": p.schedule,
            "layers": m.num_blocks, "hidden": m.hidden, "heads": m.heads, "tokens": m.tokens}


def measure_config(pool: WorkerPool, cfg: ProfileConfig, settings: ProfileSettings, design: str) -> tuple[dict, list[dict]]:
    """One configuration's iteration row and layer rows (not yet written)."""
    prov = dataset.provenance(settings.device, settings.threads)
    start = time.monotonic()
    result = measure_iteration(pool, cfg, settings.steps, settings.warmup, settings.timeout_s, settings.dtype)
    row = {**config_row(cfg), "design": design, **result.row(), **prov}
    layer_rows: list[dict] = []
    if settings.layers and result.status == "ok":
        job = {"kind": "layers", "spec_json": cfg.spec_json, "batch": cfg.plan.mbs, "repeats": settings.layer_repeats,
               "warmup": 1, "dtype": settings.dtype}
        answer = pool.run(job, 1, settings.timeout_s)[0]
        if answer.get("status") == "ok":
            layer_rows = [{"config_id": cfg.config_id, "family": cfg.family, **r, **prov} for r in answer["rows"]]
        else:
            row["error"] = f"layer timing failed: {answer.get('error', answer.get('status'))}"
    row["measure_s"] = time.monotonic() - start  # wall time this configuration cost to collect
    return row, layer_rows


def run_profile(configs: list[tuple[ProfileConfig, str]], out: str | Path, resume: bool,
                settings: ProfileSettings | None = None,
                on_config: Callable[[ProfileConfig, dict, int, int], None] | None = None) -> ProfileSummary:
    """Measure every configuration not yet in `out`, appending atomically after each one."""
    settings = settings or ProfileSettings()
    out = Path(out)
    done = dataset.measured_ids(out) if out.exists() else set()
    if done and not resume:
        raise ProfileError(f"{out} already holds {len(done)} measured configurations; pass --resume to continue "
                           f"it, or choose another --out")
    todo = [(c, d) for c, d in configs if c.config_id not in done]
    summary = ProfileSummary(planned=len(configs), skipped=len(configs) - len(todo))
    out.mkdir(parents=True, exist_ok=True)
    (out / "settings.json").write_text(json.dumps(settings.__dict__, indent=1))
    start = time.monotonic()
    if not todo:
        return summary
    pool = WorkerPool(world=settings.procs, threads=settings.threads, device=settings.device)
    try:
        for i, (cfg, design) in enumerate(todo):
            row, layer_rows = measure_config(pool, cfg, settings, design)
            dataset.append(out, "layers", layer_rows)
            dataset.append(out, "iterations", [row])
            summary.measured += 1
            summary.failed += row["status"] != "ok"
            summary.by_status[row["status"]] = summary.by_status.get(row["status"], 0) + 1
            if on_config:
                on_config(cfg, row, i + 1, len(todo))
    finally:
        pool.close()
        summary.seconds = time.monotonic() - start
    return summary


def record_device_profile(out: str | Path, device: str = "cpu") -> dict:
    """Measure the device (matmul FLOP/s, copy bandwidth; on CPU also gloo collectives) into out/device.json.

    Uses `predictor.measure.device.measure_cpu` or `measure_cuda`, so the dataset carries the
    device profile (the paper's h_dev) it was measured with, next to the rows' device fingerprint.
    """
    import os

    from predictor.measure.device import measure_cpu, measure_cuda

    measured = measure_cuda() if device.startswith("cuda") else measure_cpu()
    record = {**measured, "dataset_device": dataset.device_fingerprint(device)}
    path = Path(out) / "device.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".device.json.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return record
