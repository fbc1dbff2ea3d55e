"""Named plan search spaces (each framework's own, and YAML under `presets/`) and their narrowing by a spec's `search:`
section.

A space lists the values each plan field may take; `auto` means "every value the workload
allows" (divisors of the GPU count for dp/tp/pp, of the per-rank batch for mbs, of the
layers per stage for v). A spec narrows a space, never widens it, so a named space stays an
upper bound on what a search may try:

    search:
      space: megatron-3d      # the base space (default: the framework's own; `scaledl plan --space` wins)
      tp: 8                   # fix a field (a scalar or a list)
      max_pp: 16              # cap a degree
      recompute: [none, selective]   # forbid full recomputation
      recompute_layers: [0, 1]       # full recomputation of every layer, or of one layer per model chunk

The default space is the spec's framework's own (`Framework.space`, declared in its module: what it runs, expert
parallelism for a mixture of experts); a space's `<axis>_from_tokens` (`cp_from_tokens`: an axis opened for long
sequences, `Axis.from_tokens`) adds every degree of it for sequences at least that long, so a space is read for a
workload (`for_workload`) before it is narrowed.
"""

from __future__ import annotations

import difflib
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, create_model,
                      field_validator)

from predictor.frameworks import FRAMEWORKS
from predictor.plan import AXES, AXIS_NAMES
from predictor.plan import PLACEMENTS, RECOMPUTE_MODES, PlanError, canonical_recompute, overlap_kinds
from predictor.plan.axes import OPTIONS
from predictor.plan.placement import DEFAULT_PLACEMENT
from predictor.spec.resolver import resolve
from predictor.spec.workload import SpecError, WorkloadSpec

PRESET_DIR = Path(__file__).parent / "presets"

Auto = Literal["auto"]
# One value list per registered parallel axis (predictor.plan.axes), then the options.
INT_AXES: tuple[str, ...] = (*AXIS_NAMES, "mbs", "v", "recompute_layers")
CHOICE_AXES: tuple[str, ...] = ("zero", "recompute", "sp", "schedule", "placement", "overlap", *OPTIONS)
CAPS: tuple[str, ...] = tuple(f"max_{a}" for a in INT_AXES)


class _Axes(BaseModel):
    """Fields shared by a space and a narrowing: the value lists of every plan field, and caps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _scalar_to_list(cls, value: Any, info: Any) -> Any:
        # `tp: 8` in a spec means `tp: [8]`; `auto` and caps stay scalars.
        if info.field_name in INT_AXES + CHOICE_AXES and not isinstance(value, (list, tuple)) and value != "auto":
            return [value]
        return value

    @field_validator("placement", check_fields=False)
    @classmethod
    def _known_placements(cls, value: Any) -> Any:
        for p in value or ():
            if p not in PLACEMENTS:
                raise ValueError(f"unknown placement {p!r}; known: {', '.join(PLACEMENTS)}")
        return value

    @field_validator("recompute", check_fields=False)
    @classmethod
    def _known_recomputes(cls, value: Any) -> Any:
        try:
            return None if value is None else [canonical_recompute(str(r).lower()) for r in value]
        except PlanError as err:
            raise ValueError(str(err)) from None

    @field_validator("overlap", check_fields=False)
    @classmethod
    def _known_overlaps(cls, value: Any) -> Any:
        for o in value or ():
            try:
                overlap_kinds(o)
            except PlanError as err:
                raise ValueError(str(err)) from None
        return value


def from_tokens(axis: str) -> str:
    """The space field that gives the sequence length from which `axis` (`Axis.from_tokens`) tries every degree."""
    return f"{axis}_from_tokens"


def _axis_fields(optional: bool) -> dict[str, Any]:
    """Each registered axis's value list and cap (a space's default is the axis's `space_default`), a space's
    sequence length from which an axis opened for long sequences tries every degree (`Axis.from_tokens`), and each
    axis option's value list."""
    out: dict[str, Any] = {}
    for axis in AXES:
        if optional:
            out[axis.name] = (list[PositiveInt] | None, None)
        elif axis.space_default == "auto":
            out[axis.name] = (Auto | list[PositiveInt], "auto")
        else:
            values = list(axis.space_default)
            out[axis.name] = (Auto | list[PositiveInt], Field(default_factory=lambda values=values: list(values)))
        out[f"max_{axis.name}"] = (PositiveInt | None, None)
        if axis.from_tokens and not optional:
            out[from_tokens(axis.name)] = (PositiveInt | None, None)
    for option, values in OPTIONS.items():  # each axis option's value list: a space's default is its default
        choices = list[Literal[values]]  # type: ignore[valid-type]
        out[option] = (choices | None, None) if optional else (choices, Field(default_factory=lambda v=values: [v[0]]))
    return out


class _SpaceOptions(_Axes):
    description: str = ""
    mbs: Auto | list[PositiveInt] = Field(default_factory=lambda: [1, 2, 4, 8])
    v: Auto | list[PositiveInt] = "auto"
    zero: list[Literal[0, 1, 2, 3]] = Field(default_factory=lambda: [0])
    recompute: list[str] = Field(default_factory=lambda: list(RECOMPUTE_MODES))
    # With recompute=full, the layers of each model chunk recomputed (Megatron-Core's --recompute-method block
    # --recompute-num-layers N, torchtitan's every-k-th-block checkpointing); 0: every layer. `auto`: 0 and each power
    # of two that divides a chunk's blocks and is fewer (`search_spaces.enumerate.recompute_counts`).
    recompute_layers: Auto | list[NonNegativeInt] = Field(default_factory=lambda: [0])
    sp: list[bool] = Field(default_factory=lambda: [False, True])
    schedule: list[Literal["gpipe", "1f1b", "interleaved"]] = Field(default_factory=lambda: ["1f1b"])
    placement: list[str] = Field(default_factory=lambda: [DEFAULT_PLACEMENT])
    overlap: list[str] = Field(default_factory=lambda: ["auto"])
    allow_cross_node_tp: bool = False
    max_mbs: PositiveInt | None = 64
    max_v: PositiveInt | None = 8
    max_recompute_layers: PositiveInt | None = None


class _NarrowingOptions(_Axes):
    space: str | None = None
    mbs: list[PositiveInt] | None = None
    v: list[PositiveInt] | None = None
    zero: list[Literal[0, 1, 2, 3]] | None = None
    recompute: list[str] | None = None
    recompute_layers: list[NonNegativeInt] | None = None
    sp: list[bool] | None = None
    schedule: list[Literal["gpipe", "1f1b", "interleaved"]] | None = None
    placement: list[str] | None = None
    overlap: list[str] | None = None
    allow_cross_node_tp: bool | None = None
    max_mbs: PositiveInt | None = None
    max_v: PositiveInt | None = None
    max_recompute_layers: PositiveInt | None = None


SpaceConfig = create_model("SpaceConfig", __base__=_SpaceOptions, __doc__="A named search space: what values each "
                           "plan field may take (one list per registered axis, then the options).",
                           **_axis_fields(optional=False))
Narrowing = create_model("Narrowing", __base__=_NarrowingOptions, __doc__="A spec's `search:` section: every field "
                         "optional; given fields must lie inside the base space.", **_axis_fields(optional=True))


def _errors(err: ValidationError, where: str, known: list[str]) -> str:
    """Pydantic's errors as `where.field: message` lines; an unknown field gets the closest of `known`."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(e["loc"][-1]), known, n=1)
            msg = "unknown field" + (f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}")
        given = e.get("input")
        shown = "" if isinstance(given, dict) or given is None else f" (got {given!r})"
        lines.append(f"{where}.{loc}: {msg}{shown}")
    return "\n  ".join(lines)


def preset_names() -> list[str]:
    """Every space a name picks: each registered framework's own, and the YAML presets."""
    return sorted({*FRAMEWORKS, *(p.stem for p in PRESET_DIR.glob("*.yaml"))})


def load_space(name_or_path: str) -> SpaceConfig:
    """A named space (a framework's own, `Framework.space`: `megatron`, `torchtitan`, `deepspeed`, `pytorch`; or a
    preset: `megatron-3d`, `zero-dp`, `full`) or a YAML file path; SpecError if unknown or invalid."""
    framework = FRAMEWORKS.get(name_or_path)
    if framework is not None:  # read now: a framework registered after import has its space too
        return _validated(framework.space, f"{framework.title}'s space (predictor.frameworks.{framework.name})")
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise SpecError(f"unknown search space {name_or_path!r}; known spaces: {', '.join(preset_names())}")
    return _space_file(path)


@cache
def _space_file(path: Path) -> SpaceConfig:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise SpecError(f"cannot read search space {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: YAML syntax error: {err}") from None
    return _validated(data, str(path))


def _validated(data: Any, where: str) -> SpaceConfig:
    try:
        return SpaceConfig.model_validate(data)
    except ValidationError as err:
        raise SpecError(f"invalid search space {where}:\n  {_errors(err, 'space', list(SpaceConfig.model_fields))}") from None


def narrow(space: SpaceConfig, section: dict[str, Any] | None, base_name: str = "") -> SpaceConfig:
    """Apply a spec's `search:` section to `space`; SpecError naming the field when it would widen it."""
    if not section:
        return space
    try:
        n = Narrowing.model_validate(section)
    except ValidationError as err:
        raise SpecError(f"invalid search section:\n  {_errors(err, 'search', list(Narrowing.model_fields))}") from None
    changes: dict[str, Any] = {}
    for axis in INT_AXES + CHOICE_AXES:
        wanted = getattr(n, axis)
        if wanted is None:
            continue
        allowed = getattr(space, axis)
        outside = [w for w in wanted if allowed != "auto" and w not in allowed]
        if outside:
            raise SpecError(
                f"search.{axis}: {outside} is outside the space {base_name or 'given'} (allowed: {allowed}); "
                f"pick values from that list or a wider space (--space full)"
            )
        changes[axis] = list(dict.fromkeys(wanted))
    for cap in CAPS:
        wanted = getattr(n, cap)
        if wanted is not None:
            current = getattr(space, cap)
            changes[cap] = wanted if current is None else min(wanted, current)
    if n.allow_cross_node_tp is not None:
        if n.allow_cross_node_tp and not space.allow_cross_node_tp:
            raise SpecError(f"search.allow_cross_node_tp: the space {base_name or 'given'} keeps tp inside a node; "
                            "use --space full to allow cross-node tensor parallelism")
        changes["allow_cross_node_tp"] = n.allow_cross_node_tp
    return space.model_copy(update=changes)


def default_space_name(spec: WorkloadSpec) -> str:
    """The space a search of `spec` uses unless told otherwise: its framework's own (`Framework.space`)."""
    return resolve(spec).framework.name


def for_workload(space: SpaceConfig, spec: WorkloadSpec) -> SpaceConfig:
    """`space` as it reads for `spec`: every degree of an axis opened for long sequences (`Axis.from_tokens`) when its
    sequences reach the space's `<axis>_from_tokens`."""
    opened = {a.name: "auto" for a in AXES if a.from_tokens and getattr(space, a.name) != "auto"
              and getattr(space, from_tokens(a.name)) is not None
              and spec.model.tokens >= getattr(space, from_tokens(a.name))}
    return space.model_copy(update=opened) if opened else space


def resolve_space(spec: WorkloadSpec, cli_space: str | None = None) -> tuple[str, SpaceConfig]:
    """The space a search of `spec` uses: `--space`, else `search.space`, else its framework's own; read for the
    workload, then narrowed by the spec's `search:` section."""
    section = dict(spec.search or {})
    name = cli_space or section.get("space") or default_space_name(spec)
    section.pop("space", None)
    return name, narrow(for_workload(load_space(name), spec), section, name)
