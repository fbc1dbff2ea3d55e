"""D-optimal choice of the configurations worth measuring (ScaleDL paper, Eqs. 4-5).

Each candidate configuration i has a feature vector a_i; we pick exactly k distinct ones
maximising log det(sum a_i a_i^T) with a (modified) Fedorov exchange. Features are the
log2 of the design variables, standardised over the candidates, expanded to a full
quadratic model (intercept, main effects, squares, interactions): a purely linear model
would only ever pick the corners of the box, while a quadratic one also asks for interior
points, which is what a nonlinear regressor trained on the result needs.

Candidates per model family (`candidates`) span layers, hidden, heads, sequence length
(image size for ViT/DeiT), batch and the parallel plan over at most `max_procs`
processes, from a named grid (`GRIDS`): small models for a 2-core CPU, realistic ones for a GPU.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from predictor.plan import Plan
from predictor.spec.families import FAMILIES
from predictor.spec.workload import ModelSpec

RIDGE = 1e-6  # keeps log det finite while the starting design is rank deficient


class DesignError(ValueError):
    """A design request that cannot be satisfied (e.g. more picks than candidates)."""


@dataclass(frozen=True)
class ProfileConfig:
    """One thing to measure: a small real model, a global batch and a plan that runs it."""

    model: ModelSpec
    batch: int
    plan: Plan

    @cached_property
    def spec_json(self) -> str:
        return json.dumps(self.model.model_dump(exclude_none=True, exclude_defaults=True), sort_keys=True)

    @cached_property
    def config_id(self) -> str:
        """Stable key: the same model, batch and plan always get the same id (dedupe, resume)."""
        text = f"{self.spec_json}|batch={self.batch}|{self.plan}"
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    @property
    def family(self) -> str:
        return str(self.model.family)

    @property
    def stratum(self) -> str:
        """Plan kind, used to split a budget between single-process and 2-process runs."""
        return self.plan.kind

    def design_vars(self) -> list[float]:
        m = self.model
        size = m.image_size if m.vision else m.seq_len
        return [float(v) for v in (m.layers, m.hidden, m.heads, size, self.batch, self.plan.mbs)]

    def estimated_flops(self) -> float:
        """Training FLOPs of one iteration (Megatron's 72·B·s·l·h²(1 + s/6h + V/12lh) form)."""
        m = self.model
        s, h, layers = m.tokens, m.hidden or 0, m.num_blocks
        ffn = m.ffn_hidden_size
        per_layer = 6 * s * (4 * h * h + 2 * h * ffn) + 12 * s * s * h
        logits = 6 * s * h * (m.vocab or 1000)
        return self.batch * (layers * per_layer + logits)


def quadratic_features(raw: np.ndarray) -> np.ndarray:
    """Intercept, standardised log2 main effects, their squares and pairwise products."""
    x = np.log2(np.asarray(raw, dtype=float))
    std = x.std(axis=0)
    keep = std > 0  # a constant variable carries no information and would make M singular
    z = (x[:, keep] - x[:, keep].mean(axis=0)) / std[keep]
    # Identical columns (e.g. micro-batch = batch when nothing is split) would too.
    _, first = np.unique(np.round(z, 9), axis=1, return_index=True)
    z = z[:, np.sort(first)]
    cols = [np.ones((len(z), 1)), z, z**2]
    cols += [(z[:, i] * z[:, j])[:, None] for i, j in itertools.combinations(range(z.shape[1]), 2)]
    return np.hstack(cols)


def log_det(features: np.ndarray, chosen: np.ndarray | list[int], ridge: float = RIDGE) -> float:
    """log det(sum over chosen of a_i a_i^T + ridge·I): the D-criterion of Eq. 5."""
    a = features[np.asarray(chosen)]
    sign, value = np.linalg.slogdet(a.T @ a + ridge * np.eye(features.shape[1]))
    return float(value) if sign > 0 else float("-inf")


def fedorov(features: np.ndarray, k: int, seed: int = 0, max_sweeps: int = 50, ridge: float = RIDGE) -> tuple[np.ndarray, list[float]]:
    """Pick k distinct rows of `features` maximising log det by Fedorov exchange.

    Starts from a random k-subset; each step swaps one chosen row i for the outside row j
    with the largest determinant gain Δ(i, j) = d_j − d_i − d_i·d_j + d_ij² (with
    d = aᵀ M⁻¹ a), so det only ever grows. Returns the sorted indices and the log-det
    after every accepted exchange (the first entry is the random start's).
    """
    m, p = features.shape
    if k > m:
        raise DesignError(f"cannot choose k={k} configurations out of only {m} candidates; lower the budget to at most {m}")
    if k < 1:
        raise DesignError(f"the budget k must be at least 1, got {k}")
    rng = np.random.default_rng(seed)
    chosen = rng.choice(m, size=k, replace=False)
    inside = np.zeros(m, dtype=bool)
    inside[chosen] = True
    history = [log_det(features, chosen, ridge)]
    for _ in range(max_sweeps):
        improved = False
        for slot in rng.permutation(k):
            i = chosen[slot]
            a = features[chosen]
            minv = np.linalg.inv(a.T @ a + ridge * np.eye(p))
            fa = features @ minv  # (m, p)
            d_all = np.einsum("ij,ij->i", fa, features)
            d_i = d_all[i]
            d_ij = fa[i] @ features.T
            gain = d_all - d_i - d_i * d_all + d_ij**2
            gain[inside] = -np.inf
            j = int(np.argmax(gain))
            if gain[j] <= 1e-9:
                continue
            candidate = chosen.copy()
            candidate[slot] = j
            new = log_det(features, candidate, ridge)
            if new <= history[-1]:  # guard against round-off: never accept a decrease
                continue
            inside[i], inside[j] = False, True
            chosen = candidate
            history.append(new)
            improved = True
        if not improved:
            break
    return np.sort(chosen), history


def random_design(m: int, k: int, seed: int = 0) -> np.ndarray:
    if k > m:
        raise DesignError(f"cannot choose k={k} configurations out of only {m} candidates; lower the budget to at most {m}")
    return np.sort(np.random.default_rng(seed).choice(m, size=k, replace=False))


# ----------------------------------------------------------------------------- candidates

PATCH = 16


@dataclass(frozen=True)
class Grid:
    """The candidate ranges for one class of device: what it measures in about a tenth of a second."""

    layers: tuple[int, ...]
    hidden: tuple[int, ...]
    heads: tuple[int, ...]
    text_seq: tuple[int, ...]
    image_sizes: tuple[int, ...]  # with PATCH 16: (size/16)^2 + 1 tokens
    batch: tuple[int, ...]
    vocab: int
    flop_cap: float  # largest iteration (training FLOPs) measured
    min_head_dim: int
    flop_floor: float = 0.0  # only iterations above this (a grid that extends another to larger sizes)


GRIDS = {
    # Small enough for one core of a 2-core CPU (≈ 135-180 GFLOP/s fp32 peak matmul); a fixed small
    # vocabulary so the logit layer does not dwarf the blocks.
    "cpu": Grid(layers=(2, 4, 6, 8), hidden=(64, 128, 192, 256, 384, 512), heads=(2, 4, 8),
                text_seq=(32, 64, 128, 256), image_sizes=(32, 64, 96, 128, 160), batch=(1, 2, 4, 8, 16, 32),
                vocab=4096, flop_cap=3e9, min_head_dim=16),
    # Realistic blocks for a data-centre GPU (bf16 at a few hundred TFLOP/s): BERT/GPT-2/ViT-base to
    # 1B-class widths, ImageNet-size images, a 32k vocabulary; iterations up to ≈ 50 ms.
    "gpu": Grid(layers=(2, 4, 8, 12), hidden=(512, 768, 1024, 1536, 2048), heads=(8, 16),
                text_seq=(128, 256, 512, 1024), image_sizes=(128, 224, 384), batch=(1, 2, 4, 8, 16, 32),
                vocab=32768, flop_cap=1e13, min_head_dim=64),
}
# The CPU grid's next decade of sizes (3e9-3e10 FLOPs, ≈ 0.1-1 s per iteration): the plans users
# validate on this machine are that large, and corrections learned below it do not extrapolate.
GRIDS["cpu-large"] = replace(GRIDS["cpu"], text_seq=(64, 128, 256, 512), image_sizes=(96, 128, 160, 224, 256),
                             flop_floor=3e9, flop_cap=3e10)
# Share of a family's budget per plan kind: most rows are single-process (what layer sums
# explain), the rest covers every 2-process mode once the CPU allows it.
STRATA_SHARE = {"single": 0.5, "dp": 0.1, "fsdp": 0.1, "tp": 0.1, "pp-gpipe": 0.1, "pp-1f1b": 0.1}


def _model(family: str, layers: int, hidden: int, heads: int, size: int, vocab: int = GRIDS["cpu"].vocab) -> ModelSpec:
    dims = {"family": family, "hidden": hidden, "heads": heads}
    kind = FAMILIES[family].kind
    if kind == "seq2seq":
        dims.update(layers=layers // 2, decoder_layers=layers // 2, seq_len=size, vocab=vocab)
    elif kind == "vision":
        dims.update(layers=layers, image_size=size, patch_size=PATCH)
    else:
        dims.update(layers=layers, seq_len=size, vocab=vocab)
    return ModelSpec(**dims)


def _plans(batch: int, model: ModelSpec, max_procs: int) -> list[Plan]:
    plans = [Plan(dp=1, mbs=batch)]
    if max_procs < 2:
        return plans
    if batch % 2 == 0:
        plans += [Plan(dp=2, mbs=batch // 2), Plan(dp=2, mbs=batch // 2, zero=3)]
    if model.heads % 2 == 0 and (model.hidden or 0) % 2 == 0:
        plans.append(Plan(tp=2, mbs=batch))
    if model.num_blocks % 2 == 0:
        for mbs in {batch // 2, batch // 4} - {0}:
            if batch % mbs == 0 and batch // mbs >= 2:
                plans += [Plan(pp=2, mbs=mbs, schedule="gpipe"), Plan(pp=2, mbs=mbs, schedule="1f1b")]
    return plans


def candidates(family: str, max_procs: int = 2, flop_cap: float | None = None, grid: str = "cpu") -> list[ProfileConfig]:
    """Every config of `family` in the named grid whose iteration costs at most `flop_cap` FLOPs (default: the grid's)."""
    if grid not in GRIDS:
        raise DesignError(f"unknown candidate grid {grid!r}; use {' or '.join(GRIDS)}")
    g = GRIDS[grid]
    cap = g.flop_cap if flop_cap is None else flop_cap
    sizes = g.image_sizes if FAMILIES[family].kind == "vision" else g.text_seq
    out = []
    for layers, hidden, heads, size, batch in itertools.product(g.layers, g.hidden, g.heads, sizes, g.batch):
        if hidden % heads or hidden // heads < g.min_head_dim:
            continue
        model = _model(family, layers, hidden, heads, size, g.vocab)
        for plan in _plans(batch, model, max_procs):
            cfg = ProfileConfig(model, batch, plan)
            if g.flop_floor < cfg.estimated_flops() <= cap:
                out.append(cfg)
    return out


def choose(configs: list[ProfileConfig], k: int, method: str = "doptimal", seed: int = 0,
           shares: dict[str, float] | None = None) -> list[ProfileConfig]:
    """Pick k configs per `method` (doptimal | random | full), splitting k over plan kinds.

    Each plan kind (stratum) gets its share of k (`shares`, by default STRATA_SHARE; what a
    stratum cannot fill goes to the others); inside a stratum the pick is D-optimal or uniform
    random. A benchmark that scores a design on a sample of the candidates themselves passes
    their own strata proportions (`strata_proportions`), so that training and test rows come
    from the same mix of plan kinds.
    """
    if method == "full":
        return list(configs)
    if method not in ("doptimal", "random"):
        raise DesignError(f"unknown design method {method!r}; use doptimal, random or full")
    if k > len(configs):
        raise DesignError(f"cannot choose k={k} configurations out of only {len(configs)} candidates; lower the budget to at most {len(configs)}")
    by_stratum: dict[str, list[ProfileConfig]] = {}
    for cfg in configs:
        by_stratum.setdefault(cfg.stratum, []).append(cfg)
    quota = _quotas(k, {s: len(c) for s, c in by_stratum.items()}, STRATA_SHARE if shares is None else shares)
    picked: list[ProfileConfig] = []
    for stratum, n in quota.items():
        pool = by_stratum[stratum]
        if n == 0:
            continue
        if method == "random" or n >= len(pool):
            idx = random_design(len(pool), n, seed)
        else:
            idx, _ = fedorov(quadratic_features(np.array([c.design_vars() for c in pool])), n, seed)
        picked += [pool[i] for i in idx]
    return picked


def strata_proportions(configs: list[ProfileConfig]) -> dict[str, float]:
    """Each plan kind's share of `configs`."""
    counts = Counter(cfg.stratum for cfg in configs)
    return {s: n / len(configs) for s, n in counts.items()}


def _quotas(k: int, sizes: dict[str, int], share_of: dict[str, float]) -> dict[str, int]:
    shares = {s: share_of.get(s, 0.0) for s in sizes}
    total = sum(shares.values()) or 1.0
    quota = {s: min(sizes[s], int(round(k * shares[s] / total))) for s in sizes}
    # Hand out (or take back) the rounding remainder and what small strata could not hold.
    order = sorted(sizes, key=lambda s: -shares[s])
    while sum(quota.values()) < k:
        s = next(s for s in order if quota[s] < sizes[s])
        quota[s] += 1
    while sum(quota.values()) > k:
        s = next(s for s in reversed(order) if quota[s] > 0)
        quota[s] -= 1
    return quota
