"""Every flag the Megatron launch writes for bf16 plans (model, parallelism, ZeRO, pipeline layout, recomputation,
experts, MLA, optimizer levers) is one Megatron-LM's parser defines: the flags below are read from
megatron/training/arguments.py (NVIDIA/Megatron-LM at 000c4ac2), by the function that adds them. Its FP8/FP4 and
activation-offloading flags are not in this table (that version generates part of them from TransformerConfig)."""

from __future__ import annotations

import shlex

import pytest

from predictor.frameworks.launch import launch_files
from predictor.plan import Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import parse_spec

ARGUMENTS_PY = {
    "_add_network_size_args": {
        "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
        "--group-query-attention", "--num-query-groups", "--max-position-embeddings", "--position-embedding-type",
        "--normalization", "--swiglu", "--untie-embeddings-and-output-weights", "--multi-latent-attention",
        "--mtp-num-layers", "--attention-backend"},
    "_add_training_args": {
        "--micro-batch-size", "--global-batch-size", "--recompute-granularity", "--recompute-method",
        "--recompute-num-layers", "--recompute-modules", "--cpu-offloading-num-layers", "--tp-comm-overlap",
        "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "--disable-bias-linear", "--add-qkv-bias",
        "--sequence-parallel", "--optimizer-cpu-offload", "--optimizer-offload-fraction",
        # the kernel settings (training.kernels), read from the stored arguments.py's _add_training_args
        "--transformer-impl", "--cuda-graph-impl", "--no-masked-softmax-fusion", "--no-bias-gelu-fusion",
        "--no-gradient-accumulation-fusion"},
    "_add_vision_args": {"--qk-layernorm"},
    "_add_mixed_precision_args": {"--fp16", "--bf16", "--grad-reduce-in-bf16"},
    "_add_checkpointing_args": {"--ckpt-format"},
    "_add_distributed_args": {
        "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--pipeline-model-parallel-layout",
        "--num-virtual-stages-per-pipeline-rank", "--no-overlap-p2p-communication", "--overlap-grad-reduce",
        "--overlap-param-gather", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
        "--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
        "--context-parallel-size", "--cp-comm-type", "--use-tp-pp-dp-mapping"},
    "_add_data_args": {"--seq-length"},
    "_add_moe_args": {
        "--expert-model-parallel-size", "--num-experts", "--moe-layer-freq", "--moe-ffn-hidden-size",
        "--moe-shared-expert-intermediate-size", "--moe-grouped-gemm", "--moe-router-dtype",
        "--moe-router-score-function", "--moe-router-topk", "--moe-token-dispatcher-type",
        "--overlap-moe-expert-parallel-comm", "--expert-tensor-parallel-size"},
    "_add_mla_args": {"--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim"},
    "_add_experimental_args": {"--use-precision-aware-optimizer", "--main-grads-dtype", "--exp-avg-dtype",
                               "--exp-avg-sq-dtype"},
}
# Flags of a later Megatron-LM (Megatron-Core 0.15: `_add_training_args` --cuda-graph-scope, nargs='+', choices attn,
# mlp, moe, moe_router, moe_preprocess, mamba, full_iteration; `_add_moe_args` --moe-flex-dispatcher-backend deepep or
# hybridep for --moe-token-dispatcher-type flex, as its DeepSeek-V3 GB200 guide runs them).
# Megatron-Core 0.16.1's TransformerConfig fields moe_permute_fusion and moe_router_fusion, which Megatron-LM's parser
# adds from the config (--moe-permute-fusion, --moe-router-fusion: the MoE kernel settings).
# And its delay_wgrad_compute (--delay-wgrad-compute, beside --overlap-moe-expert-parallel-comm).
LATER = {"--cuda-graph-scope", "--moe-flex-dispatcher-backend", "--moe-permute-fusion", "--moe-router-fusion",
         "--delay-wgrad-compute"}
DEFINED = set().union(*ARGUMENTS_PY.values(), LATER)


def _spec(preset: str, nodes: int, global_batch: int = 1024, kernels: dict | None = None, **model: object) -> object:
    training = {"global_batch": global_batch, **({"kernels": kernels} if kernels else {})}
    return parse_spec({"model": {"preset": preset, **model}, "training": training,
                       "cluster": {"device": "h100", "nodes": nodes, "gpus_per_node": 8}})


@pytest.mark.parametrize("preset, nodes, plan, model", [
    ("llama3-70b", 8, "dp=2,tp=8,pp=4,mbs=1,zero=1,sp=true,recompute=selective,schedule=interleaved,v=5", {}),
    ("llama3-70b", 8, "dp=4,tp=4,pp=1,cp=4,mbs=1,zero=3,sp=true,recompute=full,recompute_layers=2", {"seq_len": 32768}),
    ("qwen3-32b", 4, "dp=8,tp=4,mbs=1,zero=2,sp=true,moments=bf16,grads=bf16,optimizer_offload=0.5", {}),
    ("llama3.2-1b", 1, "dp=8,mbs=4,zero=0,recompute=core_attn+mlp", {}),
    ("deepseek-v3", 32, "dp=16,tp=2,pp=8,mbs=1,zero=1,sp=true,ep=2,placement=tp-pp-dp", {"mtp_layers": 1}),
    ("qwen3-30b-a3b", 4, "dp=32,mbs=1,zero=1,ep=8,recompute=full", {}),
    ("qwen3-30b-a3b", 4, "dp=32,mbs=1,zero=1,ep=16,dispatcher=hybridep", {"kernels": {
        "cuda_graphs": True, "cuda_graph_scope": "attn+moe_router+moe_preprocess"}}),
    ("gpt3-2.7b", 1, "dp=2,tp=4,mbs=1,zero=1,sp=true,overlap=dp+param", {"kernels": {
        "attention": "unfused", "transformer_engine": False, "cuda_graphs": True, "fused_softmax": False,
        "fused_bias_gelu": False, "fused_grad_accum": False}}),
])
def test_every_megatron_flag_written_is_one_its_parser_defines(preset: str, nodes: int, plan: str,
                                                              model: dict) -> None:
    text = launch_files(Plan.parse(plan), resolve(_spec(preset, nodes, **model)))["megatron_args.txt"]
    flags = {a for a in shlex.split(text) if a.startswith("--")}
    assert flags and flags <= DEFINED, sorted(flags - DEFINED)
