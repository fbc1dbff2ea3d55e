"""Low-precision training as Transformer Engine runs it: which GEMMs run in FP8 or FP4, and what the quantisation
before them costs.

Why a mechanism and not a peak times an efficiency: a recipe's speed-up is the faster GEMM minus memory-bound work
that BF16 does not do, and that work grows with the tensors' bytes, not with the GEMM's FLOPs. On B300 TE's own
benchmark of one layer's twelve GEMMs gains 3.4x with NVFP4 operands already quantised but 1.9x once every call
quantises them (docs/device-facts.md): an efficiency fitted on one shape cannot carry that to another.

What TE does (transformer_engine/common/recipe/__init__.py, transformer_engine/pytorch/module/linear.py,
transformer_engine/pytorch/csrc/quantizer.cpp, docs/features/low_precision_training/*):

- The GEMMs: the linear layers TE modules run: a block's QKV, attention output, FC1 and FC2 (Megatron-Core's
  TELayerNormColumnParallelLinear, TERowParallelLinear, and the routed experts' TEGroupedLinear). Each has three GEMMs,
  fprop (input x weight), dgrad (output gradient x weight) and wgrad (input x output gradient); every recipe's
  default runs all three at its precision, NVFP4 too (its `backward_override` is None; TE's GEMM-profiling guide,
  after the NVFP4 paper: "all three GEMMs quantize both operands to NVFP4"). Attention's batched GEMMs (FP8 only with
  `fp8_dpa`), the MoE router (Megatron's own linear) and the embedding and output layer (not TE modules) stay in
  BF16.
- The quantisation kernels, memory-bound: each operand is read in BF16 and written quantised, with its scales. A
  per-tensor current scale (FP8 current scaling) and NVFP4's FP32 second-level scale need the tensor's amax first:
  one more read (TE's current-scaling guide: "reading the tensor twice"; NVFP4's nvte_hadamard_transform_amax
  computes the rowwise amax and the columnwise post-RHT amax in that one pass). Delayed scaling takes its scale
  from the amax history and reads once; MXFP8 (1x32 blocks, E8M0 scales), FP8 block scaling (1x128 activations,
  128x128 weights, FP32 scales) and NVFP4 (1x16 blocks, E4M3 scales) compute their block scales in the cast.
- The copies: a GEMM input needs a rowwise usage (fprop, dgrad's output gradient) and a columnwise one (wgrad's two
  operands, dgrad's weight). On Hopper FP8 GEMMs take the TN layout only, so the columnwise usage is a transposed
  FP8 copy, written by the same cast kernel (fused cast-transpose); on Blackwell one per-tensor FP8 copy serves both.
  Block-scaled recipes scale along one dimension, so their columnwise copy is quantised separately from the BF16
  source on every device (NVFP4's with a 16-point random Hadamard transform, fused into its cast, and gradients
  stochastically rounded in the cast: neither adds traffic).
- The weights' cache: Megatron-Core passes `is_first_microbatch` to TE, which quantises a weight (both usages) on a
  step's first micro-batch and reuses the copies for the others; that cost is per step (`weight_quantisation_s`).
  Inputs and output gradients are quantised every micro-batch, inputs once per fused module (Megatron-Core's one
  linear_qkv and one linear_fc1 read the normalised hidden state once, where the layer graph has q/k/v and
  gate/up projections apart).

Which recipes a generation runs, and whether its FP8 GEMMs are TN only, are device facts
(predictor/data/device_facts.json, `hardware.tensor_core_facts`).
"""

from __future__ import annotations

import numpy as np

from predictor.costs.parallel import ShardedNodes
from predictor.graph.layer_graph import LayerGraph
from predictor.spec.hardware import Device, Recipe, generation, tensor_core_facts

SOURCE_BYTES = 2.0  # the BF16 tensor a quantisation kernel reads (activations, gradients and the weights' copy)

# Modules the layer graph keeps apart that Megatron-Core runs as one TE linear on one input (linear_qkv, linear_fc1):
# by their last path component, under one parent.
FUSED_INPUTS: tuple[frozenset[str], ...] = (frozenset({"q_proj", "k_proj", "v_proj"}), frozenset({"query", "key", "value"}),
                                            frozenset({"q", "k", "v"}), frozenset({"gate_proj", "up_proj"}),
                                            frozenset({"w1", "w3"}), frozenset({"wi_0", "wi_1"}))


def low_precision_gemms(nodes: ShardedNodes) -> np.ndarray:
    """Nodes whose GEMMs run in the recipe's precision: the repeated blocks' linears and routed experts."""
    return ((nodes.kind == "linear") & nodes.repeated) | nodes.experts


def input_share(graph: LayerGraph) -> np.ndarray:
    """Per node, its part of quantising its input: 1 / the nodes one fused TE module runs on that input."""
    parents = [nd.name.rpartition(".") for nd in graph.nodes]
    share = np.ones(len(graph.nodes))
    for i, (parent, _, leaf) in enumerate(parents):
        fused = next((f for f in FUSED_INPUTS if leaf in f), None)
        if fused is not None:
            share[i] = 1 / sum(p == parent and lf in fused for p, _, lf in parents)
    return share


def copies(recipe: Recipe, device: Device) -> int:
    """Quantised copies of a tensor that needs both usages: two where the columnwise one is its own (a block-scaled
    recipe, or a transposed FP8 copy for TN-only tensor cores), one where one copy serves both."""
    return 2 if recipe.own_columnwise or tensor_core_facts(generation(device))["fp8_tn_only"] else 1


def quantised_bytes(elements, recipe: Recipe, device: Device):
    """Bytes one quantisation of `elements` moves: the BF16 source read (twice with an amax pass) and both usages
    written with their scales."""
    reads = SOURCE_BYTES * (2 if recipe.amax_pass else 1)
    return elements * (reads + copies(recipe, device) * (recipe.data_bytes + recipe.scale_bytes))


def kernels(recipe: Recipe) -> int:
    """Kernels one quantisation launches: the cast, after an amax kernel where the recipe needs one."""
    return 2 if recipe.amax_pass else 1


def quantisations(nodes: ShardedNodes) -> np.ndarray:
    """Per node, the tensors one of its passes quantises apart: one for a linear; for routed experts each local
    expert's FC1 and FC2 operand (TE's GroupedLinear gives every expert its own quantizer and scale)."""
    return np.where(nodes.experts, 2 * nodes.gemm_batch, 1.0)


def operand_elements(nodes: ShardedNodes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node and sample, the elements its quantised GEMM inputs hold on one rank: (inputs, output gradients,
    weights). A linear's input is m x k, its output gradient m x n, its weight n x k; a routed experts node's grouped
    GEMMs (gemm_n = gate, up and down's 3 x d_ffn) quantise FC1's and FC2's inputs (d_in and d_ffn wide) and their
    output gradients (2 d_ffn and d_in), for each of its gemm_batch experts."""
    m, n, k, b = nodes.gemm_m, nodes.gemm_n, nodes.gemm_k, nodes.gemm_batch
    inputs = np.where(nodes.experts, m * b * (k + n / 3), m * k)
    grads = np.where(nodes.experts, m * b * (k + 2 * n / 3), m * n)
    return inputs, grads, n * k * b


def quantisation_times(graph: LayerGraph, nodes: ShardedNodes, mbs: int, recipe: Recipe, device: Device,
                       bandwidth: float, launch_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per node occurrence and micro-batch of quantising its inputs before forward and its output gradient
    before backward (0 for nodes that stay in BF16), at `bandwidth` bytes/s."""
    low = low_precision_gemms(nodes)
    inputs, grads, _ = operand_elements(nodes)
    launch = kernels(recipe) * launch_s * quantisations(nodes)
    fwd = quantised_bytes(inputs * input_share(graph) * mbs, recipe, device) / bandwidth + launch
    bwd = quantised_bytes(grads * mbs, recipe, device) / bandwidth + launch
    return np.where(low, fwd, 0.0), np.where(low, bwd, 0.0)


def weight_quantisation_s(nodes: ShardedNodes, stage_counts: np.ndarray, recipe: Recipe, device: Device,
                          bandwidth: float, launch_s: float) -> float:
    """Seconds per step the fullest pipeline rank spends quantising its low-precision weights, both usages, once
    (TE's cache across a step's micro-batches)."""
    low = low_precision_gemms(nodes)
    _, _, weights = operand_elements(nodes)
    per_node = quantised_bytes(weights, recipe, device) / bandwidth + kernels(recipe) * launch_s * quantisations(nodes)
    return float((stage_counts @ np.where(low, per_node, 0.0)).max())
