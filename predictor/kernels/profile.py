"""A device profile: the measured facts of the kernels a training step launches on one device, each section with its
source, read from one JSON file per device (predictor/data/profiles/<device>.json, or one `scaledl profile --device
cuda` measured). The cost functions (`predictor.kernels.gemm`, ...) read it; nothing here prices anything.

The file (every rate in FLOP/s or bytes/s, every size in elements or bytes, every time in seconds):

    {"device": "h100", "generation": "hopper",
     "sources": {"gemm.bf16": "where the figures come from", ...},       # one per section that holds data
     "gemm": {"bf16": {"points": [[batch, m, n, k, flop_per_s], ...]}, "fp8": {...}, "fp32": {...}},
     "grouped_gemm": {"bf16": {"points": [[groups, tokens_per_group, n, k, flop_per_s], ...]}},
     "attention": {"<backend>": {"fwd": [[seq, head_dim, flop_per_s], ...], "bwd": [...]}},
     "memory_bound": {"points": [[bytes, bytes_per_s], ...]},
     "launch_s": 4e-06, "host_op_s": 1e-05,
     "collectives": {"<link>": {"<op>": [[bytes, bus_bytes_per_s], ...]}},
     "missing": {"gemm.fp8": "why no figure exists"}}

Three additions to that schema, each because a published source gives no more than it holds:
- a precision's `gemm` entry may give `"best": flop_per_s` (a kernel's best published figure, no shapes) beside or
  instead of `points`;
- an attention backend may give `"fwd_causal"` and `"bwd_causal"` (the same rows under a causal mask; `fwd`/`bwd`
  are unmasked), and `"best_fwd": flop_per_s` where only a best forward figure is published;
- `memory_bound` may give `"datasheet_bytes_per_s"` when its points were measured on a board whose data-sheet
  bandwidth differs from the catalogue device's (the A800 PCIe figure of the A100 80GB profile).

Every section that holds data names its source under `sources` by its dotted key (`gemm.bf16`, `attention.cudnn`,
`memory_bound`, `launch_s`, `collectives.nvlink4`); every key of `missing` says why a section is absent. A file that
breaks these rules is refused with the field and the fix.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from predictor.spec.hardware import GENERATIONS

PROFILES_DIR = Path(__file__).resolve().parents[1] / "data" / "profiles"
GEMM_COLUMNS = ("batch", "m", "n", "k", "flop_per_s")
GROUPED_COLUMNS = ("groups", "tokens_per_group", "n", "k", "flop_per_s")
ATTENTION_COLUMNS = ("seq", "head_dim", "flop_per_s")
ATTENTION_PASSES = ("fwd", "bwd", "fwd_causal", "bwd_causal")
MEMORY_COLUMNS = ("bytes", "bytes_per_s")
COLLECTIVE_COLUMNS = ("bytes", "bus_bytes_per_s")


class ProfileError(ValueError):
    """A device profile file that breaks the format (the message names the field and the fix)."""


@dataclass(frozen=True)
class GemmTable:
    """One precision's GEMM throughput: `points` rows of (batch, m, n, k, FLOP/s) (or, grouped, of (groups,
    tokens per group, n, k, FLOP/s)), and a kernel's best published FLOP/s where only that exists."""

    points: np.ndarray
    best: float = 0.0


@dataclass(frozen=True)
class AttentionTable:
    """One attention backend's FLOP/s as FlashAttention's benchmark counts them: rows of (query length, head
    dimension, FLOP/s) per pass (`fwd`, `bwd`, and under a causal mask `fwd_causal`, `bwd_causal`), and the best
    forward figure where only that is published."""

    passes: Mapping[str, np.ndarray]
    best_fwd: float = 0.0


@dataclass(frozen=True)
class DeviceProfile:
    """The kernel facts of one device, each section with its source (`sources`) or the reason it is absent
    (`missing`)."""

    device: str
    generation: str
    sources: Mapping[str, str]
    gemm: Mapping[str, GemmTable] = field(default_factory=dict)
    grouped_gemm: Mapping[str, GemmTable] = field(default_factory=dict)
    attention: Mapping[str, AttentionTable] = field(default_factory=dict)
    memory_bound: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    datasheet_bytes_per_s: float = 0.0
    launch_s: float | None = None
    host_op_s: float | None = None
    collectives: Mapping[str, Mapping[str, np.ndarray]] = field(default_factory=dict)
    missing: Mapping[str, str] = field(default_factory=dict)

    def gemm_grid(self, precision: str) -> np.ndarray | None:
        """The (batch, m, n, k, FLOP/s) rows measured at `precision`, or None where the profile has none."""
        table = self.gemm.get(precision)
        return table.points if table is not None and len(table.points) else None


def _rows(value: Any, columns: tuple[str, ...], where: str) -> np.ndarray:
    """`value` as a float array of rows of `columns`, every entry finite and positive."""
    try:
        rows = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ProfileError(f"{where}: rows of numbers [{', '.join(columns)}] expected, got {value!r:.80}") from None
    if rows.size == 0:
        return rows.reshape(0, len(columns))
    if rows.ndim != 2 or rows.shape[1] != len(columns):
        raise ProfileError(f"{where}: each row is [{', '.join(columns)}] ({len(columns)} numbers); "
                           f"got shape {rows.shape}")
    if not np.all(np.isfinite(rows)) or (rows <= 0).any():
        raise ProfileError(f"{where}: every number must be finite and positive (sizes and rates)")
    return rows


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: an object expected, got {type(value).__name__}")
    return value


def _positive(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ProfileError(f"{where}: a positive number of seconds expected, got {value!r}")
    return float(value)


def _gemm_tables(value: Any, columns: tuple[str, ...], section: str) -> dict[str, GemmTable]:
    out = {}
    for precision, entry in _mapping(value, section).items():
        where = f"{section}.{precision}"
        entry = _mapping(entry, where)
        unknown = set(entry) - {"points", "best"}
        if unknown:
            raise ProfileError(f"{where}: unknown keys {sorted(unknown)}; allowed: points, best")
        best = _positive(entry.get("best"), f"{where}.best") or 0.0
        points = _rows(entry.get("points", []), columns, f"{where}.points")
        if not len(points) and not best:
            raise ProfileError(f"{where}: give points or best, or move it to 'missing' with the reason")
        out[precision] = GemmTable(points, best)
    return out


def _attention(value: Any) -> dict[str, AttentionTable]:
    out = {}
    for backend, entry in _mapping(value, "attention").items():
        where = f"attention.{backend}"
        entry = _mapping(entry, where)
        unknown = set(entry) - {*ATTENTION_PASSES, "best_fwd"}
        if unknown:
            raise ProfileError(f"{where}: unknown keys {sorted(unknown)}; allowed: {', '.join(ATTENTION_PASSES)}, "
                               f"best_fwd")
        passes = {p: _rows(entry[p], ATTENTION_COLUMNS, f"{where}.{p}") for p in ATTENTION_PASSES if p in entry}
        best = _positive(entry.get("best_fwd"), f"{where}.best_fwd") or 0.0
        if not any(len(r) for r in passes.values()) and not best:
            raise ProfileError(f"{where}: give fwd/bwd rows or best_fwd, or move it to 'missing' with the reason")
        out[backend] = AttentionTable(passes, best)
    return out


def _collectives(value: Any) -> dict[str, dict[str, np.ndarray]]:
    return {link: {op: _rows(rows, COLLECTIVE_COLUMNS, f"collectives.{link}.{op}")
                   for op, rows in _mapping(ops, f"collectives.{link}").items()}
            for link, ops in _mapping(value, "collectives").items()}


TOP_KEYS = ("device", "generation", "sources", "gemm", "grouped_gemm", "attention", "memory_bound", "launch_s",
            "host_op_s", "collectives", "missing")


def parse_profile(raw: Mapping[str, Any], where: str = "profile") -> DeviceProfile:
    """The profile a decoded JSON object describes; ProfileError (naming `where` and the field) if it breaks the
    format."""
    try:
        raw = _mapping(raw, "the file")
        unknown = set(raw) - set(TOP_KEYS)
        if unknown:
            raise ProfileError(f"unknown keys {sorted(unknown)}; allowed: {', '.join(TOP_KEYS)}")
        for key in ("device", "generation"):
            if not isinstance(raw.get(key), str) or not raw[key]:
                raise ProfileError(f"{key}: a non-empty string expected (e.g. 'h100', 'hopper')")
        memory = _mapping(raw.get("memory_bound", {}), "memory_bound")
        if set(memory) - {"points", "datasheet_bytes_per_s"}:
            raise ProfileError("memory_bound: allowed keys are points, datasheet_bytes_per_s")
        profile = DeviceProfile(
            device=raw["device"], generation=raw["generation"],
            sources={k: str(v) for k, v in _mapping(raw.get("sources", {}), "sources").items()},
            gemm=_gemm_tables(raw.get("gemm", {}), GEMM_COLUMNS, "gemm"),
            grouped_gemm=_gemm_tables(raw.get("grouped_gemm", {}), GROUPED_COLUMNS, "grouped_gemm"),
            attention=_attention(raw.get("attention", {})),
            memory_bound=_rows(memory.get("points", []), MEMORY_COLUMNS, "memory_bound.points"),
            datasheet_bytes_per_s=_positive(memory.get("datasheet_bytes_per_s"),
                                            "memory_bound.datasheet_bytes_per_s") or 0.0,
            launch_s=_positive(raw.get("launch_s"), "launch_s"), host_op_s=_positive(raw.get("host_op_s"), "host_op_s"),
            collectives=_collectives(raw.get("collectives", {})),
            missing={k: str(v) for k, v in _mapping(raw.get("missing", {}), "missing").items()})
        unsourced = sorted(set(data_sections(profile)) - set(profile.sources))
        if unsourced:
            raise ProfileError(f"sources: no source for {', '.join(unsourced)}; add one per section, e.g. "
                               f"\"{unsourced[0]}\": \"measured by scaledl profile on <host>, <date>\"")
    except ProfileError as e:
        raise ProfileError(f"{where}: {e}") from None
    return profile


def data_sections(profile: DeviceProfile) -> list[str]:
    """The dotted keys of the sections that hold data (each needs a source)."""
    keys = [f"gemm.{p}" for p in profile.gemm] + [f"grouped_gemm.{p}" for p in profile.grouped_gemm]
    keys += [f"attention.{b}" for b in profile.attention] + [f"collectives.{link}" for link in profile.collectives]
    keys += ["memory_bound"] * bool(len(profile.memory_bound))
    keys += [k for k in ("launch_s", "host_op_s") if getattr(profile, k) is not None]
    return keys


def read_profile(path: Path | str) -> DeviceProfile:
    """The profile stored at `path`."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such device profile file") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not JSON ({e})") from None
    return parse_profile(raw, str(path))


def profile_json(profile: DeviceProfile) -> dict[str, Any]:
    """The JSON object of `profile` (what `read_profile` reads back)."""
    def rows(a: np.ndarray) -> list[list[float]]:
        return [[int(x) if float(x).is_integer() else float(x) for x in row] for row in a]

    def gemm(tables: Mapping[str, GemmTable]) -> dict[str, Any]:
        return {p: {**({"points": rows(t.points)} if len(t.points) else {}), **({"best": t.best} if t.best else {})}
                for p, t in tables.items()}

    out: dict[str, Any] = {"device": profile.device, "generation": profile.generation, "sources": dict(profile.sources)}
    if profile.gemm:
        out["gemm"] = gemm(profile.gemm)
    if profile.grouped_gemm:
        out["grouped_gemm"] = gemm(profile.grouped_gemm)
    if profile.attention:
        out["attention"] = {b: {**{p: rows(r) for p, r in t.passes.items()},
                                **({"best_fwd": t.best_fwd} if t.best_fwd else {})}
                            for b, t in profile.attention.items()}
    if len(profile.memory_bound) or profile.datasheet_bytes_per_s:
        out["memory_bound"] = {"points": rows(profile.memory_bound),
                               **({"datasheet_bytes_per_s": profile.datasheet_bytes_per_s}
                                  if profile.datasheet_bytes_per_s else {})}
    out.update({k: getattr(profile, k) for k in ("launch_s", "host_op_s") if getattr(profile, k) is not None})
    if profile.collectives:
        out["collectives"] = {link: {op: rows(r) for op, r in ops.items()} for link, ops in profile.collectives.items()}
    if profile.missing:
        out["missing"] = dict(profile.missing)
    return out


def _dumps(value: Any) -> str:
    """JSON with one line per row of numbers (a profile holds hundreds of rows)."""
    text = json.dumps(value, indent=1, ensure_ascii=False)
    return re.sub(r"\[\s+([-+\d.eE,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)


def write_profile(profile: DeviceProfile, path: Path | str) -> None:
    """Store `profile` at `path` atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(_dumps(profile_json(profile)) + "\n")
    os.replace(tmp, path)


def generation_profiles(generation: str) -> list[DeviceProfile]:
    """The shipped profiles of a generation's catalogue devices, by device name."""
    return [p for name in sorted(GENERATIONS) if GENERATIONS[name] == generation
            for p in [shipped_profile(name)] if p is not None]


@cache
def shipped_profile(device: str) -> DeviceProfile | None:
    """The profile shipped for a catalogue device (predictor/data/profiles/<device>.json), None where none is."""
    path = PROFILES_DIR / f"{device}.json"
    return read_profile(path) if path.is_file() else None
