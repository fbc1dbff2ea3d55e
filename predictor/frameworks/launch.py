"""A plan in the framework a resolved spec trains with: every reason it cannot run, its launch file, and the plan a
launch file runs.

The framework, the device generation and the low-precision recipe come from the resolved spec
(`predictor.spec.resolver.Resolved`), the same value the pricing reads, so the plan launched is the plan predicted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from predictor.frameworks import FRAMEWORKS, Framework, LaunchError, as_run
from predictor.plan import Plan, plan_errors, recompute_errors
from predictor.spec.resolver import Resolved
from predictor.spec.workload import WorkloadSpec


def run_errors(plan: Plan, resolved: Resolved, allow_cross_node_tp: bool = False) -> list[str]:
    """Every reason the spec's framework cannot run `plan`: the structural rules, the framework's and its levers'."""
    spec, framework = resolved.spec, resolved.framework
    return (plan_errors(plan, spec, allow_cross_node_tp) + framework.errors(plan, spec) + framework.lever_errors(plan)
            + recompute_errors(plan, spec))


def launch_files(plan: Plan, resolved: Resolved, checked: bool = False) -> dict[str, str]:
    """{file name: text}: the spec's framework's launch file for `plan` (and Megatron's torchrun.sh). `checked`: the
    plan passed `run_errors` already (a search's plans: enumeration validated them), so only what launching adds
    (a launch file at all, a model its training script builds) is checked.

    Raises LaunchError naming every field the framework cannot run.
    """
    spec, framework = resolved.spec, resolved.framework
    errors = [] if checked else run_errors(plan, resolved, allow_cross_node_tp=True)
    if framework.launch is None:
        errors.append(f"{framework.title} has no launch file: `scaledl plan --validate` runs plans in it")
    else:
        errors += framework.launch.model_errors(spec)
    if spec.training.document_tokens is not None:
        errors.append(f"training.document_tokens: {framework.title}'s launch file as ScaleDL writes it does not pack "
                      f"documents; Megatron-Bridge's packed-sequence fine-tuning (packed_sequence_specs, THD "
                      f"cu_seqlens) runs them")
    if spec.model.module is not None:
        errors.append(f"model.module {spec.model.module!r} is a PyTorch module: only ScaleDL's runner launches it")
    spelled = framework.launch is not None and spec.model.hf_config is not None and \
        spec.model.hf_config.get("model_type") in framework.launch.architectures
    if spec.model.any_architecture and not spelled:
        errors.append(f"model.hf_config of model_type {spec.model.hf_config.get('model_type')!r}: no family record "
                      f"(predictor.spec.families) says how {framework.title}'s launch file spells it")
    if errors:
        raise LaunchError(f"{framework.title} cannot run {plan}: " + "; ".join(errors))
    assert framework.launch is not None
    return framework.launch.write(as_run(plan, framework, spec), resolved)


def launch_settings(plan: Plan, resolved: Resolved, checked: bool = False) -> dict[str, Any]:
    """The report's launch section: {plan, framework, files, notes}; a refusal is a note and no files (`checked`: as
    `launch_files`)."""
    try:
        files, notes = launch_files(plan, resolved, checked), []
    except LaunchError as err:
        files, notes = {}, [str(err)]
    return {"plan": str(plan), "framework": resolved.framework.name, "files": files, "notes": notes}


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


def read_back(path: str | Path, spec: WorkloadSpec) -> Plan:
    """The plan a launch file written by `launch_files` runs (as `as_run` gives it): the inverse of the writer.

    The file is recognised by its name; the data-parallel degree Megatron and DeepSpeed derive from the
    world size comes from the spec's cluster.
    """
    path = Path(path)
    framework = _reader(path)
    assert framework.launch is not None
    return as_run(framework.launch.read(path.read_text(), spec), framework, spec)
