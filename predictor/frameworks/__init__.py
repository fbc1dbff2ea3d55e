"""Training frameworks, one module each (megatron, torchtitan, deepspeed, pytorch), and which one a spec trains with.

Each module builds a `Framework` (`predictor.frameworks.base`) from that framework's own documentation and code: the
plans it runs, its default overlap, its attention kernel, its calibrated constants, its memory accounting, its own
search space and its launch file. `FRAMEWORKS` registers them, and everything that names a framework reads it when it
asks (the spec's choices, `search_spaces`' spaces, the CLI's help, the launch readers), so a framework is its module
and its entry here. `framework_for` is the one place that decides which framework prices and launches a workload;
`launch_files` / `read_back` write a plan's launch file and parse one back into the plan it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from predictor.frameworks.base import Framework, LaunchError, as_run
from predictor.frameworks.deepspeed import DEEPSPEED
from predictor.frameworks.megatron import MEGATRON
from predictor.frameworks.pytorch import PYTORCH
from predictor.frameworks.torchtitan import TORCHTITAN
from predictor.hardware import DEVICES
from predictor.plan import Plan, plan_errors, recompute_errors

if TYPE_CHECKING:  # pragma: no cover
    from predictor.hardware import Device
    from predictor.workload import WorkloadSpec

FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (MEGATRON, TORCHTITAN, DEEPSPEED, PYTORCH)}
# What a spec that names no framework trains with on a catalogue GPU.
DEFAULT_FRAMEWORK = MEGATRON.name
# Measured devices (a CPU) cannot run Megatron-Core: they run ScaleDL's own runner, whatever the spec names.
MEASURED_FRAMEWORK = PYTORCH.name


def framework_for(spec: "WorkloadSpec", device: "Device | None" = None) -> Framework:
    """The framework that trains `spec`: ScaleDL's runner on a measured device (`device` where given, else the spec's:
    a catalogue-less device such as `cpu`, whatever profile prices it), else `training.framework`, else Megatron-Core.
    A GPU priced with a kernel profile of its cluster runs the spec's framework."""
    measured = device.measured if device is not None else DEVICES.get(spec.cluster.device) is None
    if measured:
        return FRAMEWORKS[MEASURED_FRAMEWORK]
    return FRAMEWORKS[spec.training.framework or DEFAULT_FRAMEWORK]


def run_errors(plan: Plan, spec: "WorkloadSpec", allow_cross_node_tp: bool = False) -> list[str]:
    """Every reason the spec's framework cannot run `plan`: the structural rules, the framework's and its levers'."""
    framework = framework_for(spec)
    return (plan_errors(plan, spec, allow_cross_node_tp) + framework.errors(plan, spec) + framework.lever_errors(plan)
            + recompute_errors(plan, spec))


def launch_files(plan: Plan, spec: "WorkloadSpec", checked: bool = False) -> dict[str, str]:
    """{file name: text}: the spec's framework's launch file for `plan` (and Megatron's torchrun.sh). `checked`: the
    plan passed `run_errors` already (a search's plans: enumeration validated them), so only what launching adds
    (a launch file at all, a model its training script builds) is checked.

    Raises LaunchError naming every field the framework cannot run.
    """
    framework = framework_for(spec)
    errors = [] if checked else run_errors(plan, spec, allow_cross_node_tp=True)
    if framework.launch is None:
        errors.append(f"{framework.title} has no launch file: `scaledl plan --validate` runs plans in it")
    else:
        errors += framework.launch.model_errors(spec)
    if spec.model.module is not None:
        errors.append(f"model.module {spec.model.module!r} is a PyTorch module: only ScaleDL's runner launches it")
    if spec.model.any_architecture:
        errors.append(f"model.hf_config of model_type {spec.model.hf_config.get('model_type')!r}: no family record "
                      f"(predictor.families) says how {framework.title}'s launch file spells it")
    if errors:
        raise LaunchError(f"{framework.title} cannot run {plan}: " + "; ".join(errors))
    assert framework.launch is not None
    return framework.launch.write(as_run(plan, framework, spec), spec)


def launch_settings(plan: Plan, spec: "WorkloadSpec", checked: bool = False) -> dict[str, Any]:
    """The report's launch section: {plan, framework, files, notes}; a refusal is a note and no files (`checked`: as
    `launch_files`)."""
    try:
        files, notes = launch_files(plan, spec, checked), []
    except LaunchError as err:
        files, notes = {}, [str(err)]
    return {"plan": str(plan), "framework": framework_for(spec).name, "files": files, "notes": notes}


def _reader(path: Path) -> Framework:
    """The framework whose launch file `path` is (by its name)."""
    readers = {f.launch.file: f for f in FRAMEWORKS.values() if f.launch is not None}
    if path.name not in readers:
        raise LaunchError(f"{path} is not a launch file ({', '.join(readers)})")
    return readers[path.name]


def kernels_back(path: str | Path) -> dict[str, Any]:
    """The kernel settings (`training.kernels` fields) a launch file written by `launch_files` runs with."""
    path = Path(path)
    launch = _reader(path).launch
    assert launch is not None
    return launch.read_kernels(path.read_text())


def read_back(path: str | Path, spec: "WorkloadSpec") -> Plan:
    """The plan a launch file written by `launch_files` runs (as `as_run` gives it): the inverse of the writer.

    The file is recognised by its name; the data-parallel degree Megatron and DeepSpeed derive from the
    world size comes from the spec's cluster.
    """
    path = Path(path)
    framework = _reader(path)
    assert framework.launch is not None
    return as_run(framework.launch.read(path.read_text(), spec), framework, spec)
