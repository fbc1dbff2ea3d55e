"""The training domain of a learned predictor: which workloads and plans it has seen measured.

A learned correction extrapolates badly (the CPU checkpoint trained only on iterations below
3e9 FLOPs was 49 % off a decade above), so a prediction for a workload or plan outside the
training data should say so instead of looking as trustworthy as the checkpoint's held-out
error. The domain is the range of each size (hidden, blocks, tokens, vocabulary, batch, the
degrees and micro-batch) and the set of each setting (ZeRO stage, recomputation, schedule,
sequence parallelism, precision, device, model family, and for a measured device the hardware its
profile was taken on) over the training samples. The family matters: leaving one of the CPU
dataset's five architectures out costs ScaleDL 10.3 % MRE against 8.7 % in-domain, and leaving out
both vision models 15-20 % (bench/results/). So does the hardware: `cpu` is whatever machine runs
the prediction, and the CPU checkpoint (trained on an Intel Xeon's profile) priced eight plans on
an AMD EPYC, with that machine's profile, 21 % too slow (bench/results/validate_plans.txt).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from predictor.plan import Plan
from predictor.spec.hardware import Device
from predictor.spec.resolver import resolve
from predictor.spec.workload import WorkloadSpec

DEGREES = ("dp", "tp", "pp", "mbs")
SETTINGS = ("zero", "recompute", "schedule", "sp")
HARDWARE = "hardware"  # the setting naming a measured device's CPU model; `advice` looks for it
# A measured device's own figures, so that two machines that report one CPU model name (cloud VMs often
# say "Intel(R) Xeon(R) Processor") are still told apart; each counts as outside only beyond its
# tolerance (a factor) around the trained range. Another CPU model moved both by about 2x (Intel Xeon
# 196 GFLOP/s and 16 GB/s, AMD EPYC 105 and 32). Re-measuring the AMD machine a day later moved the
# matmul FLOP/s by under 0.5 %, the copy bandwidth by up to 20 % (25.7-28.4 against 32.0 GB/s).
FIGURES = {f"{HARDWARE} fp32 GFLOP/s": 1.25, f"{HARDWARE} memory GB/s": 1.5}


def _sizes(spec: WorkloadSpec) -> dict[str, float]:
    m = spec.model
    return {"hidden": m.hidden or 0, "blocks": m.num_blocks, "tokens": m.tokens, "vocab": m.vocab or 0,
            "global batch": spec.training.global_batch}


def _family(spec: WorkloadSpec) -> str:
    return spec.model.family or "custom"  # a model built from a module or an HF config of no known family


def _workload_settings(spec: WorkloadSpec) -> dict[str, str]:
    return {"precision": str(spec.training.precision), "device": str(spec.cluster.device), "family": _family(spec)}


def _hardware(device: Device) -> tuple[dict[str, float], dict[str, str]]:
    """(figures, name) of a measured device: its fp32 FLOP/s and bandwidth, and its CPU model (`cpu` is
    whatever machine runs it). A catalogue device has neither: its name says it all."""
    figures = dict(zip(FIGURES, (device.flops("fp32") / 1e9, device.mem_bandwidth / 1e9))) if device.measured else {}
    return figures, ({HARDWARE: device.model} if device.model else {})


def _plan_degrees(plan: Plan) -> dict[str, float]:
    return {d: getattr(plan, d) for d in DEGREES}


def _plan_settings(plan: Plan) -> dict[str, str]:
    return {s: str(getattr(plan, s)).lower() for s in SETTINGS}  # as plan strings write them (sp=false)


def advice(outside: Iterable[str]) -> str:
    """What to do about a prediction outside the training domain (`outside` as TrainingDomain lists it).
    On other hardware a minute of the machine's own runs fixes most of it: fine-tuned on 40 of them, the
    CPU checkpoint's error on an AMD EPYC fell from 26 to 9 % (bench/results/transfer.txt); `scaledl
    adapt` does it and `auto` then uses the result."""
    text = "expect larger errors than its measured accuracy"
    if any(w.startswith(HARDWARE) for w in outside):
        text += ("; run `scaledl adapt` (about two minutes) to fit the checkpoint to this hardware: it measures some "
                 "runs here and fine-tunes the checkpoint, and `--predictor auto` then uses the result")
    return text


@dataclass
class TrainingDomain:
    ranges: dict[str, list[float]] = field(default_factory=dict)  # name -> [min, max] over values > 0
    seen: dict[str, list[str]] = field(default_factory=dict)  # setting -> values seen
    # what `outside_plan` found, per plan fields: a search asks for many plans alike
    _outside_plans: dict[tuple, list[str]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, pairs: Iterable[tuple[WorkloadSpec, Plan]]) -> "TrainingDomain":
        """The domain of (spec, plan) training pairs."""
        domain = cls()
        for spec, plan in pairs:
            domain._add(spec, plan)
        return domain

    def merged(self, pairs: Iterable[tuple[WorkloadSpec, Plan]]) -> "TrainingDomain":
        """This domain grown by more training pairs (a fine-tuned checkpoint has seen both)."""
        out = TrainingDomain({k: list(v) for k, v in self.ranges.items()}, {k: list(v) for k, v in self.seen.items()})
        for spec, plan in pairs:
            out._add(spec, plan)
        return out

    def _add(self, spec: WorkloadSpec, plan: Plan) -> None:
        self._outside_plans.clear()  # the domain grows: what lay outside may not any more
        figures, cpu_model = _hardware(resolve(spec).device)
        numbers = {**_sizes(spec), **figures, **_plan_degrees(plan)}
        for name, value in numbers.items():
            if value > 0:
                lo, hi = self.ranges.get(name, [value, value])
                self.ranges[name] = [min(lo, value), max(hi, value)]
        labels = {**_workload_settings(spec), **cpu_model, **_plan_settings(plan)}
        for name, value in labels.items():
            if value not in self.seen.setdefault(name, []):
                self.seen[name].append(value)

    def outside_workload(self, spec: WorkloadSpec) -> list[str]:
        """What of the workload (not the plan) lies outside the domain, e.g. 'vocab 30522 (trained 4096)'."""
        return self._outside(_sizes(spec), _workload_settings(spec)) + self.outside_hardware(resolve(spec).device)

    def trained_family(self, spec: WorkloadSpec) -> bool:
        """Whether the workload's model family is among those trained on."""
        return _family(spec) in self.seen.get("family", [])

    def outside_hardware(self, device: Device) -> list[str]:
        """What of a device lies outside the domain: a measured one's figures or CPU model."""
        return self._outside(*_hardware(device))

    def outside_plan(self, plan: Plan) -> list[str]:
        """What of the plan lies outside the domain."""
        key = tuple(getattr(plan, f) for f in (*DEGREES, *SETTINGS))
        if key not in self._outside_plans:
            self._outside_plans[key] = self._outside(_plan_degrees(plan), _plan_settings(plan))
        return list(self._outside_plans[key])

    def _outside(self, numbers: dict[str, float], labels: dict[str, str]) -> list[str]:
        out = []
        for name, value in numbers.items():
            if name in self.ranges and value > 0:
                lo, hi = self.ranges[name]
                slack, fmt = (FIGURES[name], ".0f") if name in FIGURES else (1.0, "g")
                if not lo / slack <= value <= hi * slack:
                    trained = f"{lo:{fmt}}" if lo == hi else f"{lo:{fmt}}-{hi:{fmt}}"
                    out.append(f"{name} {value:{fmt}} (trained {trained})")
        for name, value in labels.items():
            if name in self.seen and value not in self.seen[name]:
                out.append(f"{name}={value} (trained {', '.join(sorted(self.seen[name]))})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"ranges": self.ranges, "seen": self.seen}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "TrainingDomain | None":
        return cls(data["ranges"], data["seen"]) if data else None
