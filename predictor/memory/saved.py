"""The tensors one transformer layer keeps from forward to backward, as its framework's modules save them.

Megatron-Core with Transformer Engine (`megatron-te`), per layer and token of a rank's sequence share, from
TE's `module/layernorm_linear.py` / `linear.py` (`ctx.save_for_backward`: the norm input, mu/rsigma and the
norm output, the sequence-parallel shard that backward all-gathers again), Megatron-Core's fused `bias_swiglu`
(its 2·ffn input) and FC2's input, TE's fused attention (`attention/dot_product_attention`: Q, K, V, the output
and one fp32 softmax statistic per head and token; no s² scores), MoE's permuted expert inputs, grouped-GEMM
activations and the unpermute input (`moe/token_dispatcher.py`, `moe/experts.py`), and MLA's low-rank
projections (`multi_latent_attention.py`). An FP8 linear saves its own FP8 copy of its input (1 byte, MXFP8 1 +
1/32 for the scales); a BF16 linear shares its input with the producer's output. torchtitan (`torchtitan`) is the
same list with eager SwiGLU (silu's output kept too). Each tensor names the Megatron-Core recompute module that
drops it and the fine-grained offload module that moves it to the host.

torchtitan's per-op selective checkpointing (`selective_ac_option = "op"`, its default) keeps another list:
`op_sac_tensors`, the outputs its policy must save (`_op_sac_save_list` in pytorch/torchtitan
`torchtitan/models/llama3/infra/parallelize.py`, applied by `torchtitan/distributed/activation_checkpoint.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from predictor.memory import low_precision_element_bytes
from predictor.memory.facts import MemoryFacts
from predictor.plan.share import RankShare
from predictor.spec.workload import ModelSpec


@dataclass(frozen=True)
class Saved:
    """One saved tensor: bytes per token of the rank's sequence share (`Layout.rank_tokens`), the recompute module that
    drops it ('' when nothing short of full recomputation does) and the offload module that moves it."""

    name: str
    per_token: float
    recompute: str = ""
    offload: str = ""


@dataclass(frozen=True)
class Dims:
    """One rank's view of a layer: the model's dimensions, the rank's share of them (`RankShare`), the precision."""

    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int
    top_k: int
    expert_ffn: int
    shared_ffn: int
    mla: tuple[int, int, int, int, int] | None  # q_lora, kv_lora, rope, nope, v head dims
    width: int  # the divisor of heads, MLP columns and the vocabulary (`RankShare.width`)
    seq_shard: int  # of the sequence of what a width split leaves whole: norms' inputs (`RankShare.seq_shard`)
    linear_input_bytes: float  # bytes per element a linear keeps of its input (2 in BF16, 1 in FP8)
    fp8: bool
    scores_keys: int = 0  # keys per query whose scores an unfused attention keeps (0: fused)
    expert_ranks: int = 1  # the ranks the routed experts are spread over: above 1 MoE tokens cross all-to-alls
    act: float = 2.0  # bytes per activation element (`activation_element_bytes`)
    imbalance: float = 1.0  # the busiest expert rank's token-expert pairs over the balanced share (`moe_imbalance`)
    expert_width: int = 1  # the divisor of each expert's FFN: its FC1 keeps that many ranks' gathered tokens
    tokens: int = 1  # the divisor of a MoE layer's tokens (`RankShare.tokens`)

    @classmethod
    def of(cls, model: ModelSpec, share: RankShare, precision: str, fp8_format: str = "cs",
           scores_keys: int = 0, imbalance: float = 1.0) -> "Dims":
        heads = model.heads or 1
        head_dim = model.head_dim or model.hidden // heads
        mla = None
        if model.kv_lora_rank:
            mla = (model.q_lora_rank or 0, model.kv_lora_rank, model.qk_rope_head_dim or 0,
                   model.qk_nope_head_dim or head_dim, model.v_head_dim or head_dim)
        act = activation_element_bytes(precision)
        low = low_precision_element_bytes(precision, fp8_format)
        lin = act if low is None else low
        expert_ffn = model.expert_ffn or model.ffn_hidden or 4 * model.hidden
        return cls(model.hidden, model.ffn_hidden or 4 * model.hidden, heads, model.kv_heads or heads, head_dim,
                   model.vocab or 0, model.experts or 0, model.top_k or 0, expert_ffn,
                   model.shared_experts * expert_ffn, mla, share.width, share.seq_shard, lin,
                   precision in ("fp8", "fp4"), scores_keys, share.experts, act, imbalance, share.expert_width,
                   share.tokens)


def activation_element_bytes(precision: str) -> float:
    """Bytes per activation element a run keeps: its compute dtype's. Mixed precision (fp16, bf16) computes in 16
    bits, and so do FP8 and FP4 runs outside their GEMMs (a BF16 model whose linears keep their own low-precision
    copy of their input: `Dims.linear_input_bytes`); an fp32 run keeps 4-byte activations."""
    return 4.0 if precision == "fp32" else 2.0


def unfused_score_bytes(d: Dims) -> float:
    """Bytes per score an unfused attention keeps for backward (Megatron-LM's CoreAttention: the softmax output for its
    backward, the 1-byte dropout mask, and the dropped probabilities the attention x V GEMM reads)."""
    return d.act + 1.0 + d.act


def attention_tensors(d: Dims) -> list[Saved]:
    """The attention half of a layer: norm, QKV (or MLA's projections), the fused attention, the output projection."""
    t, r, lin = d.width, d.seq_shard, d.linear_input_bytes
    out: list[Saved] = [Saved("attn_norm input", d.hidden / r * d.act, offload="attn_norm"),
                        # TE keeps the norm output for the GEMM's weight gradient: a BF16 tensor the layernorm module
                        # drops, or in FP8 the linear's own copy, which stays
                        Saved("qkv input (norm output)", d.hidden / r * lin, "" if d.fp8 else "layernorm", "qkv_linear")]
    if d.mla is None:
        q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
        out.append(Saved("Q, K, V", (q + 2 * kv) / t * d.act, offload="core_attn"))
        o = q
    else:
        q_lora, kv_lora, rope, nope, v = d.mla
        if d.fp8:
            out.append(Saved("kv down input (FP8 copy)", d.hidden / r * lin, offload="qkv_linear"))
        out += [Saved("q norm input", q_lora / r * d.act), Saved("q up input", q_lora / r * lin),
                Saved("kv norm input", kv_lora / r * d.act), Saved("kv up input", kv_lora / r * lin),
                Saved("Q, K, V", d.heads * (2 * (nope + rope) + v) / t * d.act, "mla_up_proj", "core_attn")]
        o = d.heads * v
    # The attention output is the projection's input: one BF16 tensor (kept when attention is recomputed, since
    # the projection saves it), or in FP8 a BF16 one attention saves plus the projection's FP8 copy.
    out.append(Saved("attention output", o / t * d.act, "core_attn" if d.fp8 else "", "core_attn"))
    if d.scores_keys:  # unfused: the softmax output (2 B), the dropout mask (1 B) and the dropped probabilities (2 B)
        out.append(Saved("attention scores (unfused)", d.heads / t * d.scores_keys * unfused_score_bytes(d), "core_attn",
                         "core_attn"))
    else:
        out.append(Saved("softmax statistics (fp32)", d.heads / t * 4.0, "core_attn", "core_attn"))
    if d.fp8:
        out.append(Saved("proj input (FP8 copy)", o / t * lin, offload="attn_proj"))
    return out


def dense_mlp_tensors(d: Dims, facts: MemoryFacts) -> list[Saved]:
    t, r, lin = d.width, d.seq_shard, d.linear_input_bytes
    out = [Saved("mlp_norm input", d.hidden / r * d.act, offload="mlp_norm"),
           Saved("fc1 input (norm output)", d.hidden / r * lin, "mlp" if d.fp8 else "layernorm+mlp", "mlp_norm"),
           Saved("swiglu input", 2 * d.ffn / t * d.act, "mlp"),
           Saved("fc2 input", d.ffn / t * (lin if d.fp8 else d.act), "mlp")]
    if facts.swiglu_saved > 3:
        out.append(Saved("silu output", (facts.swiglu_saved - 3) * d.ffn / t * d.act, "mlp"))
    return out


def moe_mlp_tensors(d: Dims) -> list[Saved]:
    """A MoE layer's MLP half (dropless routing: each rank's experts receive top_k pairs per local token, the busiest
    rank `imbalance` times that; the layer runs sequence parallel, so its tokens are split by `Dims.tokens`)."""
    t, r, lin, k = d.tokens, d.seq_shard, d.linear_input_bytes, d.top_k * d.imbalance
    out = [Saved("mlp_norm input", d.hidden / r * d.act, offload="mlp_norm"),
           Saved("router input (norm output)", d.hidden / r * d.act, "layernorm+moe", "mlp_norm"),
           Saved("router scores (fp32)", d.experts / t * 4.0, "moe"),
           # with each expert's width split, FC1 reads its ranks' tokens all-gathered (token_dispatcher.py)
           Saved("expert fc1 input (permuted tokens)", k * d.hidden / t * lin * d.expert_width, "moe", "expert_fc1"),
           Saved("expert activation input", k * 2 * d.expert_ffn / t * d.act, "moe", "moe_act"),
           Saved("expert fc2 input", k * d.expert_ffn / t * (lin if d.fp8 else d.act), "moe_act+moe", "moe_act"),
           Saved("unpermute input (expert output)", k * d.hidden / t * d.act, "moe")]
    if d.shared_ffn:
        if d.fp8:
            out.append(Saved("shared fc1 input (FP8 copy)", d.hidden / r * lin, "shared_experts+moe"))
        out += [Saved("shared activation input", 2 * d.shared_ffn / d.width * d.act, "shared_experts+moe"),
                Saved("shared fc2 input", d.shared_ffn / d.width * (lin if d.fp8 else d.act), "shared_experts+moe")]
    return out


def layer_tensors(d: Dims, facts: MemoryFacts, moe: bool) -> list[Saved]:
    """Every tensor one layer saves with nothing recomputed or offloaded."""
    return attention_tensors(d) + (moe_mlp_tensors(d) if moe else dense_mlp_tensors(d, facts))


def _block_mm_outputs(d: Dims, moe: bool) -> list[tuple[str, float]]:
    """The outputs of a transformer block's `aten.mm` calls in torchtitan's forward order, elements per token of the
    rank's sequence share: wq, wk, wv (column-parallel: heads split by the width), wo (row-parallel: the full
    sequence's partial sums before the reduce-scatter), then the dense MLP's w1, w3, w2 or a MoE layer's router gate
    and shared expert (its routed experts run `_grouped_mm`, no mm)."""
    t = d.width
    if d.mla is None:
        q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
        out = [("wq output", q / t), ("wk output", kv / t), ("wv output", kv / t)]
    else:  # DeepSeek-V3's attention (torchtitan/models/deepseek_v3/model/model.py): wq_a, wq_b, wkv_a, wkv_b
        q_lora, kv_lora, rope, nope, v = d.mla
        q = [("wq_a output", q_lora), ("wq_b output", d.heads * (nope + rope) / t)] if q_lora else \
            [("wq output", d.heads * (nope + rope) / t)]
        out = q + [("wkv_a output", kv_lora + rope), ("wkv_b output", d.heads * (nope + v) / t)]
    out.append(("wo output (unreduced)", d.hidden))
    if not moe:
        return out + [("w1 output", d.ffn / t), ("w3 output", d.ffn / t), ("w2 output (unreduced)", d.hidden)]
    out.append(("router scores", d.experts / d.tokens))
    if d.shared_ffn:
        out += [("shared w1 output", d.shared_ffn / t), ("shared w3 output", d.shared_ffn / t),
                ("shared w2 output (unreduced)", d.hidden)]
    return out


def op_sac_saves_mm(position: int) -> bool:
    """Whether torchtitan's per-op policy saves the block's `position`-th mm (counted from 1, per checkpointed block:
    its `meta["forward_mm_count"]`): the odd ones, every second being recomputed."""
    return position % 2 == 1


def op_sac_tensors(d: Dims, moe: bool, compiled: bool = False) -> list[Saved]:
    """What one layer keeps under torchtitan's per-op selective checkpointing: the block's input (the checkpointed
    region's), and the outputs its policy marks MUST_SAVE: every odd-numbered `aten.mm` of the block ("saves output
    of all compute ops, except every second mm"), the SDPA kernel's output and fp32 log-sum-exp, and each
    sequence-parallel reduce-scatter's output, and under expert parallelism the expert all-to-alls' outputs (on
    the save list of its MoE models, `all_to_all_single`: torchtitan/models/deepseek_v3/infra/parallelize.py): the
    dispatched tokens the grouped GEMMs read and the combined ones the routing weights multiply, top_k per token
    each. All else (norms, RoPE, SiLU, the even mms, the sequence-parallel all-gathers, a MoE layer's grouped GEMMs)
    is recomputed in backward. An mm's output is its
    BF16 result whatever the linear's precision: torchao's float8 and MX linears reach the policy as `aten.mm`.

    Eager, the policy's cache keeps every output it marks. A block compiled with torch.compile (torchtitan compiles
    each block after wrapping it) is split by AOTAutograd's partitioner, which saves only what the backward graph
    reads: the output projections' unreduced sums and the reduce-scatters' outputs feed only the residual adds,
    whose backward reads nothing, so they are not kept."""
    r = d.seq_shard
    out = [Saved("block input", d.hidden / r * d.act)]
    mms = _block_mm_outputs(d, moe)
    out += [Saved(name, per_token * d.act) for i, (name, per_token) in enumerate(mms, 1)
            if op_sac_saves_mm(i) and not (compiled and name.endswith("(unreduced)"))]
    o = d.heads * (d.mla[4] if d.mla else d.head_dim)
    out += [Saved("attention output (SDPA)", o / d.width * d.act),
            Saved("softmax log-sum-exp (fp32)", d.heads / d.width * 4.0)]
    if d.width > 1 and not compiled:
        out += [Saved(f"{half} reduce-scatter output", d.hidden / r * d.act) for half in ("attention", "mlp")]
    if moe and d.expert_ranks > 1:
        out += [Saved(f"{which} tokens (all-to-all output)", d.top_k * d.hidden / d.tokens * d.act)
                for which in ("dispatched", "combined")]
    return out


def kept(tensors: list[Saved], recompute: frozenset[str], offload: frozenset[str]) -> list[Saved]:
    """The tensors left on the GPU once `recompute` modules drop theirs and `offload` modules move theirs."""
    return [s for s in tensors if not (set(s.recompute.split("+")) & recompute)
            and not (s.offload and s.offload in offload)]


def backward_working(d: Dims, moe: bool) -> float:
    """Bytes per token alive only while one layer runs backward: the MLP's activation gradients, and with sequence
    parallelism the all-gathered norm output and the unreduced input gradient (full sequence, BF16)."""
    gathered = 2 * d.hidden * d.act if d.seq_shard > 1 else 0.0
    if moe:
        return d.top_k * (3 * d.expert_ffn + 2 * d.hidden) / d.tokens * d.act + gathered
    return 3 * d.ffn / d.width * d.act + gathered


# Transformer Engine's fused cross-entropy keeps the BF16 logits, overwritten by their gradient in forward.
TE_LOSS_BYTES = 2.0
# A compiled cross-entropy (torchtitan's `[compile] components = ["loss"]`): Inductor fuses the fp32 upcast, the
# log-softmax and the NLL into kernels that keep the BF16 logits (and a log-sum-exp per token), and backward writes
# a BF16 gradient beside them: bytes per logit saved, and alive at its backward's start.
COMPILED_LOSS_BYTES = (2.0, 4.0)


def loss_tensors(d: Dims, facts: MemoryFacts, te_cross_entropy: bool = False, compiled: bool = False) -> list[Saved]:
    """What the last stage keeps for its loss: the final norm's input, the output layer's input, the logits."""
    per_logit = TE_LOSS_BYTES if te_cross_entropy else COMPILED_LOSS_BYTES[0] if compiled else facts.loss_saved_bytes
    return [Saved("final norm input", d.hidden / d.seq_shard * d.act),
            Saved("output layer input", d.hidden / d.seq_shard * d.act),
            Saved("logits (loss)", d.vocab / d.width * per_logit)]


def loss_working(d: Dims, facts: MemoryFacts, te_cross_entropy: bool = False, compiled: bool = False) -> float:
    """Bytes per token alive at the start of the loss's backward beyond what it saved: the logits' gradients, the
    output layer's gathered input and unreduced input gradient."""
    gathered = 2 * d.hidden * d.act if d.seq_shard > 1 else 0.0
    if te_cross_entropy:
        extra = 0.0
    elif compiled:
        extra = COMPILED_LOSS_BYTES[1] - COMPILED_LOSS_BYTES[0]
    else:
        extra = facts.loss_peak_bytes - facts.loss_saved_bytes
    return d.vocab / d.width * extra + gathered
