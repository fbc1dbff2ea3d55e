"""Expert parallelism in the runner: each rank holds E/ep experts and exchanges tokens with all-to-alls.

Routing is the balanced routing the layer graph is traced with (`predictor.graph.moe_tracing.balanced_experts_forward`):
token-expert pair i goes to expert i // (T·k/E). With ep ranks, a rank's pairs for the experts of rank j go
to rank j in one all-to-all (the dispatch), rank j runs its local experts' GEMMs on the pairs of every rank,
and a second all-to-all brings the results back (the combine), as Megatron-Core's alltoall dispatcher does;
both are differentiable (`all_to_all_single_autograd`), so backward runs the two
all-to-alls again. Expert gradients are not data-parallel gradients: each rank's experts see the tokens of
every ep rank, so their gradient is the sum over those ranks' losses and is divided by ep to be the mean the
dense gradients are; the runner supports the plans `predictor.frameworks.pytorch.runner_ep_error` allows (ep = dp: the
expert-data-parallel group has one rank).
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from predictor.graph.moe_tracing import expert_mlps

_PARAMS = ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias", "down_proj_bias")


def expert_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The transformers experts modules (3-D expert weights) of `model`, by module path."""
    return {name: m for name, m in model.named_modules() if type(m).__name__.endswith("Experts")}


def shard_experts(model: nn.Module, group: Any, rank: int, ep: int) -> set[str]:
    """Keep this rank's E/ep experts of every experts module and route through the ep `group`; returns the
    model paths of the expert parameters (which data parallelism must leave alone)."""
    names: set[str] = set()
    for path, module in expert_modules(model).items():
        local = module.num_experts // ep
        lo = rank * local
        for attr in _PARAMS:
            weight = getattr(module, attr, None)
            if isinstance(weight, nn.Parameter):
                setattr(module, attr, nn.Parameter(weight.detach()[lo:lo + local].clone()))
                names.add(f"{path}.{attr}")
        module.ep_group, module.ep, module.local_experts = group, ep, local
        module.forward = types.MethodType(expert_parallel_forward, module)
    return names


def expert_parallel_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                            top_k_weights: torch.Tensor) -> torch.Tensor:
    """Balanced routing over ep ranks: dispatch all-to-all, the local experts' batched GEMMs, combine all-to-all."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd as all_to_all

    tokens, hidden = hidden_states.shape
    k = top_k_index.size(-1)
    experts, ep, local = self.num_experts, self.ep, self.local_experts
    share = math.ceil(tokens * k / experts)
    x = hidden_states.repeat_interleave(k, dim=0)
    x = F.pad(x, (0, 0, 0, experts * share - tokens * k)).reshape(experts * share, hidden)
    received = all_to_all(x.contiguous(), None, None, self.ep_group)  # (ep src, local, share): pairs for my experts
    x = received.view(ep, local, share, hidden).transpose(0, 1).reshape(local, ep * share, hidden)
    out = expert_mlps(self, x).view(local, ep, share, hidden).transpose(0, 1).reshape(experts * share, hidden)
    back = all_to_all(out.contiguous(), None, None, self.ep_group)
    back = back[: tokens * k] * top_k_weights.reshape(-1, 1).to(back.dtype)
    return back.view(tokens, k, hidden).sum(dim=1)


def scale_expert_grads(params: list[torch.Tensor], ep: int) -> None:
    """Expert gradients summed over the ep ranks' tokens, made the mean over the data-parallel batch."""
    for p in params:
        if p.grad is not None:
            p.grad.div_(ep)
