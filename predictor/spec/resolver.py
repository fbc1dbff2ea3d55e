"""The one place a spec becomes what prices, launches and reports it: `resolve(spec)` gives a frozen `Resolved`.

Which device (catalogue figures, a measured profile, the cluster's link overrides), which generation, which
framework, which NVLink domain, which low-precision recipe and which kernels (attention backend, fusions): each was
decided where it was needed, at every floor, and each floor could decide differently. Here each is decided once; the pricing
(`predictor.models`), the launch files (`predictor.frameworks.launch`), the reports and validation read the value.

`predictor.spec.hardware` is a pure catalogue and `predictor.measure.device` measures this machine; resolving needs both,
the spec types and the framework registry, so this module lives above all of them and none of them imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from predictor.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, MEASURED_FRAMEWORK, Framework
from predictor.frameworks.base import EAGER_SOFTMAX, SoftmaxFallback
from predictor.frameworks.kernels import Kernels, kernel_errors, kernels_of
from predictor.spec.hardware import DEVICES, GB, GENERATIONS, Device, Link, Recipe, default_recipe, recipe_kernels
from predictor.spec.workload import LOW_PRECISIONS, ClusterSpec, SpecError, WorkloadSpec, registered


def get_device(name: str, cluster: ClusterSpec | None = None) -> Device:
    """The device `name` with the cluster's intra_node / inter_node link overrides applied.

    `cpu` is the cluster's `device_profile` where it names one (the machine a dataset was measured
    on), else this machine, measured on first use and cached (predictor.measure.device). A GPU with a
    `device_profile` (a kernel profile of the user's cluster) takes its measured links and launch and host costs.
    """
    if name not in DEVICES:
        raise KeyError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}")
    device = DEVICES[name]
    profile = getattr(cluster, "device_profile", None)
    if profile is not None:
        from predictor.measure.device import profile_device  # lazy: it imports torch, which pricing a GPU does without

        device = profile_device(profile, device)
    elif device is None:
        from predictor.measure.device import measured_cpu  # lazy: it imports torch, and measuring spawns processes

        device = measured_cpu()
    if cluster is not None:
        changes = {}
        for attr in ("intra_node", "inter_node"):
            spec = getattr(cluster, attr)
            if spec is not None:
                changes[attr] = Link(spec.bandwidth_gbps * GB, spec.latency_us * 1e-6, "cluster spec override")
        if "intra_node" in changes:
            changes["op_links"] = {}  # the spec's link replaces the measured per-op links inside the node too
        if changes:
            device = replace(device, **changes)
    return device


@dataclass(frozen=True, eq=False)
class Resolved:
    """A workload spec with everything that prices, launches and reports it decided once.

    spec: the spec resolved.
    framework: what trains it (`predictor.frameworks`): ScaleDL's runner on a measured device (a catalogue-less one
        such as `cpu`, whatever profile prices it), else `training.framework`, else Megatron-Core (a GPU priced with a
        kernel profile of its cluster runs the spec's framework).
    generation: the device's generation ('measured' for a device priced from its own measurements).
    nvlink_domain: GPUs one NVLink fabric joins (a node, or an NVL72 rack): where a group's collectives stay fast.
    recipe_name: the Transformer Engine recipe an FP8/FP4 run asks for (`training.recipe`, else the generation's
        default), as its launch file names it; None in FP32/FP16/BF16.
    recipe: the recipe whose kernels run and are priced (FP8 block scaling on Blackwell runs MXFP8's).
    kernels: the kernel settings it runs with (`training.kernels`, else the framework's defaults on the generation).
    attention_backend: the device facts' kernel its fused attention runs (None: unfused attention).
    softmax_fallback: where its unfused attention's softmax runs eager operators (None: never).
    profile: the device's kernel profile, where one is loaded (None: the catalogue and device facts price it).
    given_device: a device that prices the spec instead of its own (an evaluation on another device), else None.

    `device` is resolved on first use: a measured `cpu` is measured then (about 45 s the first time), which choosing
    the plans of a space never needs.
    """

    spec: WorkloadSpec
    framework: Framework
    generation: str
    nvlink_domain: int
    recipe_name: str | None
    recipe: Recipe | None
    kernels: Kernels
    attention_backend: str | None
    softmax_fallback: SoftmaxFallback | None
    profile: Any | None = None
    given_device: Device | None = None

    @cached_property
    def device(self) -> Device:
        """The priced device: the one given, else the spec's with its cluster's overrides and device profile."""
        return self.given_device or get_device(self.spec.cluster.device, self.spec.cluster)

    @property
    def fused_attention(self) -> bool:
        """Whether attention runs as one fused kernel (no s x s scores through memory)."""
        return self.kernels.fused_attention

    @property
    def measured(self) -> bool:
        """Whether the device is priced from its own measurements (a CPU, a device profile)."""
        return self.generation == "measured"


def framework_named(name: str | None, measured: bool) -> Framework:
    """The registered framework `name` (None: the default), refusing an unknown name with the closest one and a GPU
    framework on a measured device."""
    try:
        registered(name, FRAMEWORKS, "framework", "frameworks")
    except ValueError as err:
        raise SpecError(f"training.framework: {err} (got {name!r})") from None
    if measured:
        if name not in (None, MEASURED_FRAMEWORK):
            raise SpecError(f"training.framework {name!r} runs on GPUs; a measured device runs ScaleDL's own runner: "
                            f"use framework: {MEASURED_FRAMEWORK} or leave it out")
        return FRAMEWORKS[MEASURED_FRAMEWORK]
    return FRAMEWORKS[name or DEFAULT_FRAMEWORK]


def resolve(spec: WorkloadSpec, device: Device | None = None) -> Resolved:
    """`spec` resolved (`device`: one that prices it instead of its own; a measured one runs ScaleDL's runner).

    Raises SpecError naming `training.framework` when it is not registered (with the closest name) or is a GPU
    framework on a measured device, `training.framework_version` where the framework is not written for it, and
    `training.kernels` where the framework cannot run its settings, `training.optimizer` where it has no such
    optimizer."""
    cluster = spec.cluster
    measured = device.measured if device is not None else DEVICES.get(cluster.device) is None
    framework = framework_named(spec.training.framework, measured and device is None)
    if measured:  # a measured device given prices any spec with ScaleDL's runner
        framework = FRAMEWORKS[MEASURED_FRAMEWORK]
    name = device.name if device is not None else cluster.device
    generation = "measured" if measured else GENERATIONS.get(name, name)
    precision = spec.training.precision
    recipe_name = (spec.training.recipe or default_recipe(precision, generation)) if precision in LOW_PRECISIONS else None
    version = spec.training.framework_version
    if version is not None and version not in framework.versions:
        raise SpecError(f"training.framework_version {version!r}: {framework.title} is written for "
                        f"{', '.join(framework.versions) or 'no release (it writes no launch file)'}; use one of "
                        f"those or leave it out")
    errors = kernel_errors(spec, framework.kernels, framework.title)
    if spec.training.lora_rank and not framework.lora:
        errors.append(f"training.lora_rank: {framework.title}'s LoRA is not priced; LoRA is priced as Megatron-Bridge "
                      f"runs it on Megatron-Core (training.framework megatron)")
    if spec.training.optimizer not in framework.optimizers:
        errors.append(f"training.optimizer {spec.training.optimizer!r}: {framework.title} runs "
                      f"{', '.join(framework.optimizers)}; set training.framework to one that runs it (Muon: megatron)")
    if errors:
        raise SpecError("; ".join(errors))
    kernels = kernels_of(spec, framework.kernels, generation)
    fallback = framework.softmax_fallback if kernels.fused_softmax else EAGER_SOFTMAX
    return Resolved(spec=spec, framework=framework, generation=generation, nvlink_domain=cluster.nvlink_domain_gpus,
                    recipe_name=recipe_name, recipe=recipe_kernels(recipe_name, generation) if recipe_name else None,
                    kernels=kernels, attention_backend=kernels.attention_kernel, softmax_fallback=fallback,
                    given_device=device)
