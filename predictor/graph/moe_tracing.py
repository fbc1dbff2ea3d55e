"""Balanced routing for tracing mixtures of experts (torch; the cost functions are `predictor.costs.moe`).

The layer graph is traced with `balanced_experts_forward`, registered as a transformers experts
implementation: the tokens·top_k token-expert pairs are dealt evenly, tokens·top_k/E to each of the E
experts, and each expert runs two GEMMs (gate/up, then down) on its share, as a grouped GEMM does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

BALANCED = "scaledl_balanced"


def balanced_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor) -> torch.Tensor:
    """A transformers experts forward with balanced routing: token-expert pair i goes to expert i // (T·k/E),
    each expert a batched GEMM over its share (shapes are static, so it traces on the meta device)."""
    tokens, hidden = hidden_states.shape
    k = top_k_index.size(-1)
    experts = self.num_experts
    share = math.ceil(tokens * k / experts)
    x = hidden_states.repeat_interleave(k, dim=0)
    x = F.pad(x, (0, 0, 0, experts * share - tokens * k)).view(experts, share, hidden)
    out = expert_mlps(self, x).reshape(experts * share, hidden)
    out = out[: tokens * k] * top_k_weights.reshape(-1, 1).to(out.dtype)
    return out.view(tokens, k, hidden).sum(dim=1)


def expert_mlps(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Each expert's MLP on its tokens, `x` (experts held, tokens each, hidden): the grouped GEMMs (gate/up,
    then down, with their biases) of a transformers experts module, as batched GEMMs."""
    up_w = self.gate_up_proj if self.has_gate else self.up_proj
    up = torch.bmm(x, up_w if self.is_transposed else up_w.transpose(1, 2))
    if self.has_bias:
        up = up + (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias)[:, None, :]
    act = self._apply_gate(up) if self.has_gate else self.act_fn(up)
    out = torch.bmm(act, self.down_proj if self.is_transposed else self.down_proj.transpose(1, 2))
    if self.has_bias:
        out = out + self.down_proj_bias[:, None, :]
    return out


def register_balanced_experts() -> None:
    """Make `BALANCED` a transformers experts implementation (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if BALANCED not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(BALANCED, balanced_experts_forward)
