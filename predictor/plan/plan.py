"""The parallel plan: how one training iteration is split over the GPUs.

A `Plan` is a value (frozen, hashable) with a canonical string form used on the
command line, in reports and in datasets:

    dp=16,tp=8,pp=8,mbs=1,zero=1,recompute=full,sp=true,schedule=interleaved,v=3,placement=tp-dp-pp

Parsing and the value's own checks are here; validity against a workload is `predictor.plan.rules`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache, cached_property
from math import prod
from typing import Any, Callable, Literal

from predictor.plan.axes import AXES, AXIS, AXIS_NAMES, DEFAULT_ORDER, OPTIONS, OVERLAP_KINDS, PIPELINE_AXIS, REPLICA_AXIS
from predictor.plan.placement import DEFAULT_PLACEMENT, complete_order, placement_error, placements

Schedule = Literal["gpipe", "1f1b", "interleaved"]

RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
# Megatron-Core's recompute modules (`--recompute-modules`, megatron/core/transformer/transformer_config.py): a plan's
# `recompute` may name several joined by '+'; `selective` is Megatron's name for core_attn alone.
RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj")
# Megatron-Core's fine-grained activation offloading modules (transformer_config.py `offload_modules`): a plan's
# `offload` may name several joined by '+', or whole layers as layers:N (`--cpu-offloading-num-layers`).
OFFLOAD_MODULES: tuple[str, ...] = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1",
                                    "moe_act")
# Adam's moments: fp32, or bf16 (Megatron-Core's precision-aware optimizer, --exp-avg-dtype/--exp-avg-sq-dtype bf16).
MOMENTS: tuple[str, ...] = ("fp32", "bf16")
# Gradients accumulated and reduced in fp32 main-grad buffers (Megatron-LM's default under --bf16) or in bf16
# (--grad-reduce-in-bf16; Megatron-Bridge's recipes: grad_reduce_in_fp32 = False).
GRADS: tuple[str, ...] = ("fp32", "bf16")
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved")
# Rank orders of the axes every plan string names (the later axes go to their default position).
PLACEMENTS: tuple[str, ...] = placements()
# Axes whose degrees multiply into the GPU count.
GPU_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.multiplies_gpus)


@cache
def recompute_modules(value: str) -> frozenset[str]:
    """The Megatron-Core modules a `recompute` value recomputes (none: empty; full: {'full'}; selective: core_attn)."""
    if value in ("none", "full"):
        return frozenset() if value == "none" else frozenset({"full"})
    names = value.split("+") if value != "selective" else ["core_attn"]
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown or not all(names) or len(set(names)) != len(names):
        raise PlanError(f"plan field 'recompute' must be none, selective, full, or module names joined by '+' from "
                        f"{', '.join(RECOMPUTE_MODULES)} (e.g. recompute=layernorm+moe_act); got {value!r}")
    return frozenset(names)


def canonical_recompute(value: str) -> str:
    """One spelling per set of modules: registry order, and core_attn alone as `selective`."""
    modules = recompute_modules(value)
    if value in RECOMPUTE_MODES:
        return value
    if modules == {"core_attn"}:
        return "selective"
    return "+".join(m for m in RECOMPUTE_MODULES if m in modules)


@cache
def offloaded(value: str) -> tuple[frozenset[str], int]:
    """The activation offloading an `offload` value names: (modules, whole layers per pipeline rank)."""
    if value == "none":
        return frozenset(), 0
    if value.startswith("layers:"):
        count = value.partition(":")[2]
        if count.isascii() and count.isdigit() and int(count) > 0:
            return frozenset(), int(count)
    else:
        names = value.split("+")
        if all(n in OFFLOAD_MODULES for n in names) and len(set(names)) == len(names):
            return frozenset(names), 0
    raise PlanError(f"plan field 'offload' must be none, layers:N (N > 0 whole layers) or module names joined by '+' "
                    f"from {', '.join(OFFLOAD_MODULES)} (e.g. offload=core_attn+moe_act); got {value!r}")


def canonical_offload(value: str) -> str:
    """One spelling per set of offloaded modules: registry order."""
    modules, _ = offloaded(value)
    return "+".join(m for m in OFFLOAD_MODULES if m in modules) if modules else value


# Plan fields that count something (degrees, micro-batch, virtual stages): positive integers.
_COUNTS: tuple[str, ...] = (*AXIS_NAMES, "mbs", "v")
# Largest degree or micro-batch a plan may name: a million GPUs, far beyond any cluster, small enough that
# rank groups and schedules stay cheap to build.
MAX_DEGREE = 2**20


class PlanError(ValueError):
    """A plan string or plan value that cannot be used; the message says which field and why."""


def _parse_int(key: str, raw: str) -> int:
    # ASCII digits only: int() would also take '1_000' and other scripts' digits
    if not (raw.isascii() and raw.lstrip("-").isdigit()):
        raise PlanError(f"plan field {key!r} must be an integer, got {raw!r}")
    return int(raw)


def _parse_bool(key: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise PlanError(f"plan field {key!r} must be true or false, got {raw!r}")


def _parse_text(key: str, raw: str) -> str:
    return raw.lower()


def _parse_fraction(key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise PlanError(f"plan field {key!r} must be a fraction between 0 and 1, got {raw!r}") from None
    return value


# How each non-degree field is read from a plan string.
_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "mbs": _parse_int, "zero": _parse_int, "v": _parse_int, "sp": _parse_bool,
    "recompute": _parse_text, "schedule": _parse_text, "placement": _parse_text, "overlap": _parse_text,
    "recompute_layers": _parse_int, "offload": _parse_text,
    "optimizer_offload": _parse_fraction, "moments": _parse_text, "grads": _parse_text,
    **{option: _parse_text for option in OPTIONS},
}
# Fields every plan string writes; the others (added with later axes and options) only when they differ
# from their defaults, so a plan that could be written before keeps its string and its dataset ids.
ALWAYS_WRITTEN: tuple[str, ...] = (*(a.name for a in AXES if a.first_format), "mbs", "zero", "recompute", "sp",
                                   "schedule", "v", "placement")


@cache
def overlap_kinds(value: str) -> frozenset[str] | None:
    """The kinds of communication an `overlap` value switches on; None for 'auto' (the framework's default)."""
    if value == "auto":
        return None
    if value == "none":
        return frozenset()
    kinds = value.split("+")
    unknown = [k for k in kinds if k not in OVERLAP_KINDS]
    if unknown or not all(kinds):
        raise PlanError(f"plan field 'overlap' must be auto, none or kinds joined by '+' from "
                        f"{', '.join(OVERLAP_KINDS)} (e.g. overlap=dp+param); got {value!r}")
    return frozenset(kinds)


def _axis_fields() -> list[tuple[str, str | None, str, object]]:
    """(name, the field it follows, type, default) of each registered axis's degree and options."""
    out: list[tuple[str, str | None, str, object]] = []
    for axis in AXES:
        out.append((axis.name, axis.written_after, "int", 1))
        after = axis.options_after or axis.name
        for option, values in axis.options.items():
            out.append((option, after, "str", values[0]))
            after = option
    return out


def _with_axes(cls: type) -> type:
    """`cls` with an int field per registered axis and a str field per axis option, each after the field its
    registry entry names (`written_after`, `options_after`): the field order is the string order, so plans written
    before an axis existed keep their strings."""
    own = cls.__dict__["__annotations__"]
    order, types, pending = list(own), dict(own), _axis_fields()
    while pending:
        placeable = [f for f in pending if f[1] in (None, "", *order)]
        if not placeable:
            raise AssertionError(f"axis fields placed after unknown plan fields: {[(f[0], f[1]) for f in pending]}")
        for name, after, kind, default in placeable:
            at = {None: len(order), "": 0}.get(after)
            order.insert(order.index(after) + 1 if at is None else at, name)
            types[name] = kind
            setattr(cls, name, default)
        pending = [f for f in pending if f not in placeable]
    cls.__annotations__ = {name: types[name] for name in order}
    return cls


@dataclass(frozen=True)
@_with_axes
class Plan:
    """One parallel configuration of a training iteration.

    Degrees and options: one int field (default 1) per axis of `predictor.plan.axes.AXES` and one str field per
    option of an axis (`Axis.options`: how the axis communicates, its first value the default), added by `_with_axes`
    at the place in the string form its entry names (an axis's meaning and its options' are its registry entry).
    mbs: micro-batch size per data-parallel rank; the number of micro-batches per
         iteration is derived from the workload's global batch (`microbatches`).
    zero: ZeRO stage 0-3 (3 is FSDP full shard; 1 is Megatron's distributed optimizer).
    recompute: activation recomputation: none, selective (attention core), full, or Megatron-Core's recompute
         modules joined by '+' (core_attn, layernorm, mlp, moe, moe_act, shared_experts, mla_up_proj).
    recompute_layers: with recompute=full, the layers of each model chunk recomputed (Megatron-Core's
         --recompute-method block --recompute-num-layers N); 0 (the default): every layer.
    sp: Megatron sequence parallelism (only meaningful with tp > 1).
    schedule: pipeline schedule; v: virtual stages per pipeline rank (interleaved only).
    placement: rank order on the nodes, innermost axis first; axes it omits take their default place.
    overlap: communication hidden behind computation: auto (the framework's default), none, or
         kinds joined by '+' from `OVERLAP_KINDS` (each axis's entry names the kinds that hide its communication).
    offload: activations kept in host memory between forward and backward: none, layers:N (the first N layers
         of each pipeline rank, Megatron-Core's --cpu-offloading-num-layers) or fine-grained offloading modules
         joined by '+' (attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act).
    optimizer_offload: the fraction of the optimizer state (fp32 master and moments) kept and stepped on the host
         (Megatron-Core's --optimizer-cpu-offload --optimizer-offload-fraction; DeepSpeed's ZeRO-Offload: 1).
    moments: Adam's moments in fp32 or bf16 (the precision-aware optimizer).
    grads: the dtype gradients accumulate and reduce in: fp32 (main-grad buffers) or bf16.
    """

    mbs: int = 1
    zero: int = 0
    recompute: str = "none"
    sp: bool = False
    schedule: Schedule = "1f1b"
    v: int = 1
    placement: str = DEFAULT_PLACEMENT
    overlap: str = "auto"
    recompute_layers: int = 0
    offload: str = "none"
    optimizer_offload: float = 0.0
    moments: str = "fp32"
    grads: str = "fp32"

    def __post_init__(self) -> None:
        for name in _COUNTS:
            value = getattr(self, name)
            if type(value) is int and 0 < value <= MAX_DEGREE:  # the common case, checked fast
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlanError(f"plan field '{name}' must be a positive integer, got {value!r}")
            if value > MAX_DEGREE:
                raise PlanError(f"plan field '{name}' must be at most {MAX_DEGREE:,}, got {value:,}")
        if self.zero not in (0, 1, 2, 3):
            raise PlanError(f"plan field 'zero' must be 0, 1, 2 or 3, got {self.zero!r}")
        if not isinstance(self.recompute, str):
            raise PlanError(f"plan field 'recompute' must be a string, got {self.recompute!r}")
        if self.recompute not in RECOMPUTE_MODES:
            object.__setattr__(self, "recompute", canonical_recompute(self.recompute))
        if not isinstance(self.recompute_layers, int) or isinstance(self.recompute_layers, bool) or self.recompute_layers < 0:
            raise PlanError(f"plan field 'recompute_layers' must be a count >= 0, got {self.recompute_layers!r}")
        if self.recompute_layers and self.recompute != "full":
            raise PlanError(f"plan field 'recompute_layers' counts fully recomputed layers: it needs recompute=full, "
                            f"got recompute={self.recompute}")
        if self.schedule not in SCHEDULES:
            raise PlanError(f"plan field 'schedule' must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        error = placement_error(self.placement)
        if error:
            raise PlanError(error)
        if self.schedule != "interleaved" and self.v != 1:
            raise PlanError(f"plan field 'v' must be 1 unless schedule=interleaved, got v={self.v} with schedule={self.schedule}")
        if self.schedule == "interleaved" and getattr(self, PIPELINE_AXIS) == 1:
            raise PlanError(f"schedule=interleaved needs {PIPELINE_AXIS} > 1; use schedule=1f1b for {PIPELINE_AXIS}=1")
        kinds = overlap_kinds(self.overlap)
        if kinds:
            object.__setattr__(self, "overlap", "+".join(k for k in OVERLAP_KINDS if k in kinds))
        if not isinstance(self.offload, str):
            raise PlanError(f"plan field 'offload' must be a string, got {self.offload!r}")
        if self.offload != "none":
            object.__setattr__(self, "offload", canonical_offload(self.offload))
        fraction = self.optimizer_offload
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
            raise PlanError(f"plan field 'optimizer_offload' must be a fraction between 0 and 1, got {fraction!r}")
        object.__setattr__(self, "optimizer_offload", float(fraction))
        if self.moments not in MOMENTS:
            raise PlanError(f"plan field 'moments' must be one of {', '.join(MOMENTS)}, got {self.moments!r}")
        if self.grads not in GRADS:
            raise PlanError(f"plan field 'grads' must be one of {', '.join(GRADS)}, got {self.grads!r}")
        for option, values in OPTIONS.items():
            value = getattr(self, option)
            if value not in values:
                raise PlanError(f"plan field '{option}' must be one of {', '.join(values)}, got {value!r}")

    @classmethod
    def trusted(cls, values: dict[str, Any]) -> "Plan":
        """A plan of `values` (every field) without `__post_init__`'s checks, for the enumerator's millions of
        candidates: its values come from a validated `SpaceConfig` and its degrees, micro-batch and virtual
        stages from plans it built the checked way. Anything else builds plans with `Plan(...)`."""
        plan = object.__new__(cls)
        plan.__dict__.update(values)
        return plan

    @cached_property
    def gpus(self) -> int:
        return prod(getattr(self, name) for name in GPU_AXES)

    def degrees(self) -> dict[str, int]:
        """Each axis's degree, in registry order."""
        return {a.name: a.degree(self) for a in AXES}

    @property
    def kind(self) -> str:
        """What parallelism the plan runs (single, pp-<schedule>, the innermost other axis of the default rank
        order with a degree > 1 (tp, ...), fsdp, dp): design strata and error breakdowns group plans by it. A plan
        with several degrees is named by its pipeline, then by that axis."""
        if self.gpus == 1:
            return "single"
        if getattr(self, PIPELINE_AXIS) > 1:
            return f"{PIPELINE_AXIS}-{self.schedule}"
        inner = next((a for a in DEFAULT_ORDER if a not in (REPLICA_AXIS, PIPELINE_AXIS) and getattr(self, a) > 1), None)
        return inner or ("fsdp" if self.zero == 3 else REPLICA_AXIS)

    @property
    def rank_order(self) -> tuple[str, ...]:
        """Every axis, innermost first: the placement completed with the axes it leaves out."""
        return complete_order(self.placement)

    def stride(self, axis: str) -> int:
        """Distance in global rank between neighbours of one `axis` group (an axis of the rank order)."""
        order = self.rank_order
        stride = 1
        for inner in order[: order.index(axis)]:
            stride *= getattr(self, inner)
        return stride

    def group_span(self, axis: str) -> int:
        """How many consecutive global ranks one `axis` group covers; within a node iff <= gpus_per_node."""
        return self.stride(axis) * (getattr(self, axis) - 1) + 1

    def group_size(self, axis: str) -> int:
        """Ranks in one group of `axis`: its degree times those of the other axes its group spans (`Axis.group_with`)."""
        return prod(getattr(self, a) for a in AXIS[axis].group_axes)

    def group_ranks(self, axes: tuple[str, ...]) -> list[int]:
        """Global ranks of the group of `axes` (one axis, or several whose ranks form one group) holding rank 0."""
        ranks = [0]
        for axis in axes:
            step = self.stride(axis)
            ranks = [r + i * step for r in ranks for i in range(getattr(self, axis))]
        return sorted(ranks)

    def microbatches(self, global_batch: int) -> int:
        """Micro-batches per pipeline per iteration (gradient accumulation steps)."""
        return global_batch // (getattr(self, REPLICA_AXIS) * self.mbs)

    def __str__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ALWAYS_WRITTEN or value != f.default:
                parts.append(f"{f.name}={str(value).lower() if isinstance(value, bool) else value}")
        return ",".join(parts)

    @classmethod
    def parse(cls, text: str) -> "Plan":
        """Parse `dp=2,tp=4,...`; omitted fields take their defaults. Raises PlanError naming the bad field."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, object] = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = item.partition("=")
            key, raw = key.strip(), raw.strip()
            if not sep or not raw:
                raise PlanError(f"plan item {item!r} is not of the form key=value (in plan {text!r})")
            if key not in known:
                raise PlanError(f"unknown plan field {key!r} in {text!r}; known fields: {', '.join(known)} (an axis "
                                f"defined outside ScaleDL is a field once SCALEDL_AXES names it when the process "
                                f"starts: predictor.plan.axes)")
            if key in values:
                raise PlanError(f"plan field {key!r} given twice in {text!r}")
            values[key] = _PARSERS.get(key, _parse_int)(key, raw)
        if not values:
            raise PlanError(f"empty plan {text!r}; example: dp=8,tp=1,pp=1,mbs=1")
        return cls(**values)  # type: ignore[arg-type]

    def with_(self, **changes: object) -> "Plan":
        return replace(self, **changes)  # type: ignore[arg-type]


assert set(DEFAULT_ORDER) == set(GPU_AXES)
