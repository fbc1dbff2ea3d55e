"""Training ScaleDL's correction networks end to end on measured iteration times (squared log error).

Each member of the ensemble is trained apart, from its own seed and on its own validation split, and
stops where held-out samples say: measured iteration times are noisy, and the last epoch tends to fit
the noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch_geometric.data import Batch, Data

from predictor.graph.layer_graph import LayerGraph
from predictor.models.composition import Composed
from predictor.models.features import Sample, by_workload
from predictor.models.gnn import CorrectionEnsemble, CorrectionGNN, graph_data
from predictor.models.memory_residual import memory_features
from predictor.plan import Plan
from predictor.spec.workload import WorkloadSpec

# Samples needed before a 15 % validation split picks the epoch: below, it is a handful of points
# (H200's 24-33 per model), so the epoch count is chosen by cross-validation (CV_FOLDS folds).
MIN_VALIDATION = 100
CV_FOLDS = 3
SCORE_EVERY = 5  # epochs between validation scores

# The composition of one workload's plans (`ScaleDLPredictor._compose`).
Compose = Callable[[WorkloadSpec, LayerGraph, Sequence[Plan]], Composed]
# What a descent calls after each step: (epoch, per-sample errors computed before that step).
AfterStep = Callable[[int, torch.Tensor], None]


@dataclass
class Rows:
    """Training tensors of a dataset: unique (graph, layer key) graphs, per-sample index into them,
    raw Z, composed terms, log measured times, and (features, measured GiB, analytical GiB) rows of the
    memory residual (from the same composition, which is what costs)."""

    graphs: list[Data]
    gidx: torch.Tensor
    z: np.ndarray
    terms: torch.Tensor
    log_y: torch.Tensor
    memory: list[tuple[np.ndarray, float, float]]


def training_rows(samples: Sequence[Sample], compose: Compose) -> Rows:
    """The training tensors of `samples`: per-key graphs, the composed terms, Z and the measured times."""
    graphs, key_graph, terms, zs, ys, gidx, mem_rows = [], {}, [], [], [], [], []
    for spec, graph, idx in by_workload(samples):
        group = [samples[i] for i in idx]
        comp = compose(spec, graph, [s.plan for s in group])
        memory_x = memory_features(comp.z, comp.table.peak_memory_gib)
        for j, s in enumerate(group):
            k = comp.key_of[j]
            gk = (id(graph), comp.keys[k])
            if gk not in key_graph:
                key_graph[gk] = len(graphs)
                graphs.append(graph_data(graph, comp.layer_s[k]))
            gidx.append(key_graph[gk])
            if s.peak_memory_gib:
                mem_rows.append((memory_x[j], s.peak_memory_gib, float(comp.table.peak_memory_gib[j])))
        terms.append(comp.terms)
        zs.append(comp.z)
        ys += [s.iter_time_s for s in group]
    return Rows(graphs, torch.as_tensor(np.asarray(gidx)), np.concatenate(zs),
                torch.as_tensor(np.concatenate(terms), dtype=torch.float32),
                torch.log(torch.as_tensor(ys, dtype=torch.float32)), mem_rows)


@dataclass
class Problem:
    """What the networks are fitted to: the graphs batched (None without the graph branch), each sample's
    graph, its standardised Z and composed terms, the log measured times, and AdamW's weight decay."""

    batch: Batch | None
    gidx: torch.Tensor
    z: torch.Tensor
    terms: torch.Tensor
    log_y: torch.Tensor
    weight_decay: float


def train(net: CorrectionEnsemble, problem: Problem, epochs: int, lr: float, seed: int) -> None:
    """Each member apart: members start from successive draws of the seeded generator, and member i holds
    out the validation split of `seed + i`."""
    for i, member in enumerate(net.members):
        train_member(member, problem, epochs, lr, seed + i)
    net.eval()


def train_member(net: CorrectionGNN, problem: Problem, epochs: int, lr: float, seed: int) -> None:
    """Train one network, stopping where held-out samples say. With MIN_VALIDATION samples or more, a
    seeded 15 % validation split is scored every SCORE_EVERY epochs and the state after the best-scored
    epoch's step is kept. With fewer, CV_FOLDS-fold cross-validation picks the number of epochs, none (no
    correction beyond where the network starts) included, and the network is trained on every sample for
    that many."""
    n = len(problem.log_y)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    if n >= MIN_VALIDATION:
        n_val = n * 15 // 100
        val = order[:n_val]
        best, best_state = float("inf"), None

        def keep_best(epoch: int, err: torch.Tensor) -> None:
            nonlocal best, best_state
            if epoch % SCORE_EVERY == SCORE_EVERY - 1 or epoch == epochs - 1:
                score = float(err[val].mean().detach())
                if score < best:
                    best, best_state = score, _state_copy(net)

        descend(net, problem, epochs, lr, order[n_val:], keep_best)
        if best_state is not None:
            net.load_state_dict(best_state)
    else:
        descend(net, problem, cv_epochs(net, problem, epochs, lr, order), lr, order)
    net.eval()


def cv_epochs(net: CorrectionGNN, problem: Problem, epochs: int, lr: float, order: torch.Tensor) -> int:
    """The epoch count (a multiple of SCORE_EVERY below `epochs`, 0 included) with the lowest mean
    held-out error over CV_FOLDS folds of `order`, each trained from `net`'s current state, which it
    leaves as it found it; 0 when there are too few samples to hold any out."""
    folds = [f for f in order.chunk(CV_FOLDS) if len(f)]
    if len(folds) < 2 or epochs <= 0:
        return 0
    start = _state_copy(net)
    curve = np.zeros(-(-epochs // SCORE_EVERY))
    for i, held in enumerate(folds):
        net.load_state_dict(start)
        fit = torch.cat([f for j, f in enumerate(folds) if j != i])

        def score(epoch: int, err: torch.Tensor, held: torch.Tensor = held) -> None:
            if epoch % SCORE_EVERY == 0:  # err is the state's after `epoch` steps
                curve[epoch // SCORE_EVERY] += float(err[held].mean().detach())

        descend(net, problem, epochs, lr, fit, score)
    net.load_state_dict(start)
    return int(np.argmin(curve)) * SCORE_EVERY


def descend(net: CorrectionGNN, problem: Problem, epochs: int, lr: float, fit: torch.Tensor,
            after_step: AfterStep | None = None) -> None:
    """`epochs` full-batch AdamW steps on the mean squared log error of samples `fit`; `after_step(epoch,
    err)` sees each step's per-sample errors, computed before that step."""
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=problem.weight_decay)
    batch, gidx, z, terms, log_y = problem.batch, problem.gidx, problem.z, problem.terms, problem.log_y

    def losses() -> torch.Tensor:
        emb = None
        if batch is not None:
            emb = net.graph_embedding(batch.x, batch.edge_index, batch.edge_attr, batch.batch)[gidx]
        pred = (net.factors(emb, z) * terms).sum(1)
        return (torch.log(pred.clamp_min(1e-9)) - log_y) ** 2

    net.train()
    for epoch in range(epochs):
        opt.zero_grad()
        err = losses()
        err[fit].mean().backward()
        opt.step()
        if after_step is not None:
            after_step(epoch, err)


def _state_copy(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the network's weights that later steps do not change."""
    return {k: v.detach().clone() for k, v in net.state_dict().items()}
