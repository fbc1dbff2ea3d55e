"""What a training step costs per module call: one forward and backward of the reduced model under
`FakeTensorMode` on meta. FLOPs per op use `FlopCounterMode`'s own formula registry; forward ops are
attributed to the module call running, backward ops to the module call that created the autograd node
executing them (by autograd sequence number), which `FlopCounterMode`'s per-module view cannot do reliably.
Elements saved for backward are measured with `torch.autograd.graph.saved_tensors_hooks` (each saved
storage counted once, parameters excluded)."""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from predictor.graph.modelzoo import module_args, output_loss
from predictor.spec.workload import ModelSpec


@dataclass
class Costs:
    """Figures per (module call key, calls begun so far); `entered` lists the call keys in order."""

    fwd: dict[tuple[str, int], float] = field(default_factory=dict)
    bwd: dict[tuple[str, int], float] = field(default_factory=dict)
    act: dict[tuple[str, int], float] = field(default_factory=dict)
    act_mask: dict[tuple[str, int], float] = field(default_factory=dict)
    entered: list[str] = field(default_factory=list)


@functools.cache
def _skip_ops() -> set:
    """Metadata queries, handed back like `FlopCounterMode` does: they run no kernel and count no FLOPs."""
    a = torch.ops.aten
    return {a.sym_is_contiguous.default, a.is_contiguous.default, a.is_contiguous.memory_format,
            a.is_strides_like_format.default, a.is_non_overlapping_and_dense.default, a.size.default,
            a.sym_size.default, a.stride.default, a.sym_stride.default, a.storage_offset.default,
            a.sym_storage_offset.default, a.numel.default, a.sym_numel.default, a.dim.default,
            torch.ops.prim.layout.default}


class _Recorder:
    """Module-call tracking, autograd-node → call mapping, FLOPs per call and saved-tensor accounting."""

    def __init__(self, model: nn.Module):
        self.names = {}
        for name, m in model.named_modules():
            self.names.setdefault(id(m), name)
        self.stack: list[str] = [""]
        self.entered: list[str] = []  # every module call key, in the order the calls began
        self.calls: dict[str, int] = {}
        self.phase = "fwd"
        self.seq_hi: list[int] = []
        self.seq_call: list[str] = []
        self.costs = Costs()
        self.saved_seen: set[int] = set()
        self.keepalive: list[torch.Tensor] = []
        from torch.utils.flop_counter import FlopCounterMode

        self.registry = FlopCounterMode(display=False).flop_registry

    # module calls
    def pre_hook(self, module: nn.Module, _args: Any) -> None:
        name = self.names.get(id(module))
        if name is None:
            self.stack.append(self.stack[-1])
            return
        k = self.calls.get(name, 0)
        self.calls[name] = k + 1
        key = f"{name}@{k}" if k and name else name
        self.stack.append(key)
        self.entered.append(key)

    def where(self) -> tuple[str, int]:
        """The running module call and how many calls had begun: places ops of composite modules."""
        return self.stack[-1], len(self.entered)

    def post_hook(self, module: nn.Module, _args: Any, _out: Any) -> None:
        if len(self.stack) > 1:
            self.stack.pop()

    # autograd nodes created by each torch-level call
    def note_outputs(self, out: Any) -> None:
        best = -1
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                best = max(best, t.grad_fn._sequence_nr())
        if best < 0:
            return
        if self.seq_hi and best <= self.seq_hi[-1]:
            return
        self.seq_hi.append(best)
        self.seq_call.append(self.where())

    def call_of_backward(self) -> tuple[str, int]:
        node = torch._C._current_autograd_node()
        if node is None:
            return "", -1
        seq = node._sequence_nr()
        i = bisect.bisect_left(self.seq_hi, seq)
        return self.seq_call[i] if i < len(self.seq_call) else ("", -1)

    def add_flops(self, func: Any, out: Any, args: Any, kwargs: Any) -> None:
        packet = func._overloadpacket
        if packet not in self.registry:
            return
        flops = float(self.registry[packet](*args, **kwargs, out_val=out))
        if not flops:
            return
        if self.phase == "fwd":
            key = self.where()
            self.costs.fwd[key] = self.costs.fwd.get(key, 0.0) + flops
        else:
            key = self.call_of_backward()
            self.costs.bwd[key] = self.costs.bwd.get(key, 0.0) + flops

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if base.is_leaf and base.requires_grad:  # a parameter (or its view)
            return t
        if id(base) not in self.saved_seen:
            self.saved_seen.add(id(base))
            self.keepalive.append(base)
            key = self.where()
            n = float(base.numel())
            self.costs.act[key] = self.costs.act.get(key, 0.0) + n
            if base.dtype in (torch.bool, torch.uint8):
                self.costs.act_mask[key] = self.costs.act_mask.get(key, 0.0) + n
        return t


class _FnMode(TorchFunctionMode):
    """Notes which module call created the autograd nodes of each torch-level call's outputs."""

    def __init__(self, rec: _Recorder):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.rec.phase == "fwd":
            self.rec.note_outputs(out)
        return out


class _FlopMode(TorchDispatchMode):
    """FlopCounterMode's dispatch logic (same registry, same decompositions), attributing per module call."""

    def __init__(self, rec: _Recorder):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _skip_ops():
            return NotImplemented
        if func not in self.rec.registry and func is not torch.ops.prim.device.default:
            with self:
                r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
        out = func(*args, **kwargs)
        self.rec.add_flops(func, out, args, kwargs)
        return out


def measure_costs(module: nn.Module, spec: ModelSpec, inputs: dict[str, Any]) -> Costs:
    """FLOPs and saved elements per module call of one forward and backward of `module` on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    rec = _Recorder(module)
    h1 = nn.modules.module.register_module_forward_pre_hook(rec.pre_hook)
    h2 = nn.modules.module.register_module_forward_hook(rec.post_hook, always_call=True)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            fake_inputs = {k: (torch.empty_like(v) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
            args, kwargs = module_args(spec, fake_inputs)
            with _FlopMode(rec):
                with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t), _FnMode(rec):
                    loss = output_loss(module(*args, **kwargs))
                h1.remove()
                h2.remove()
                rec.phase = "bwd"
                loss.backward()
    finally:
        h1.remove()
        h2.remove()
    for p in module.parameters():
        p.grad = None
    rec.costs.entered = rec.entered
    return rec.costs
