"""FSDP2 as torchtitan runs it: the units it wraps, the bytes each unit's collectives move, what nothing hides, and
the copies between FSDP2's flat buffers and the parameters.

- Units (pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py, `apply_fsdp`): `tok_embeddings`, each
  transformer block, `[norm, output]`, then the root, which holds nothing left. `fsdp_reshard_after_forward`
  "default" reshards every unit after forward but `[norm, output]` ("do not reshard_after_forward the last layers by
  default since FSDP would prefetch them immediately after the forward pass") and, under a pipeline, none; "always"
  reshards all of them, "never" none. ScaleDL's zero=3 is "default" without a pipeline and "always" with one
  (`reshards_output`), zero=2 "never" (`predictor.frameworks.torchtitan`).
- Bytes: torchtitan's `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)` (`training.
  mixed_precision_reduce` defaults to float32, torchtitan/config/job_config.py) all-gathers BF16 weights and
  reduce-scatters FP32 gradients. Under float8 tensorwise with `enable_fsdp_float8_all_gather` the float8 linears'
  weights are cast before the all-gather and travel in 1 byte (pytorch/ao torchao/float8/fsdp_utils.py,
  `WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`).
- Exposed: a forward's first all-gather (tok_embeddings', on the stage that holds them) has nothing before it to
  hide behind, and a backward's last reduce-scatter (tok_embeddings' gradients) nothing after it; the backward's
  first unit, `[norm, output]`, is still gathered under the default, so its backward starts with nothing exposed.
- Copies, memory-bound kernels on the compute stream (pytorch/pytorch
  torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): `foreach_all_gather_copy_out` splits the flat
  all-gather output into each parameter (`split_with_sizes_copy`: the gathered bytes read and written, each gather);
  `foreach_reduce` concatenates the BF16 gradients into the FP32 reduce-scatter input (`foreach_reduce_scatter_copy_in`
  with its widening cast, 2 + 4 bytes per parameter) before the reduce-scatter stream waits for it. The all-gather's
  copy-in of the local shard (1/dp of the bytes) runs on its own stream and is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.costs import comm
from predictor.costs.parallel import Layout
from predictor.models.lowprec import low_precision_gemms
from predictor.plan import Plan
from predictor.plan.axes import PIPELINE_AXIS
from predictor.spec.hardware import RECIPES

# Bytes per parameter: the all-gathered BF16 weight, a float8-all-gathered one, the FP32 reduce-scatter of
# mixed_precision_reduce, and the reduce-scatter copy-in (a BF16 gradient read, its FP32 copy written).
GATHER_BYTES = 2.0
FLOAT8_GATHER_BYTES = RECIPES["current"].data_bytes  # tensorwise: one scale per tensor, no per-element scale
REDUCE_BYTES = 4.0
COPY_IN_BYTES = 2.0 + 4.0


def reshards_output(plan: Plan) -> bool:
    """Whether `[norm, output]` is resharded after forward: a zero=3 plan is written as torchtitan's "default" without
    a pipeline, which keeps it gathered, and as "always" with one (where "default" would reshard nothing)."""
    return getattr(plan, PIPELINE_AXIS) > 1


def float8_gathers(recipe_name: str | None, plan: Plan) -> bool:
    """Whether the run all-gathers its float8 linears' weights in float8: tensorwise float8 (training.recipe
    current) under FSDP2, as torchtitan.toml writes `enable_fsdp_float8_all_gather` (rowwise and MXFP8 gather BF16)."""
    return recipe_name == "current" and plan.zero >= 2


@dataclass(frozen=True)
class Units:
    """Parameters one rank of each pipeline stage all-gathers per FSDP2 unit: the embedding unit, one block, the
    `[norm, output]` unit, and the blocks' count; and the share of a block's parameters gathered in float8."""

    embedding: np.ndarray
    block: np.ndarray
    output: np.ndarray
    blocks: np.ndarray
    float8_share: np.ndarray


def units(lay: Layout, psi: np.ndarray, float8_gather: bool) -> Units:
    """The units of each pipeline stage holding `psi` parameters (its dense ones: routed experts sync apart)."""
    nodes, counts = lay.nodes, lay.stage_counts
    outside = ~nodes.repeated
    embedding = counts @ (nodes.params * (outside & (nodes.kind == "embedding")))
    output = counts @ (nodes.params * (outside & (nodes.kind != "embedding")))
    blocks = np.asarray(lay.blocks_per_stage, dtype=float)
    in_blocks = np.maximum(psi - embedding - output, 0.0)
    block = np.where(blocks > 0, in_blocks / np.maximum(blocks, 1.0), 0.0)
    low = counts @ (nodes.params * (low_precision_gemms(nodes) & ~nodes.experts)) if float8_gather else 0.0
    share = np.where(in_blocks > 0, np.minimum(low / np.maximum(in_blocks, 1.0), 1.0), 0.0)
    return Units(embedding, block, output, blocks, share)


def grad_sync_time(lay: Layout, psi: np.ndarray, microbatches: int, call_s: float, g: comm.Group, float8_gather: bool,
                   bandwidth: float) -> tuple[float, ...]:
    """`stage_costs.grad_sync_time`'s figures for FSDP2 units as torchtitan wraps them, with the exposed edges and the
    copies: (gradient reduce-scatters, all-gathers, per-call seconds among them, reduce-scatter calls, all-gather
    calls, the last reduce-scatter's seconds, one pass's first all-gather's seconds (a mean over forward and
    backward under ZeRO-3), the copies' seconds per step) of the stage whose sync is slowest."""
    plan = lay.plan
    u = units(lay, psi, float8_gather)
    present = [(u.embedding, 1.0), (u.block, u.blocks), (u.output, 1.0)]
    block_bytes = u.block * (GATHER_BYTES * (1 - u.float8_share) + FLOAT8_GATHER_BYTES * u.float8_share)
    gather_bytes = [u.embedding * GATHER_BYTES, block_bytes, u.output * GATHER_BYTES]
    held = [np.where(p > 0, n, 0.0) for p, n in present]
    rs = [comm.reduce_scatter(p * REDUCE_BYTES, g) + call_s for p, _ in present]
    ag = [comm.allgather(b, g) + call_s for b in gather_bytes]
    grad_calls = sum(held)
    grad = sum(n * t for n, t in zip(held, rs))
    forward = sum(n * t for n, t in zip(held, ag))
    zero3, kept = plan.zero >= 3, 0.0 if reshards_output(plan) else held[2]
    # a ZeRO-3 backward gathers every unit again but `[norm, output]` where the default keeps it from forward
    backward = forward - kept * ag[2]
    passes_calls = 2 * grad_calls - kept if zero3 else grad_calls
    param = microbatches * (forward + backward) if zero3 else forward
    gather_calls = microbatches * passes_calls if zero3 else grad_calls
    first_f = np.where(u.embedding > 0, ag[0], ag[1])  # the stage's first unit: the embeddings, else a block
    first_b = np.where(u.output > 0, np.where(kept > 0, 0.0, ag[2]), ag[1])
    gather_edge = (first_f + first_b) / 2 if zero3 else first_f
    grad_edge = np.where(u.embedding > 0, rs[0], rs[1])  # the last unit's reduce-scatter
    gathered = sum(n * b for n, b in zip(held, gather_bytes))
    gathers = microbatches * (2 * gathered - kept * gather_bytes[2]) if zero3 else gathered
    copies = (2 * gathers + psi * COPY_IN_BYTES) / bandwidth
    worst = int(np.argmax(grad + param))
    return (float(grad[worst]), float(param[worst]), float((grad_calls + gather_calls)[worst] * call_s),
            float(grad_calls[worst]), float(gather_calls[worst]), float(grad_edge[worst]), float(gather_edge[worst]),
            float(copies[worst]))
