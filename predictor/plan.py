"""The parallel plan: how one training iteration is split over the GPUs.

A `Plan` is a value (frozen, hashable) with a canonical string form used on the
command line, in reports and in datasets:

    dp=16,tp=8,pp=8,mbs=1,zero=1,recompute=full,sp=true,schedule=interleaved,v=3,placement=tp-dp-pp

Structural validity against a workload (degrees multiply to the GPU count,
divisibility of heads/hidden/layers/batch, tensor parallel inside a node) is
checked by `plan_errors`, which returns every reason a plan is rejected so that
callers (the CLI, the search space) can explain themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # pragma: no cover - import only for type checkers
    from predictor.workload import WorkloadSpec

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["gpipe", "1f1b", "interleaved"]

RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved")
# Rank orders: the first axis is innermost, i.e. its ranks are adjacent GPUs of a node.
PLACEMENTS: tuple[str, ...] = ("tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp")


class PlanError(ValueError):
    """A plan string or plan value that cannot be used; the message says which field and why."""


@dataclass(frozen=True)
class Plan:
    """One parallel configuration of a training iteration.

    dp, tp, pp: data, tensor and pipeline parallel degrees.
    mbs: micro-batch size per data-parallel rank; the number of micro-batches per
         iteration is derived from the workload's global batch (`microbatches`).
    zero: ZeRO stage 0-3 (3 is FSDP full shard).
    recompute: activation recomputation: none, selective (attention core) or full.
    sp: Megatron sequence parallelism (only meaningful with tp > 1).
    schedule: pipeline schedule; v: virtual stages per pipeline rank (interleaved only).
    placement: rank order on the nodes, innermost axis first.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    mbs: int = 1
    zero: int = 0
    recompute: Recompute = "none"
    sp: bool = False
    schedule: Schedule = "1f1b"
    v: int = 1
    placement: str = "tp-dp-pp"

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "mbs", "v"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlanError(f"plan field '{name}' must be a positive integer, got {value!r}")
        if self.zero not in (0, 1, 2, 3):
            raise PlanError(f"plan field 'zero' must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE_MODES:
            raise PlanError(f"plan field 'recompute' must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}")
        if self.schedule not in SCHEDULES:
            raise PlanError(f"plan field 'schedule' must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.placement not in PLACEMENTS:
            raise PlanError(f"plan field 'placement' must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.schedule != "interleaved" and self.v != 1:
            raise PlanError(f"plan field 'v' must be 1 unless schedule=interleaved, got v={self.v} with schedule={self.schedule}")
        if self.schedule == "interleaved" and self.pp == 1:
            raise PlanError("schedule=interleaved needs pp > 1; use schedule=1f1b for pp=1")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def kind(self) -> str:
        """What parallelism the plan runs (single, tp, pp-<schedule>, fsdp, dp): design strata and error
        breakdowns group plans by it. A plan with several degrees is named by its pipeline, then its tp."""
        if self.gpus == 1:
            return "single"
        if self.pp > 1:
            return f"pp-{self.schedule}"
        if self.tp > 1:
            return "tp"
        return "fsdp" if self.zero == 3 else "dp"

    def stride(self, axis: str) -> int:
        """Distance in global rank between neighbours of one `axis` group ('dp', 'tp' or 'pp')."""
        order = self.placement.split("-")
        stride = 1
        for inner in order[: order.index(axis)]:
            stride *= getattr(self, inner)
        return stride

    def group_span(self, axis: str) -> int:
        """How many consecutive global ranks one `axis` group covers; within a node iff <= gpus_per_node."""
        return self.stride(axis) * (getattr(self, axis) - 1) + 1

    def microbatches(self, global_batch: int) -> int:
        """Micro-batches per pipeline per iteration (gradient accumulation steps)."""
        return global_batch // (self.dp * self.mbs)

    def __str__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
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
                raise PlanError(f"unknown plan field {key!r} in {text!r}; known fields: {', '.join(known)}")
            if key in values:
                raise PlanError(f"plan field {key!r} given twice in {text!r}")
            values[key] = _parse_value(key, raw)
        if not values:
            raise PlanError(f"empty plan {text!r}; example: dp=8,tp=1,pp=1,mbs=1")
        return cls(**values)  # type: ignore[arg-type]

    def with_(self, **changes: object) -> "Plan":
        return replace(self, **changes)  # type: ignore[arg-type]


def _parse_value(key: str, raw: str) -> object:
    if key in ("dp", "tp", "pp", "mbs", "zero", "v"):
        try:
            return int(raw)
        except ValueError:
            raise PlanError(f"plan field {key!r} must be an integer, got {raw!r}") from None
    if key == "sp":
        lowered = raw.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise PlanError(f"plan field 'sp' must be true or false, got {raw!r}")
    return raw.lower()


def plan_errors(plan: Plan, spec: "WorkloadSpec", allow_cross_node_tp: bool = False) -> list[str]:
    """Every reason `plan` cannot run `spec`; an empty list means structurally valid.

    Memory capacity is not checked here: that needs a prediction (see the search space).
    """
    m = spec.model
    c = spec.cluster
    gb = spec.training.global_batch
    errors: list[str] = []
    if plan.gpus != c.gpus:
        errors.append(f"dp*tp*pp = {plan.dp}*{plan.tp}*{plan.pp} = {plan.gpus} but the cluster has {c.gpus} GPUs")
    if m.heads % plan.tp:
        errors.append(f"tp={plan.tp} does not divide heads={m.heads}")
    if m.kv_heads is not None and m.kv_heads % plan.tp:
        errors.append(f"tp={plan.tp} does not divide kv_heads={m.kv_heads}")
    if m.hidden % plan.tp:
        errors.append(f"tp={plan.tp} does not divide hidden={m.hidden}")
    if m.ffn_hidden_size % plan.tp:
        errors.append(f"tp={plan.tp} does not divide ffn_hidden={m.ffn_hidden_size}")
    if m.num_blocks % (plan.pp * plan.v):
        errors.append(f"pp*v = {plan.pp}*{plan.v} does not divide the {m.num_blocks} transformer layers")
    if gb % (plan.dp * plan.mbs):
        errors.append(f"dp*mbs = {plan.dp}*{plan.mbs} does not divide global_batch={gb}")
    elif plan.schedule == "interleaved" and plan.microbatches(gb) % plan.pp:
        errors.append(f"interleaved schedule needs micro-batches ({plan.microbatches(gb)}) to be a multiple of pp={plan.pp}")
    if plan.sp and plan.tp == 1:
        errors.append("sp=true needs tp > 1 (sequence parallelism splits along the tensor-parallel group)")
    if plan.zero > 0 and plan.dp == 1:
        errors.append(f"zero={plan.zero} shards over data parallel ranks but dp=1; use zero=0")
    if not allow_cross_node_tp and plan.tp > 1 and plan.group_span("tp") > c.gpus_per_node:
        errors.append(
            f"tp={plan.tp} with placement={plan.placement} spans {plan.group_span('tp')} consecutive GPUs, more than a node's "
            f"{c.gpus_per_node}; put tp innermost (placement=tp-...) with tp <= gpus_per_node, or allow cross-node tp"
        )
    return errors
