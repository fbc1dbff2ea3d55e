"""The ScaleDL paper's evaluation protocols on a profile dataset, for any set of predictors.

- in-domain (ID): per architecture, a seeded split of its configurations (160 train / 40 test
  when it has 200), one model trained per architecture;
- out-of-domain (OOD): leave one architecture out, train on the others, test on it;
- metrics on the iteration time: MRE (%) and RMSE (ms); on peak memory where measured: MRE (%).

A method is a factory returning an unfitted `Predictor`; the test configurations' iteration
and layer measurements are never seen by the fit.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, replace
from math import prod
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd

from predictor.data import dataset
from predictor.models import registry
from predictor.models.base import Predictor
from predictor.models.features import Sample, TrainingData, by_workload, graph_of
from predictor.models.intervals import residual_quantiles
from predictor.models.records import LayerObs, layer_key
from predictor.plan import AXIS_NAMES, GPU_AXES, Plan, plan_errors
from predictor.spec.families import PROFILED
from predictor.spec.hardware import catalogue_name
from predictor.spec.workload import ModelSpec, WorkloadSpec, parse_spec

CPU_DATASET = Path(__file__).parent / "cpu"
FAMILIES = PROFILED  # the paper's families, which the CPU dataset measures
# Profile measurements train with Adam (predictor.measure.dist_worker), one rank per process, in
# the dtype the dataset's settings.json records (fp32 when it records none, as the CPU data).
PRECISIONS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

# vTrain's cluster (shared/ground_truth/README.md): 8 A100 per node on NVLink, 800 Gb/s InfiniBand per node = 12.5 GB/s
# per GPU. NVLink is the catalogue's (300 GB/s per direction), not vTrain's own 150 GB/s model: on the single-node
# file the fitted fixed costs describe the rows with a mean squared log error of 0.011 against 0.073
# (bench/results/a100_eval.txt, top). One translation of the rows for every use (training, bench/vtrain_eval.py,
# bench/a100_eval.py), so every figure quoted for that data is of the same workloads.
VTRAIN_INTER_NODE = {"bandwidth_gbps": 12.5, "latency_us": 10.0}
VTRAIN_GPUS_PER_NODE = 8
GPT2_VOCAB = 50257

Method = Callable[[int], Predictor]
# The predictors by name come from the one registry (predictor.models.registry): its default set, the ablations,
# and the variants asked for by name only.
METHODS: dict[str, Method] = registry.group("method")
ABLATIONS: dict[str, Method] = registry.group("ablation")
VARIANTS: dict[str, Method] = registry.group("variant")
ALL_METHODS: dict[str, Method] = {**METHODS, **ABLATIONS, **VARIANTS}


# ------------------------------------------------------------------ loading


def spec_for(model_json: str, batch: int, plan: Plan, device: str = "cpu", precision: str = "fp32",
             device_profile: str | None = None):
    """The workload of one profiled configuration: its model, global batch, and one 'node' of plan.gpus ranks
    (priced with `device_profile` where the dataset ships the profile of the machine it was measured on)."""
    model = ModelSpec.model_validate_json(model_json) if isinstance(model_json, str) else model_json
    # Profile datasets are measured by ScaleDL's own runner, on a CPU and on a GPU alike.
    training = {"global_batch": int(batch), "precision": precision, "optimizer": "adam", "framework": "pytorch"}
    cluster = {"device": device, "nodes": 1, "gpus_per_node": plan.gpus}
    if device_profile is not None:
        cluster["device_profile"] = device_profile
    return parse_spec({"model": model.model_dump(exclude_none=True), "training": training, "cluster": cluster})


def dataset_profile(root: str | Path, device: str) -> str | None:
    """The absolute path of a measured-device dataset's own device.json, None where it has none (or the
    device is a catalogue GPU): training and evaluating on the dataset then price it as measured there,
    so its figures do not depend on the machine that reruns them."""
    path = Path(root).resolve() / "device.json"
    return str(path) if device == "cpu" and path.is_file() else None


def dataset_device(root: str | Path, fingerprints: Sequence[str]) -> tuple[str, str]:
    """(catalogue device, precision) a profile dataset was measured with: one device per dataset."""
    names = sorted({catalogue_name(f) for f in fingerprints})
    if len(names) > 1:
        raise ValueError(f"{root} mixes measurements of several devices ({', '.join(names)}); keep one device per dataset")
    settings = Path(root) / "settings.json"
    dtype = json.loads(settings.read_text()).get("dtype", "float32") if settings.exists() else "float32"
    return (names[0] if names else "cpu"), PRECISIONS[dtype]


def load_profile_dataset(root: str | Path = CPU_DATASET, designs: Sequence[str] | None = ("doptimal",),
                         families: Sequence[str] | None = FAMILIES, with_layers: bool = True) -> TrainingData:
    """Measured iterations (status ok) of `designs` and `families` (None: every family, as `scaledl profile --spec`
    measures a user's own) as Samples, with their layer timings and provenance."""
    it = dataset.load(root, "iterations")
    it = it[(it["status"] == "ok") & (it["iter_time_s"] > 0)]
    if families is not None:
        it = it[it["family"].isin(families)]
    if designs is not None:
        it = it[it["design"].isin(designs)]
    it = it.sort_values("config_id").reset_index(drop=True)
    device, precision = dataset_device(root, it["device"])
    profile = dataset_profile(root, device)
    samples: list[Sample] = []
    for row in it.itertuples(index=False):
        plan = Plan.parse(row.plan)
        mem = row.peak_mem_bytes / 1024**3 if pd.notna(row.peak_mem_bytes) and row.peak_mem_bytes > 0 else None
        samples.append(Sample(spec_for(row.spec_json, row.batch, plan, device, precision, profile), plan,
                              float(row.iter_time_s), mem, model=row.family, config_id=row.config_id))
    layers = _layer_obs(root, samples) if with_layers else []
    prov = {"dataset": str(root), "designs": list(designs) if designs else "all", "rows": len(samples),
            "device": sorted(set(it["device"])), "device_profile": str(Path(root) / "device.json") if profile else None,
            "torch_version": sorted(set(it["torch_version"])),
            "measured_from": str(it["measured_at"].min()) if len(it) else "", "measured_to": str(it["measured_at"].max()) if len(it) else ""}
    return TrainingData(samples, layers, prov)


def _layer_obs(root: str | Path, samples: list[Sample]) -> list[LayerObs]:
    table = dataset.load(root, "layers")
    if table.empty:
        return []
    by_id = {s.config_id: s for s in samples}
    table = table[table["config_id"].isin(by_id) & (table["fwd_s"] > 0)]
    obs: list[LayerObs] = []
    for cid, rows in table.groupby("config_id", sort=True):
        s = by_id[cid]
        graph = graph_of(s.spec)
        index = {n.name: i for i, n in enumerate(graph.nodes)}
        key = replace(layer_key(s.spec, s.plan), tp=1, sp=False)  # layers are timed whole, in one process
        for r in rows.itertuples(index=False):
            if r.node in index:
                obs.append(LayerObs(s.spec, graph, index[r.node], key, float(r.fwd_s), float(r.bwd_s)))
    return obs


def megatron_vocab(tp: int, vocab: int = GPT2_VOCAB) -> int:
    """Megatron's padded vocabulary: a multiple of 128·tp (`make_vocab_size_divisible_by` times tp)."""
    multiple = 128 * tp
    return -(-vocab // multiple) * multiple


def vtrain_workload(row: dict) -> tuple[WorkloadSpec, Plan]:
    """One vTrain row as the workload and plan that ran: Megatron-DeepSpeed GPT, fp16 mixed precision, Adam,
    1F1B with full recomputation, the vocabulary padded for the row's tp, on vTrain's network."""
    gpus, tp = int(row["# GPUs"]), int(row["tensor parallelism"])
    per_node = min(gpus, VTRAIN_GPUS_PER_NODE)
    spec = parse_spec({
        "model": {"family": "gpt", "hidden": int(row["hidden size"]), "layers": int(row["# layers"]),
                  "heads": int(row["attention heads"]), "seq_len": int(row["sequence length"]),
                  "vocab": megatron_vocab(tp)},
        "training": {"global_batch": int(row["global batch"]), "precision": "fp16", "optimizer": "adam",
                     "framework": "deepspeed"},
        "cluster": {"device": "a100-80gb", "nodes": gpus // per_node, "gpus_per_node": per_node,
                    "inter_node": VTRAIN_INTER_NODE}})
    plan = Plan(dp=int(row["data parallelism"]), tp=tp, pp=int(row["pipeline parallelism"]),
                mbs=int(row["micro batch"]), recompute="full", schedule="1f1b")
    return spec, plan


# Megatron-Bridge's systems and models (megatron_bridge_2511.csv) as catalogue devices and presets.
BRIDGE_DEVICES: dict[str, str] = {"DGX-H100": "h100", "DGX-B200": "b200", "DGX-GB200": "gb200", "DGX-GB300": "gb300"}
BRIDGE_PRESETS: dict[str, str] = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3.1-405b",
                                  "DeepSeekV3 (w/o MTP)": "deepseek-v3", "DeepSeekV3 (w/ MTP)": "deepseek-v3",
                                  "GPT_OSS_120B": "gpt-oss-120b", "Qwen3_30B_a3B": "qwen3-30b-a3b",
                                  "Qwen3_235B_a22B": "qwen3-235b-a22b"}
# Rows that train with multi-token prediction (one MTP layer, as DeepSeek-V3 was trained).
BRIDGE_MTP: dict[str, int] = {"DeepSeekV3 (w/ MTP)": 1}
# Each precision column value as the spec's (precision, Transformer Engine recipe).
BRIDGE_PRECISIONS: dict[str, tuple[str, str | None]] = {"BF16": ("bf16", None), "FP8-CS": ("fp8", "current"),
                                                        "FP8-MX": ("fp8", "mxfp8")}


def bridge_measured_s(row: dict) -> float:
    """A Megatron-Bridge row's iteration time: gbs · seq_len / (gpus · tokens/s/GPU), as its header says."""
    return int(row["gbs"]) * int(row["seq_len"]) / (int(row["gpus"]) * float(row["tokens_per_s_per_gpu"]))


def bridge_workload(row: dict) -> tuple[WorkloadSpec, Plan] | None:
    """One Megatron-Bridge performance-recipe row as the workload and exact plan that ran (None for a model
    no preset describes): Megatron-Core, 8 GPUs per node (an NVL72 rack on GB200/GB300), each axis the row has
    a column of at that degree and dp the rest of the GPUs, Megatron-FSDP (fsdp > 0) as ZeRO-3, else the
    distributed optimizer (ZeRO-1), sequence parallel with tp, vp > 1 as the interleaved schedule."""
    preset = BRIDGE_PRESETS.get(row["model"])
    if preset is None:
        return None
    degrees = {axis: int(row[axis]) for axis in AXIS_NAMES if axis in row}
    gpus, tp, vp = int(row["gpus"]), degrees["tp"], int(row["vp"])
    precision, recipe = BRIDGE_PRECISIONS[row["precision"]]
    spec = parse_spec({
        "model": {"preset": preset, "seq_len": int(row["seq_len"]), "mtp_layers": BRIDGE_MTP.get(row["model"], 0)},
        "training": {"global_batch": int(row["gbs"]), "precision": precision, "recipe": recipe,
                     "framework": "megatron"},
        "cluster": {"device": BRIDGE_DEVICES[row["system"]], "nodes": gpus // 8, "gpus_per_node": 8}})
    plan = Plan(**degrees, dp=gpus // prod(degrees.get(axis, 1) for axis in GPU_AXES), mbs=int(row["mbs"]),
                zero=3 if int(row["fsdp"]) > 0 else 1, sp=tp > 1, schedule="interleaved" if vp > 1 else "1f1b", v=vp)
    return spec, plan


def load_vtrain(path: str | Path) -> list[Sample]:
    """vTrain rows as Samples (`vtrain_workload`); `config_id` is the row's index in the file. Tensor
    parallelism across nodes is allowed: vTrain ran it (tp=16 on 64 and 256 GPUs)."""
    path = Path(path)
    frame = pd.read_csv(path, encoding="utf-8-sig")
    samples, skipped = [], []
    for i, r in enumerate(frame.to_dict("records")):
        spec, plan = vtrain_workload(r)
        errors = plan_errors(plan, spec, allow_cross_node_tp=True)
        if errors:
            skipped.append(f"row {i}: {'; '.join(errors)}")
            continue
        model = f"{r['Parameters (billion)']}B" if "Parameters (billion)" in r else f"h{r['hidden size']}-l{r['# layers']}"
        samples.append(Sample(spec, plan, float(r["iteration time (ms)"]) / 1000, model=model, config_id=f"{path.stem}:{i}"))
    if skipped:
        warnings.warn(f"{path.name}: skipped {len(skipped)} rows whose plan is invalid for the spec, e.g. {skipped[0]}",
                      stacklevel=2)
    return samples


def subset(data: TrainingData, keep: Callable[[Sample], bool]) -> TrainingData:
    """The samples `keep` accepts, with only their own layer timings."""
    samples = [s for s in data.samples if keep(s)]
    ids = {id(s.spec) for s in samples}
    return TrainingData(samples, [o for o in data.layers if id(o.spec) in ids], dict(data.provenance, rows=len(samples)))


# ------------------------------------------------------------------ metrics


def predict_samples(model: Predictor, samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """Predicted iteration seconds and peak GiB of each sample, batched per workload."""
    time = np.empty(len(samples))
    mem = np.empty(len(samples))
    for spec, graph, idx in by_workload(samples):
        preds = model.predict(spec, graph, [samples[i].plan for i in idx])
        time[idx] = [p.iter_time_s for p in preds]
        mem[idx] = [p.peak_memory_gib for p in preds]
    return time, mem


def mre(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - true) / true) * 100)


def rmse_ms(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred - true) ** 2)) * 1000)


def _shuffled_per_model(data: TrainingData, seed: int, by_id: bool = False) -> Iterator[tuple[str, list[Sample]]]:
    """Each architecture (sorted) with its samples in a seeded random order: of the data's order, or
    (`by_id`) of the config ids' order, which does not depend on how the data was loaded."""
    for fam in sorted({s.model for s in data.samples}):
        mine = [s for s in data.samples if s.model == fam]
        if by_id:
            mine.sort(key=lambda s: s.config_id)
        yield fam, [mine[i] for i in np.random.default_rng(seed).permutation(len(mine))]


def holdout_split(data: TrainingData, fraction: float, seed: int = 0) -> tuple[TrainingData, list[Sample]]:
    """(train, held out): a seeded `fraction` of each architecture's configurations held out, so the
    accuracy a checkpoint records is measured on configurations it never saw."""
    held: set[str] = set()
    for _, mine in _shuffled_per_model(data, seed, by_id=True):
        held.update(s.config_id for s in mine[: int(round(fraction * len(mine)))])
    return subset(data, lambda s: s.config_id not in held), [s for s in data.samples if s.config_id in held]


def holdout_source(where: str | Path, fraction: float, seed: int) -> str:
    """How a checkpoint's accuracy record names the configurations `holdout_split` held out."""
    return f"held-out configurations of {where} ({fraction:.0%}, seed {seed})"


def accuracy_of(model: Predictor, samples: Sequence[Sample], source: str) -> dict[str, object]:
    """The accuracy record a checkpoint carries (reports show it): errors of `model` on `samples`."""
    true = np.asarray([s.iter_time_s for s in samples])
    pred, _ = predict_samples(model, samples)
    return {"mape_pct": round(mre(pred, true), 2), "rmse_ms": round(rmse_ms(pred, true), 3), "rows": len(samples),
            "source": source, "measured_by": "scaledl train", "residual_quantiles": residual_quantiles(true, pred)}


@dataclass
class Split:
    protocol: str  # "id" or "ood"
    model: str  # the architecture tested
    train: TrainingData
    test: list[Sample]


def in_domain_splits(data: TrainingData, n_train: int = 160, seed: int = 0) -> list[Split]:
    """Per architecture: a seeded split, n_train for training (at most 80% when fewer were measured)."""
    out = []
    for fam, mine in _shuffled_per_model(data, seed):
        k = min(n_train, int(round(0.8 * len(mine))))
        train_ids = {s.config_id for s in mine[:k]}
        out.append(Split("id", fam, subset(data, lambda s: s.config_id in train_ids), mine[k:]))
    return out


def out_of_domain_splits(data: TrainingData) -> list[Split]:
    """Leave one architecture out: train on the others, test on all of it."""
    fams = sorted({s.model for s in data.samples})
    return [Split("ood", fam, subset(data, lambda s, f=fam: s.model != f), [s for s in data.samples if s.model == fam])
            for fam in fams if len(fams) > 1]


def evaluate(methods: dict[str, Method], splits: Sequence[Split], seed: int = 0,
             log: Callable[[str], None] = lambda _m: None) -> pd.DataFrame:
    """One row per (protocol, method, model): MRE %, RMSE ms, memory MRE % where measured, sizes."""
    rows = []
    for split in splits:
        if not split.test or not split.train.samples:
            continue
        true = np.asarray([s.iter_time_s for s in split.test])
        mem_true = np.asarray([s.peak_memory_gib or np.nan for s in split.test], dtype=float)
        has_mem = ~np.isnan(mem_true)
        for name, make in methods.items():
            model = make(seed).fit(split.train)
            pred, mem = predict_samples(model, split.test)
            rows.append({"protocol": split.protocol, "method": name, "model": split.model, "n_train": len(split.train.samples),
                         "n_test": len(split.test), "mre": mre(pred, true), "rmse_ms": rmse_ms(pred, true),
                         "mem_mre": mre(mem[has_mem], mem_true[has_mem]) if has_mem.any() else float("nan"),
                         "pred": pred.tolist(), "true": true.tolist()})
            log(f"{split.protocol} {split.model:5s} {name:18s} MRE {rows[-1]['mre']:6.2f}%  RMSE {rows[-1]['rmse_ms']:8.2f} ms")
    return pd.DataFrame(rows)


def overall(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (protocol, method): MRE over all test samples pooled, RMSE pooled; and the per-model average."""
    out = []
    for (proto, method), g in frame.groupby(["protocol", "method"], sort=False):
        pred = np.concatenate([np.asarray(p) for p in g["pred"]])
        true = np.concatenate([np.asarray(t) for t in g["true"]])
        out.append({"protocol": proto, "method": method, "model": "Overall", "mre": mre(pred, true),
                    "rmse_ms": rmse_ms(pred, true), "mem_mre": float(np.nanmean(g["mem_mre"])) if g["mem_mre"].notna().any() else float("nan"),
                    "avg_mre": float(g["mre"].mean()), "avg_rmse_ms": float(g["rmse_ms"].mean())})
    return pd.DataFrame(out)


def format_table(frame: pd.DataFrame, protocol: str, title: str) -> str:
    """Table I layout: rows = Overall + each model, columns = methods, cells 'MRE% / RMSE ms'."""
    part = frame[frame["protocol"] == protocol]
    if part.empty:
        return f"{title}: no results"
    methods = list(dict.fromkeys(part["method"]))
    summary = overall(part)
    models = ["Overall"] + [m for m in FAMILIES if m in set(part["model"])]
    width = max(20, *(len(m) + 2 for m in methods))
    lines = [title, "model".ljust(8) + "".join(m.rjust(width) for m in methods)]
    for model in models:
        cells = []
        for method in methods:
            src = summary if model == "Overall" else part
            row = src[(src["method"] == method) & (src["model"] == model)]
            cells.append((f"{row['mre'].iloc[0]:.2f} / {row['rmse_ms'].iloc[0]:.2f}" if len(row) else "-").rjust(width))
        lines.append(model.ljust(8) + "".join(cells))
    lines.append("cells: MRE % / RMSE ms; Overall pools every test sample of every model")
    return "\n".join(lines)


def format_average(frame: pd.DataFrame, protocol: str, title: str) -> str:
    """Fig. 5 layout: per method, MRE, RMSE and peak-memory MRE averaged over the models of `protocol`."""
    summary = overall(frame[frame["protocol"] == protocol])
    lines = [title, f"{'method':18s}{'MRE %':>10s}{'RMSE ms':>12s}{'mem MRE %':>11s}"]
    for r in summary.itertuples():
        lines.append(f"{r.method:18s}{r.avg_mre:10.2f}{r.avg_rmse_ms:12.2f}{r.mem_mre:11.2f}")
    return "\n".join(lines)


def format_seed_spread(frames: dict[int, pd.DataFrame]) -> str:
    """Per protocol and method, the pooled MRE and RMSE of each seed's run (other in-domain splits and
    initialisations), their mean and standard deviation: how far apart two methods must be before one
    seeded split can tell them apart."""
    rows = [(r.protocol, r.method, seed, r.mre, r.rmse_ms) for seed, frame in frames.items() for r in overall(frame).itertuples()]
    table = pd.DataFrame(rows, columns=["protocol", "method", "seed", "mre", "rmse_ms"])
    seeds = ", ".join(map(str, frames))
    lines = [f"Pooled MRE % / RMSE ms over seeds {seeds}: mean ± sd, then each seed",
             f"{'protocol':9s}{'method':18s}{'MRE %':>15s}{'RMSE ms':>16s}   per seed (MRE / RMSE)"]
    for (protocol, method), g in table.groupby(["protocol", "method"], sort=False):
        per_seed = "  ".join(f"{m:.2f} / {r:.2f}" for m, r in zip(g["mre"], g["rmse_ms"]))
        lines.append(f"{protocol:9s}{method:18s}{g['mre'].mean():8.2f} ± {g['mre'].std(ddof=0):4.2f}"
                     f"{g['rmse_ms'].mean():9.2f} ± {g['rmse_ms'].std(ddof=0):4.2f}   {per_seed}")
    return "\n".join(lines)


def save_results(frame: pd.DataFrame, path: str | Path) -> None:
    """Write the per-split results as JSON, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(frame.to_dict(orient="records"), indent=1))
    tmp.replace(path)


def paper_tables(data: TrainingData, methods: dict[str, Method], protocols: Sequence[str] = ("id", "ood"),
                 seed: int = 0, n_train: int = 160, log: Callable[[str], None] = lambda _m: None) -> tuple[str, pd.DataFrame]:
    """Run the protocols and render Table I (ID), the OOD table and Fig. 5's OOD averages."""
    splits: list[Split] = []
    if "id" in protocols:
        splits += in_domain_splits(data, n_train, seed)
    if "ood" in protocols:
        splits += out_of_domain_splits(data)
    frame = evaluate(methods, splits, seed, log)
    if frame.empty:
        return "no results (no split had both training and test samples)", frame
    text = []
    if "id" in protocols:
        text.append(format_table(frame, "id", f"In-domain (per model, seeded split, up to {n_train} train), paper Table I"))
        text.append(format_average(frame, "id", "In-domain average over models"))
    if "ood" in protocols:
        text.append(format_table(frame, "ood", "Out-of-domain (leave one architecture out), per held-out model"))
        text.append(format_average(frame, "ood", "Out-of-domain average over held-out architectures (paper Fig. 5)"))
    return "\n\n".join(text), frame
