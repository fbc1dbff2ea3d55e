"""Expert parallelism's token dispatchers (the plan field `dispatcher`): what each moves over which link, how fast
its own kernels move it, and the buffers it keeps (no torch: the analytical model imports this).

Each MoE layer dispatches a micro-batch's tokens to the ranks holding their top-k experts and combines the results
back, once each in forward and again (their gradients) in backward. The dispatchers differ in what they send:

- alltoall (Megatron-Core's `MoEAlltoAllTokenDispatcher`, torchtitan's `all_to_all_single` expert parallelism,
  DeepSpeed-MoE's `_AllToAll`): the tokens are permuted into one copy per token-expert pair first, so each rank
  sends tokens·top_k·hidden elements through NCCL's all-to-all (`predictor.costs.moe.alltoall`);
- allgather (Megatron-Core's `MoEAllGatherTokenDispatcher`): every rank all-gathers the hidden states of the whole
  ep group and keeps the tokens its experts take; the combine is a reduce-scatter of the same size;
- deepep, hybridep (Megatron-Core's `MoEFlexTokenDispatcher`, `--moe-token-dispatcher-type flex
  --moe-flex-dispatcher-backend deepep|hybridep`; torchtitan's `expert_parallel_comm_backend`): DeepEP's normal
  kernels and NVIDIA's Hybrid-EP send each token once to every rank holding one of its experts (and across NVLink
  domains once to every domain holding one, forwarded inside it over NVLink), so a rank receives
  tokens·hidden·(ranks reached) elements. Their speed is the published bandwidth of those kernels
  (predictor/data/device_facts.json `moe_dispatch`: deepseek-ai/DeepEP docs/legacy.md, NVIDIA's
  Hybrid-EP_Implementation.md) as a share of the link it was measured on, applied to the device's own link.

Buffers (dropless routing: sized to the tokens the busiest rank receives): every dispatcher keeps the permuted
token-expert pairs it sends and receives; allgather the gathered hidden states; DeepEP its fixed NVLink and RDMA
buffers (`deep_ep/buffer.py` `get_dispatch_config`, `csrc/config.hpp` `get_nvl_buffer_size_hint` and
`get_rdma_buffer_size_hint`, with Megatron-Core's 20 SMs: `--moe-deepep-num-sms`); Hybrid-EP its registered
dispatch-output and combine-input buffers of MAX_NUM_OF_TOKENS_PER_RANK tokens from each rank of its NVLink domain
(`csrc/hybrid_ep/config.cuh`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from predictor.costs import comm
from predictor.costs.moe import alltoall
from predictor.spec.hardware import device_facts

if TYPE_CHECKING:  # pragma: no cover
    from predictor.spec.workload import ModelSpec

FLEX: tuple[str, ...] = ("deepep", "hybridep")
# DeepEP's high-throughput kernels: Megatron-Core's SMs for them (--moe-deepep-num-sms 20), two SMs a channel; the
# NVLink peers one buffer serves; per received token the top-k indices (int64) and weights (fp32) of up to 128
# experts, up to 128 FP8 scales and its source metadata beside the hidden bytes; the NVLink receive queue per
# channel and peer by ep ranks (get_dispatch_config: 256 up to 8 ranks, 288 up to 64, 560 at 128, 720 beyond) and
# the RDMA one (128, a send and a receive half).
DEEPEP_CHANNELS = 20 // 2
DEEPEP_NVL_PEERS = 8
DEEPEP_TOKEN_EXTRA_BYTES = 128 * 8 + 128 * 4 + 128 * 4 + 8
DEEPEP_NVL_QUEUE: tuple[tuple[int, int], ...] = ((8, 256), (64, 288), (128, 560))
DEEPEP_NVL_QUEUE_MAX = 720
DEEPEP_RDMA_QUEUE = 128


@dataclass(frozen=True)
class DispatchFact:
    """One published measurement of a flex dispatcher's kernels: the share of its link's bandwidth (per direction)
    its dispatch and its combine reached over `ranks` ranks of the ep group."""

    kernel: str
    generation: str
    device: str
    link: str  # "nvlink" (inside an NVLink domain) or "rdma" (between domains)
    ranks: int
    dispatch_share: float
    combine_share: float
    source: str


@cache
def dispatch_facts() -> tuple[DispatchFact, ...]:
    """The catalogue's `moe_dispatch` entries."""
    return tuple(DispatchFact(e["kernel"], e["generation"], e["device"], e["link"], int(e["ranks"]),
                              e["dispatch_gbps"] / e["link_gbps"], e["combine_gbps"] / e["link_gbps"], e["source"])
                 for e in device_facts()["moe_dispatch"])


def fact_for(kernel: str, link: str, ranks: int, device: str, generation: str) -> DispatchFact:
    """The measurement of `kernel` over `link` that best describes `ranks` ranks on `device`: the device's own
    first, else its generation's, else any generation's; among them the nearest rank count."""
    found = [f for f in dispatch_facts() if f.kernel == kernel and f.link == link]
    if not found:
        raise KeyError(f"no published {kernel} measurement over {link} in predictor/data/device_facts.json")
    for keep in (lambda f: f.device == device, lambda f: f.generation == generation, lambda f: True):
        chosen = [f for f in found if keep(f)]
        if chosen:
            return min(chosen, key=lambda f: (abs(f.ranks - ranks), f.ranks))
    raise AssertionError("unreachable")


def reach(experts: int, top_k: int, held: float) -> float:
    """The chance that a token's top_k distinct experts, routed uniformly (balanced), include one of `held` of the
    `experts`: 1 - C(E - held, k) / C(E, k)."""
    miss = 1.0
    for i in range(top_k):
        miss *= max(experts - held - i, 0.0) / (experts - i)
    return 1.0 - miss


def exchange_seconds(dispatcher: str, pair_bytes: float, model: "ModelSpec", group: comm.Group, device: str,
                     generation: str) -> float:
    """Seconds of one dispatch and one combine on each rank of `group`, whose micro-batch's token-expert pairs hold
    `pair_bytes` (tokens·top_k·hidden·bytes, routing imbalance included)."""
    n = group.size
    if n <= 1 or pair_bytes <= 0:
        return 0.0
    k, experts = model.top_k or 1, model.experts or n
    token_bytes = pair_bytes / k
    if dispatcher == "alltoall":
        return 2 * alltoall(pair_bytes, group)
    if dispatcher == "allgather":
        gathered = token_bytes * n
        return float(comm.allgather(gathered, group) + comm.reduce_scatter(gathered, group))
    received = token_bytes * n * reach(experts, k, experts / n)
    nvl = fact_for(dispatcher, "nvlink", group.n_intra if group.n_inter > 1 else n, device, generation)
    bw = group.intra_for("alltoall").bandwidth
    seconds = received / (nvl.dispatch_share * bw) + received / (nvl.combine_share * bw)
    if group.n_inter > 1:
        remote = token_bytes * (group.n_inter - 1) * reach(experts, k, experts / group.n_inter)
        rdma = fact_for(dispatcher, "rdma", n, device, generation)
        net = group.inter.bandwidth
        seconds = max(seconds, remote / (rdma.dispatch_share * net) + remote / (rdma.combine_share * net))
    return seconds


def _deepep_buffer(hidden: int, ranks: int) -> float:
    """DeepEP's NVLink and RDMA buffers for an ep group of `ranks` (hidden bytes at least 2 a value, as Megatron-Core's
    `get_hidden_bytes` sizes them)."""
    token = hidden * 2 + DEEPEP_TOKEN_EXTRA_BYTES
    queue = next((q for most, q in DEEPEP_NVL_QUEUE if ranks <= most), DEEPEP_NVL_QUEUE_MAX)
    nvl = DEEPEP_CHANNELS * min(ranks, DEEPEP_NVL_PEERS) * queue * token
    rdma_ranks = ranks // DEEPEP_NVL_PEERS
    rdma = 2 * DEEPEP_CHANNELS * rdma_ranks * DEEPEP_RDMA_QUEUE * token if rdma_ranks > 1 else 0.0
    return float(nvl + rdma)


def buffer_bytes(dispatcher: str, tokens: float, model: "ModelSpec", token_split: int, act_bytes: float,
                 group: comm.Group, imbalance: float = 1.0) -> float:
    """Bytes the dispatcher keeps on a rank for one micro-batch of `tokens` tokens, before the MoE layers' tokens are
    split over `token_split` ranks (`predictor.plan.share.RankShare.tokens`): the permuted token-expert pairs sent
    and received (the busiest rank's, `imbalance` times the balanced share), and its own buffers."""
    n = group.size
    if n <= 1:
        return 0.0
    h = model.hidden or 0
    pairs = tokens * (model.top_k or 0) * h / token_split * act_bytes * imbalance
    own = 0.0
    if dispatcher == "allgather":
        own = tokens * h / token_split * act_bytes * n
    elif dispatcher == "deepep":
        own = _deepep_buffer(h, n)
    elif dispatcher == "hybridep":
        own = 2 * tokens / token_split * group.n_intra * h * act_bytes
    return 2 * pairs + own
