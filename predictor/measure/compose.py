"""The composed runner: one rank of any plan, built the way torchtitan composes parallelisms.

An n-D `DeviceMesh` over the plan's axes (outermost first, from `Plan.rank_order`), then in order:
tensor and sequence parallelism, activation recomputation, the cut into pipeline chunks (this rank's
pp·v chunks, looped as torchtitan assigns interleaved stages), data parallelism per ZeRO stage (0: DDP, or
FSDP2's `replicate` with tp, v > 1 or GPipe; 1: the same + `ZeroRedundancyOptimizer`; 2: FSDP2 without resharding after
forward; 3: with), the sum of tied embedding/head gradients across pipeline stages, and the pipeline
schedule (`ScheduleGPipe`, `Schedule1F1B`, `ScheduleInterleaved1F1B`). The same code runs on gloo (CPU)
and NCCL (GPU). `unsupported` names what it cannot run, and the validation refuses those plans.

Every rank builds the model from the same seed and reads the same global batch (its dp slice of it), so a
plan's losses equal the single-process run's up to float reduction order: the proof that the plan that
runs is the one predicted (tests/test_compose.py). Each answer carries the per-step times, the loss of
each step, the peak memory and the shards this rank holds.
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from predictor.frameworks.pytorch import runner_ep_error
from predictor.plan import Plan
from predictor.spec.families import names as family_names
from predictor.spec.workload import ModelSpec

_MESHES: dict[tuple, Any] = {}
# Why context parallelism is refused: torch 2.13's `context_parallel` swaps in ring attention only for the
# CUDA SDPA kernels (aten._scaled_dot_product_{flash,efficient,cudnn}_attention, see
# torch/distributed/tensor/experimental/_context_parallel/_attention.py); on CPU, SDPA on its sharded
# q/k/v buffers (2 gloo ranks, causal) raises "NotImplementedError: Operator
# aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy registered".
CP_REFUSAL = ("cp>1: torch 2.13's context_parallel has ring attention only for the CUDA SDPA kernels (flash, "
              "efficient, cudnn); on CPU it raises 'aten._scaled_dot_product_flash_attention_for_cpu.default does "
              "not have a sharding strategy registered', and this runner does not run it on GPUs yet")


def unsupported(plan: Plan, spec: ModelSpec) -> str:
    """What of `plan` on `spec` this runner cannot run ('' when it runs all of it)."""
    reasons = []
    if plan.cp > 1:
        reasons.append(CP_REFUSAL)
    if plan.overlap != "auto":
        reasons.append(f"overlap={plan.overlap} (DDP and FSDP2 overlap as they do by default: overlap=auto)")
    if runner_ep_error(plan, spec):
        reasons.append(runner_ep_error(plan, spec))
    fam = spec.family_entry if spec.module is None and spec.hf_config is None else None
    if fam is None or fam.layout is None:
        laid_out = family_names(lambda f: f.layout is not None)
        reasons.append(f"{'family ' + fam.name if fam else 'a module: or hf_config: model'} has no layout in the "
                       f"runner (embeddings, blocks, head: {', '.join(laid_out)})")
    elif fam.layout == "seq2seq":
        if plan.pp * plan.v > 2:
            reasons.append(f"pp*v = {plan.pp * plan.v} for {fam.name} (cut between encoder and decoder only: at most "
                           f"2 chunks)")
        if plan.sp:
            reasons.append(f"sp for {fam.name} (the decoder's cross-attention reads the whole encoder sequence)")
    if plan.sp and spec.tokens % plan.tp:
        reasons.append(f"sp with tp={plan.tp} not dividing the {spec.tokens} tokens of a sequence")
    return "; ".join(reasons)


def plan_mesh(plan: Plan, device_type: str) -> Any:
    """The plan's n-D device mesh, axes outermost first (a mesh's last dimension is adjacent ranks)."""
    from torch.distributed.device_mesh import init_device_mesh

    names = tuple(reversed(plan.rank_order))
    shape = tuple(getattr(plan, a) for a in names)
    key = (device_type, shape, names)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return _MESHES[key]


def _local_numel(p: torch.Tensor) -> int:
    return _local(p).numel()


def _chunk_names(chunk: nn.Module, paths: dict[int, str]) -> dict[str, str]:
    """Each parameter's name in `chunk` -> its name in the whole model (by identity, before any wrapping)."""
    return {n: paths[id(p)] for n, p in chunk.named_parameters()}


def _tp_dim(p: torch.Tensor) -> int:
    """The dimension a parameter is split along over the tp ranks, -1 when they all hold it whole."""
    from torch.distributed.tensor import DTensor

    names = p.device_mesh.mesh_dim_names or () if isinstance(p, DTensor) else ()
    if "tp" not in names:
        return -1
    placement = p.placements[names.index("tp")]
    return placement.dim if placement.is_shard() else -1


def _held(chunks: list[nn.Module], names: list[dict[str, str]], whole: dict[str, int], tp_dims: dict[str, int]
          ) -> dict[str, list[int]]:
    """[local elements, whole-model elements, tp split dimension or -1] of each parameter this rank holds, by
    its name in the whole model (DDP's wrapper adds `module.` to the names it wraps; the tp dimensions are
    read before data parallelism, which makes DDP's parameters local tensors)."""
    out = {}
    for chunk, table in zip(chunks, names):
        for n, p in chunk.named_parameters():
            path = table[n.removeprefix("module.")]
            out[path] = [_local_numel(p), whole[path], tp_dims[path]]
    return out


def _embedding_group(plan: Plan, mesh: Any) -> Any:
    """This rank's group of the first and the last pipeline rank with its other coordinates (Megatron's
    embedding group: where a tied embedding and LM head live on different stages); every rank creates all."""
    key = ("embedding", id(mesh))
    if key not in _MESHES:
        ranks = mesh.mesh.movedim(mesh.mesh_dim_names.index("pp"), 0).reshape(plan.pp, -1)
        mine = None
        for a, b in zip(ranks[0].tolist(), ranks[-1].tolist()):
            group = dist.new_group([a, b])
            mine = group if dist.get_rank() in (a, b) else mine
        _MESHES[key] = mine
    return _MESHES[key]


def _tied_sync(plan: Plan, mesh: Any, chunks: list[nn.Module], names: list[dict[str, str]], tied: set[str]
               ) -> Callable[[], None]:
    """Sum the gradients of weights tied across the first and the last pipeline chunk (the word embedding and
    the LM head), as Megatron does after the backward pass: both copies then take the single model's step."""
    if plan.pp == 1 or not tied:
        return lambda: None
    group = _embedding_group(plan, mesh)
    mine = [p for c, table in zip(chunks, names) for n, p in c.named_parameters()
            if table[n.removeprefix("module.")] in tied]

    def sync() -> None:
        for p in mine:  # a copy the stage does not use (GPT's position embeddings on the last) adds zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(_local(p.grad), group=group)
    return sync


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _optimizer(params: list[torch.Tensor], plan: Plan, mesh: Any, name: str, lr: float
               ) -> tuple[torch.optim.Optimizer, Callable[[], None]]:
    """The optimizer, and what must run before its step. ZeRO-1: each dp rank keeps and updates the optimizer
    states of its shard (`ZeroRedundancyOptimizer`). It broadcasts plain tensors only, so with tp it updates
    each DTensor parameter's local shard in place, and the shards' gradients are handed to it before the step."""
    from torch.distributed.tensor import DTensor

    cls = torch.optim.SGD if name == "sgd" else torch.optim.Adam
    if not (plan.dp > 1 and plan.zero == 1):
        return cls(params, lr=lr, foreach=False), lambda: None
    from torch.distributed.optim import ZeroRedundancyOptimizer

    pairs = [(p, p._local_tensor if isinstance(p, DTensor) else p) for p in params]

    def hand_over() -> None:
        for p, local in pairs:
            if local is not p:
                local.grad, p.grad = (None if p.grad is None else _local(p.grad)), None
    optimizer = ZeroRedundancyOptimizer([local for _, local in pairs], optimizer_class=cls,
                                        process_group=mesh["dp"].get_group(), lr=lr, foreach=False)
    return optimizer, hand_over


def _state_numel(optimizer: torch.optim.Optimizer) -> int:
    """Optimizer-state elements this rank holds (ZeRO-1 and FSDP shard them)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    opt = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    return sum(_local_numel(v) for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0)


def _wrap_dp(chunk: nn.Module, plan: Plan, mesh: Any) -> nn.Module:
    from predictor.measure.parallelize import apply_ddp, apply_fsdp

    if plan.zero >= 2:
        return apply_fsdp(chunk, mesh["dp"], reshard_after_forward=plan.zero == 3)
    # GPipe runs every micro-batch's forward before any backward: DDP's first bucket rebuild then counts each
    # parameter once per forward and fails (reducer.cpp "rebuilt parameter indices size is not same as original
    # model parameters size"); 1F1B's one forward before the first backward does not.
    gpipe = plan.pp > 1 and plan.schedule == "gpipe"
    return apply_ddp(chunk, mesh["dp"], composable=plan.tp > 1 or plan.v > 1 or gpipe)


def _step_fn(plan: Plan, chunks: list[nn.Module], loss_fn: Callable, first: torch.Tensor, labels: torch.Tensor,
             indices: list[int], mesh: Any, device: torch.device, losses: list[float]) -> Callable[[], None]:
    """Forward and backward of this rank's dp slice of the batch: the pipeline schedule, or the micro-batches
    one after another with the gradient averaged over them (DDP syncing only on the last)."""
    from torch.distributed.fsdp import FSDPModule

    m = first.shape[0] // plan.mbs
    if plan.pp == 1:
        model = chunks[0]
        micro = list(zip(first.split(plan.mbs), labels.split(plan.mbs)))

        def accumulate() -> None:
            total = 0.0
            for i, (x, y) in enumerate(micro):
                last = i == m - 1
                if isinstance(model, FSDPModule) and plan.zero < 2:  # replicate: sync once, like DDP
                    model.set_requires_gradient_sync(last)
                with model.no_sync() if not last and hasattr(model, "no_sync") else nullcontext():
                    loss = loss_fn(model(x), y)
                    (loss / m).backward()
                total += loss.item()
            losses.append(total / m)
        return accumulate

    from torch.distributed.pipelining import (
        PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
    )

    group = mesh["pp"].get_group()
    stages = [PipelineStage(c, i, plan.pp * plan.v, device, group=group) for c, i in zip(chunks, indices)]
    if plan.schedule == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
    else:
        cls = ScheduleGPipe if plan.schedule == "gpipe" else Schedule1F1B
        schedule = cls(stages[0], n_microbatches=m, loss_fn=loss_fn)
    is_first, is_last = 0 in indices, plan.pp * plan.v - 1 in indices

    def pipeline() -> None:
        out: list[torch.Tensor] = []
        args = (first,) if is_first else ()
        if is_last:
            schedule.step(*args, target=labels, losses=out)
            losses.append(sum(float(x.detach()) for x in out) / len(out))
        else:
            schedule.step(*args)
    return pipeline


def run_plan(job: dict, rank: int, world: int, device: torch.device,
             reset_peak: Callable[[torch.device], int], peak: Callable[[torch.device], int]) -> dict:
    """Real training steps of `job`'s plan on this rank: per-step seconds and losses, peak memory, shards held."""
    from torch.nn.parallel import DistributedDataParallel

    from predictor.graph.modelzoo import build_model, example_inputs, primary_input
    from predictor.measure.experts import scale_expert_grads, shard_experts
    from predictor.measure.parallelize import apply_recompute, apply_tp, model_chunks

    spec = ModelSpec.model_validate_json(job["spec_json"])
    plan = Plan.parse(job["plan"])
    batch, dtype = int(job["batch"]), getattr(torch, job.get("dtype", "float32"))
    if plan.gpus not in (1, world):
        raise ValueError(f"plan {plan} needs {plan.gpus} processes, the group has {world}")
    why = unsupported(plan, spec)
    if why:
        raise ValueError(f"not measurable: {why}")
    base = reset_peak(device)
    mesh = plan_mesh(plan, device.type) if plan.gpus > 1 else None
    coord = {a: (mesh[a].get_local_rank() if mesh is not None else 0) for a in plan.rank_order}
    torch.manual_seed(0)  # the same weights on every rank: shards of the single-process model
    model = build_model(spec, device, dtype)
    model.train()
    whole = {n: p.numel() for n, p in model.named_parameters()}
    if plan.tp > 1:
        apply_tp(model, spec, mesh["tp"], plan.sp)
    expert_paths: set[str] = set()
    if plan.ep > 1:  # ep = dp (unsupported): the ep group is the dp group
        expert_paths = shard_experts(model, mesh["dp"].get_group(), coord["dp"], plan.ep)
    apply_recompute(model, plan.recompute)
    paths = {id(p): n for n, p in model.named_parameters()}
    all_chunks, loss_fn = model_chunks(model, spec, plan.pp * plan.v, mesh["tp"] if plan.sp else None)
    indices = [coord["pp"] + i * plan.pp for i in range(plan.v)]  # torchtitan's loop order of interleaved stages
    chunks = [all_chunks[i] for i in indices]
    names = [_chunk_names(c, paths) for c in chunks]
    tied = set(_chunk_names(all_chunks[0], paths).values()) & set(_chunk_names(all_chunks[-1], paths).values())
    del model, all_chunks
    torch.manual_seed(1)  # the same global batch on every rank; each dp rank trains on its slice
    inputs = example_inputs(spec, batch, device, dtype)
    per_dp = batch // plan.dp
    rows = slice(coord["dp"] * per_dp, (coord["dp"] + 1) * per_dp)
    first, labels = primary_input(inputs)[rows], inputs["labels"][rows]
    tp_dims = {table[n]: _tp_dim(p) for c, table in zip(chunks, names) for n, p in c.named_parameters()}
    for c, table in zip(chunks, names):  # each rank's own experts: not averaged over dp
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            c, [n for n, path in table.items() if path in expert_paths])
    if plan.dp > 1:
        chunks = [_wrap_dp(c, plan, mesh) for c in chunks]
    params = list({id(p): p for c in chunks for p in c.parameters()}.values())
    shards = _held(chunks, names, whole, tp_dims)
    optimizer, hand_over = _optimizer(params, plan, mesh, job.get("optimizer", "adam"), float(job.get("lr", 1e-4)))
    losses: list[float] = []
    step = _step_fn(plan, chunks, loss_fn, first, labels, indices, mesh, device, losses)
    sync_tied = _tied_sync(plan, mesh, chunks, names, tied)
    experts = [p for c, table in zip(chunks, names) for n, p in c.named_parameters()
               if table[n.removeprefix("module.")] in expert_paths]
    reset_peak(device)  # the whole model built above is freed: the peak is this rank's training
    times, reported = [], []
    for i in range(int(job["warmup"]) + int(job["steps"])):
        if plan.gpus > 1:
            dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        step()
        sync_tied()
        scale_expert_grads(experts, plan.ep)
        hand_over()
        optimizer.step()
        _sync(device)
        if i >= int(job["warmup"]):
            times.append(time.perf_counter() - t0)
        reported.append(_global_loss(losses[-1] if losses else 0.0, plan, device))
    high = peak(device)
    if plan.gpus > 1:
        dist.barrier()
    return {"status": "ok", "times": times, "peak_mem_bytes": high, "base_mem_bytes": base,
            "mem_kind": "cuda" if device.type == "cuda" else "rss", "median": statistics.median(times),
            "losses": reported, "coords": coord, "chunks": indices, "shards": shards,
            "optimizer_state_numel": _state_numel(optimizer)}


def _global_loss(local: float, plan: Plan, device: torch.device) -> float:
    """The iteration's loss over the global batch: the mean of what the ranks holding the last chunk saw."""
    if plan.gpus == 1:
        return local
    t = torch.tensor([local], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / (plan.gpus // plan.pp)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
