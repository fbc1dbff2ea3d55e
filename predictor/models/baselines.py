"""The ScaleDL paper's baselines, with the same fit/predict contract as ScaleDL.

- `RFHyperParams`: a random forest on the hyper-parameters only (model dims, batch, plan,
  device): no graph, no analytical structure.
- `MLPAcc`: one MLP per layer kind predicting each layer's time from its features (and the
  plan's settings), summed over the layers (× their counts); trained end to end on measured
  iteration times.
- `BiRNN`: a bidirectional GRU over the layer sequence (node features only, no edges), its
  pooled state with the global settings regressing the iteration time.

They predict time only; their memory fields are the analytical model's (the paper's baselines
do not predict memory), marked in `extra`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from sklearn.ensemble import RandomForestRegressor
from torch import nn

from predictor.costs.prediction import TIME_PARTS, Prediction
from predictor.graph.layer_graph import LAYER_KINDS, LayerGraph
from predictor.models.analytical import AnalyticalPredictor
from predictor.models.base import Predictor
from predictor.models.features import TERMS, TrainingData, by_workload, global_matrix, layer_matrix
from predictor.models.records import layer_key
from predictor.plan import RECOMPUTE_MODES, SCHEDULES, Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import WorkloadSpec


def hp_row(spec: WorkloadSpec, plan: Plan) -> list[float]:
    """Hyper-parameters only: model dims, batch, precision, plan, device peak."""
    m, t = spec.model, spec.training
    device = resolve(spec).device
    return [
        math.log(m.hidden or 1), math.log(max(m.num_blocks, 1)), math.log(m.heads or 1), math.log(m.ffn_hidden_size or 1),
        math.log(max(m.tokens, 1)), math.log(m.vocab or 1), math.log(t.global_batch), math.log(plan.mbs),
        math.log2(plan.dp), math.log2(plan.tp), math.log2(plan.pp), math.log(plan.v), float(plan.sp), float(plan.zero),
        *(float(plan.recompute == r) for r in RECOMPUTE_MODES), *(float(plan.schedule == s) for s in SCHEDULES),
        math.log(device.flops(t.precision)), math.log(device.mem_bandwidth),
    ]


def _time_only(seconds: float, ana: Prediction, name: str) -> Prediction:
    """A time-only prediction; memory is the analytical model's (these baselines have none of their own)."""
    return Prediction(iter_time_s=float(seconds), breakdown={k: float(seconds) if k == "compute" else 0.0 for k in TIME_PARTS},
                      peak_memory_gib=ana.peak_memory_gib, memory_per_stage_gib=ana.memory_per_stage_gib,
                      memory_breakdown=ana.memory_breakdown, tflops_per_gpu=ana.tflops_per_gpu * ana.iter_time_s / seconds,
                      mfu=ana.mfu * ana.iter_time_s / seconds, extra={"predictor": name, "memory_from": "analytical"})


class _Baseline(Predictor):
    def __init__(self) -> None:
        self.analytical = AnalyticalPredictor()

    def _seconds(self, spec: WorkloadSpec, graph: LayerGraph, plans: Sequence[Plan]) -> np.ndarray:
        raise NotImplementedError

    def predict(self, spec: WorkloadSpec, graph: LayerGraph, plans: Sequence[Plan]) -> list[Prediction]:
        seconds = self._seconds(spec, graph, plans)
        ana = self.analytical.predict(spec, graph, plans)
        return [_time_only(s, a, self.name) for s, a in zip(seconds, ana)]


class RFHyperParams(_Baseline):
    """Random forest on hyper-parameters (the paper's RF baseline)."""

    name = "rf"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.model = RandomForestRegressor(n_estimators=200, min_samples_leaf=1, random_state=seed, n_jobs=1)

    def fit(self, data: TrainingData) -> "RFHyperParams":
        x = np.asarray([hp_row(s.spec, s.plan) for s in data.samples])
        self.model.fit(x, np.log([s.iter_time_s for s in data.samples]))
        return self

    def _seconds(self, spec: WorkloadSpec, graph: LayerGraph, plans: Sequence[Plan]) -> np.ndarray:
        return np.exp(self.model.predict(np.asarray([hp_row(spec, p) for p in plans])))


# ------------------------------------------------------------------ sequence baselines (torch)


def _node_inputs(spec: WorkloadSpec, graph: LayerGraph, plan: Plan) -> np.ndarray:
    """Per node: kind one-hot, log count and the Eq. 7 layer features under the plan (no edges)."""
    key = layer_key(spec, plan)
    feats = layer_matrix(graph, key, resolve(spec).device, [], range(len(graph.nodes)))
    kinds = np.asarray([[float(n.kind == k) for k in LAYER_KINDS] + [math.log(n.count)] for n in graph.nodes])
    return np.concatenate([kinds, feats], axis=1).astype(np.float32)


def _global(spec: WorkloadSpec, plans: Sequence[Plan]) -> np.ndarray:
    """Z without the analytical terms (the baselines do not see the analytical model)."""
    device = resolve(spec).device
    return global_matrix(spec, plans, device, np.zeros((len(plans), len(TERMS)))).astype(np.float32)


class _SeqBaseline(_Baseline):
    """Shared plumbing: padded node sequences + global features, trained on log iteration time."""

    def __init__(self, hidden: int = 64, epochs: int = 200, lr: float = 5e-3, seed: int = 0) -> None:
        super().__init__()
        self.hidden, self.epochs, self.lr, self.seed = hidden, epochs, lr, seed
        self.net: nn.Module | None = None
        self.stats: tuple[np.ndarray, ...] | None = None

    def _inputs(self, spec: WorkloadSpec, graph: LayerGraph, plans: Sequence[Plan]):
        x = [_node_inputs(spec, graph, p) for p in plans]
        z = _global(spec, plans)
        counts = np.asarray([n.count for n in graph.nodes], dtype=np.float32)
        return x, z, [counts] * len(plans)

    def _tensors(self, xs: list[np.ndarray], zs: np.ndarray, counts: list[np.ndarray]):
        assert self.stats is not None
        xm, xsd, zm, zsd = self.stats
        n = max(len(x) for x in xs)
        pad = np.zeros((len(xs), n, xs[0].shape[1]), dtype=np.float32)
        mask = np.zeros((len(xs), n), dtype=np.float32)
        cnt = np.zeros((len(xs), n), dtype=np.float32)
        for i, (x, c) in enumerate(zip(xs, counts)):
            pad[i, : len(x)] = (x - xm) / xsd
            mask[i, : len(x)] = 1
            cnt[i, : len(x)] = c
        return (torch.from_numpy(pad), torch.from_numpy(mask), torch.from_numpy(cnt),
                torch.as_tensor((zs - zm) / zsd, dtype=torch.float32))

    def _build(self, node_dim: int, global_dim: int) -> nn.Module:
        raise NotImplementedError

    def fit(self, data: TrainingData) -> "_SeqBaseline":
        torch.manual_seed(self.seed)
        xs, zs, cs, ys = [], [], [], []
        for spec, graph, idx in by_workload(data.samples):
            x, z, c = self._inputs(spec, graph, [data.samples[i].plan for i in idx])
            xs += x
            zs.append(z)
            cs += c
            ys += [data.samples[i].iter_time_s for i in idx]
        z = np.concatenate(zs)
        flat = np.concatenate(xs)
        self.stats = (flat.mean(0), np.where(flat.std(0) > 1e-6, flat.std(0), 1.0),
                      z.mean(0), np.where(z.std(0) > 1e-6, z.std(0), 1.0))
        tensors = self._tensors(xs, z, cs)
        y = torch.log(torch.as_tensor(ys, dtype=torch.float32))
        self.net = self._build(flat.shape[1], z.shape[1])
        opt = torch.optim.AdamW(self.net.parameters(), lr=self.lr, weight_decay=1e-4)
        self.net.train()
        for _ in range(self.epochs):
            opt.zero_grad()
            loss = torch.mean((self.net(*tensors) - y) ** 2)
            loss.backward()
            opt.step()
        self.net.eval()
        return self

    def _seconds(self, spec: WorkloadSpec, graph: LayerGraph, plans: Sequence[Plan]) -> np.ndarray:
        if self.net is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted")
        with torch.no_grad():
            return np.exp(self.net(*self._tensors(*self._inputs(spec, graph, plans))).numpy().astype(float))


class _MLPAccNet(nn.Module):
    def __init__(self, node_dim: int, global_dim: int, hidden: int) -> None:
        super().__init__()
        self.kinds = len(LAYER_KINDS)
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(node_dim + global_dim, hidden), nn.ReLU(),
                                                nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
                                  for _ in LAYER_KINDS)

    def forward(self, x, mask, counts, z):
        inp = torch.cat([x, z[:, None, :].expand(-1, x.shape[1], -1)], dim=2)
        kind = x[:, :, : self.kinds].argmax(2)  # standardised one-hot: argmax still picks the kind
        out = torch.zeros(x.shape[:2])
        for k, mlp in enumerate(self.mlps):
            sel = kind == k
            if sel.any():
                out[sel] = mlp(inp[sel]).squeeze(-1)
        layer_s = torch.exp(out.clamp(-30, 10)) * counts * mask
        return torch.log(layer_s.sum(1).clamp_min(1e-12))


class MLPAcc(_SeqBaseline):
    """MLP-ACC: per-layer-kind MLPs, predictions summed over the layers."""

    name = "mlp-acc"

    def _build(self, node_dim: int, global_dim: int) -> nn.Module:
        return _MLPAccNet(node_dim, global_dim, self.hidden)


class _BiRNNNet(nn.Module):
    def __init__(self, node_dim: int, global_dim: int, hidden: int) -> None:
        super().__init__()
        self.rnn = nn.GRU(node_dim, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Sequential(nn.Linear(2 * hidden + global_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x, mask, counts, z):
        lengths = mask.sum(1).long()
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        h, _ = nn.utils.rnn.pad_packed_sequence(self.rnn(packed)[0], batch_first=True, total_length=x.shape[1])
        pooled = (h * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True)
        return self.head(torch.cat([pooled, z], dim=1)).squeeze(-1)


class BiRNN(_SeqBaseline):
    """BiRNN over the layer sequence, without edge features."""

    name = "birnn"

    def _build(self, node_dim: int, global_dim: int) -> nn.Module:
        return _BiRNNNet(node_dim, global_dim, self.hidden)
