"""What a training framework is to ScaleDL (`Framework`), and the pieces of launch files every framework shares.

A plan is only worth predicting if a framework can launch it as predicted. Each framework module
(`predictor.frameworks.megatron`, `torchtitan`, `deepspeed`, `pytorch`) builds one `Framework` from that framework's
own documentation and code: the plans it runs, the communication it overlaps, its attention kernel, the
calibrated constants of the analytical model, what it keeps in memory, and the launch file that runs a plan in it,
with the reader that parses the file back into the plan it runs (`as_run`).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from itertools import permutations
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from predictor.frameworks.kernels import KernelChoices, Kernels, kernels_of
from predictor.memory.facts import MemoryFacts
from predictor.plan import AXES, DEFAULT_ORDER, DISPATCHERS, OVERLAP_KINDS, RECOMPUTE_MODES, Plan, complete_order, overlap_kinds
from predictor.plan.axes import OPTION_AXIS, OPTIONS
from predictor.spec.hardware import GENERATIONS, default_recipe

if TYPE_CHECKING:  # pragma: no cover
    from predictor.spec.workload import WorkloadSpec

# Constants of the analytical model calibrated per framework on public measurements of it (bench/modern_eval.py
# --record writes Megatron-Core's, bench/vtrain_eval.py --record DeepSpeed's: chosen on the whole file, its
# cross-validated figure recorded beside them), one entry per framework: {"constants": {AnalyticalConfig field:
# value}, "generations": [...], "source": ...}, and under "by_device" the constants measured on one device alone
# ({device: {"constants": ..., "source": ...}}, e.g. bench/simumax_time.py --record); a framework absent keeps first
# principles.
CONSTANTS_FILE = Path(__file__).resolve().parent.parent / "checkpoints" / "framework-constants.json"
# Recorded constants that scale the device facts rather than replace them (`AnalyticalConfig.compute_share`): a
# generation fitted with these alone still prices with its facts (`Framework.fitted_on`).
FACT_SCALES: frozenset[str] = frozenset({"compute_share"})


def recorded_constants(name: str) -> dict[str, dict[str, float]]:
    """The calibrated constants `CONSTANTS_FILE` holds for framework `name`, keyed by the device generations they were
    fitted on and by the devices with constants measured on them alone ({} where it holds none): a generation
    without a fit is priced from first principles, and a device's own constants price that device only
    (`predictor.models.roofline.framework_config`)."""
    if not CONSTANTS_FILE.is_file():
        return {}
    entry = json.loads(CONSTANTS_FILE.read_text()).get(name, {})
    return {**{generation: dict(entry["constants"]) for generation in entry.get("generations", ())},
            **{device: dict(own["constants"]) for device, own in entry.get("by_device", {}).items()}}


@dataclass(frozen=True)
class SoftmaxFallback:
    """An unfused attention's scale-mask-softmax where its fused kernel does not apply.

    `fused(batches, sq, sk)` says (elementwise over arrays) where the fused kernel runs, from the attention batches of
    one rank (micro-batch times heads per rank) and the query and key lengths; elsewhere the framework runs `ops` more
    eager operators per forward in its place, which make `passes` (forward, backward) more passes over the s x s
    scores than the fused kernel does, counted in the run's element size."""

    fused: Callable[[Any, Any, Any], Any]
    ops: int
    passes: tuple[float, float]


def _never_fused(batches: Any, sq: Any, sk: Any) -> Any:
    return sk < 0


# Megatron-LM's `FusedScaleMaskSoftmax` outside its CUDA kernel (megatron/model/fused_softmax.py, the code Megatron-Core
# and Megatron-DeepSpeed share), or everywhere with --no-masked-softmax-fusion: the eager path in fp32
# (apply_query_key_layer_scaling, on by default, sets attention_softmax_in_fp32 and a scale): input.float(), * scale,
# masked_fill_ (1-byte mask), softmax, .half(): five operators where the fused path runs one kernel. In 2-byte passes
# over the scores (a read or a write), forward 3 + 4 + 4.5 + 4 + 3 = 18.5 against the kernel's 2; backward (the five
# autograd nodes: to fp32, softmax backward reading the gradient and the output, masked fill, scale, to fp16)
# 3 + 6 + 4.5 + 4 + 3 = 20.5 against the kernel's 3.
EAGER_SOFTMAX = SoftmaxFallback(_never_fused, ops=4, passes=(16.5, 17.5))


class LaunchError(ValueError):
    """A plan its framework cannot run; the message names each field and why."""


def _no_model_errors(spec: "WorkloadSpec") -> list[str]:
    return []


def _no_kernel_settings(text: str) -> dict[str, Any]:
    return {}


class LaunchTarget(Protocol):
    """What a launch writer reads of a resolved spec (`predictor.spec.resolver.Resolved` is one, decided once for the
    pricing and the launch file alike): the spec, its device's generation, the low-precision recipe it asks for and its kernel settings."""

    @property
    def spec(self) -> "WorkloadSpec": ...

    @property
    def generation(self) -> str: ...

    @property
    def recipe_name(self) -> str | None: ...

    @property
    def kernels(self) -> Kernels: ...


@dataclass(frozen=True)
class Launch:
    """A framework's launch file: `write(plan, target)` gives {file name: text} for a plan from `as_run` and a
    resolved spec, the first file being the one `read(text, spec)` parses back into that plan; `model_errors(spec)`
    says what of the model its training script cannot build (a plan the framework runs is still refused a launch file
    that would train another model); `read_kernels(text)` gives the kernel settings (`predictor.frameworks.kernels`)
    the file sets; `architectures`: the transformers model types of `hf_config:` specs no family names that it
    spells all the same (Megatron-LM's hybrid Mamba stacks)."""

    file: str
    write: Callable[[Plan, LaunchTarget], dict[str, str]]
    read: Callable[[str, "WorkloadSpec"], Plan]
    model_errors: Callable[["WorkloadSpec"], list[str]] = _no_model_errors
    read_kernels: Callable[[str], dict[str, Any]] = _no_kernel_settings
    architectures: frozenset[str] = frozenset()


# Memory levers beyond recomputation: each plan field, the value that pulls none, and what pulling it means.
LEVERS: dict[str, tuple[Any, str]] = {
    "offload": ("none", "offload activations to the host"),
    "optimizer_offload": (0.0, "step the optimizer on the host"),
    "moments": ("fp32", "keep Adam's moments in BF16"),
    "grads": ("fp32", "reduce gradients in BF16"),
}


@dataclass(frozen=True)
class Framework:
    """One training framework: the plans it runs, what it overlaps, its constants, memory and launch file.

    - `rules`: why a plan is outside it (every reason, as `plan_errors` does);
    - `default_overlap`: the communication its performance recipes hide behind computation;
    - `overlappable`: what it can overlap at all (a plan's `overlap` may switch kinds off, or on where the framework
      offers them; the rules refuse a switch the framework does not have);
    - `attention_kernel` names its default attention kernel, as a prediction's extra does beside the seconds it
      takes (`extra['framework_s']['attention']`); `kernels` holds its kernel settings' defaults (the attention
      backend per device generation among them) and which its launch file can set (`predictor.frameworks.kernels`);
    - `constants`: the analytical model's constants calibrated on measurements of it, by device generation and by
      device (`recorded_constants`);
    - `memory`: what it keeps on a GPU (`predictor.memory.accounting` prices a rank with them);
    - `space`: its own search space, what a search of a spec it trains tries unless told otherwise: the fields of a
      `search_spaces.SpaceConfig` (which reads it under the framework's name), as data;
    - `axes`: the parallel axes (`predictor.plan.axes`) it runs, each with the flag or key its launch file sets the
      degree with ('' where the file sets none: Megatron derives the data-parallel size from the world size); a
      plan with an axis it does not declare at a degree above 1 is refused (`axis_errors`), and a search leaves the
      axis at 1;
    - `launch`: its launch file, None where ScaleDL writes none (its own runner runs plans itself).
    """

    name: str
    title: str
    rules: Callable[[Plan, "WorkloadSpec"], list[str]]
    default_overlap: Callable[[Plan], frozenset[str]]
    overlappable: frozenset[str]
    attention_kernel: str
    precisions: tuple[str, ...]
    memory: MemoryFacts
    space: Mapping[str, Any]
    axes: Mapping[str, str]
    constants: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    launch: Launch | None = None
    # Values of plan options it never runs, whatever the other fields ('orders': rank orders, innermost first):
    # the search leaves them out before generating plans; `rules` refuses them too.
    never: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    # Why it never runs an axis option's values (`option_errors`' words, by option).
    never_why: Mapping[str, str] = field(default_factory=dict)
    # Whether it recomputes named modules and a count of full layers (Megatron-Core's --recompute-modules and
    # --recompute-method block --recompute-num-layers); the others recompute none, selective or full only.
    recompute_modules: bool = False
    # Whether it recomputes some layers only under recompute=full (`recompute_layers`; torchtitan checkpoints every
    # N-th block, its rules say which counts that spells); Megatron-Core's is part of `recompute_modules`.
    recomputes_some_layers: bool = False
    # The memory levers of LEVERS it pulls (its rules may narrow their values).
    levers: frozenset[str] = frozenset()
    # Where its unfused attention's softmax falls back to eager operators (None: its fused kernel always runs).
    softmax_fallback: SoftmaxFallback | None = None
    # Its kernel settings' defaults and what its launch file can set (`predictor.frameworks.kernels`).
    kernels: KernelChoices = field(default_factory=lambda: KernelChoices(Kernels()))
    # The releases its launch files are written for, newest (the default, checked against) first; a spec's
    # training.framework_version picks an older one, which its rules follow. Empty where it writes none.
    versions: tuple[str, ...] = ()
    # Whether it compiles a plan's blocks and loss when the spec's training.compile leaves it unset (None: it runs
    # eager and cannot compile).
    compiles_by_default: Callable[[Plan, "WorkloadSpec"], bool] | None = None
    # The optimizers (`training.optimizer`) it runs.
    optimizers: tuple[str, ...] = ("adam", "sgd")
    # Whether ScaleDL prices LoRA fine-tuning (`training.lora_rank`, `predictor.costs.lora`) as it runs it.
    lora: bool = False
    # Per kind of hidden communication (`HIDDEN_KINDS`), the share of a plan's overlapped traffic that nothing hides,
    # where its own overlap decides it (a kind not here: `predictor.models.overlap.EDGE_SHARE` of its axis's window,
    # e.g. Transformer Engine's pipelined reduce-scatter for tensor parallelism's).
    exposed_shares: Mapping[str, Callable[[Plan], float]] = field(default_factory=dict)

    @property
    def version(self) -> str:
        """The release its launch files are written for by default (and checked against)."""
        return self.versions[0] if self.versions else ""

    def version_of(self, spec: "WorkloadSpec") -> str:
        """The release `spec` runs: its training.framework_version, else the newest."""
        return spec.training.framework_version or self.version

    def compiled(self, plan: Plan, spec: "WorkloadSpec") -> bool:
        """Whether the run compiles its blocks and loss: the spec's training.compile, else the framework's choice."""
        if self.compiles_by_default is None:
            return False
        wanted = spec.training.compile
        return self.compiles_by_default(plan, spec) if wanted is None else wanted

    def fitted_on(self, generation: str, device: str) -> bool:
        """Whether constants were fitted on the device generation or on the device itself: they then override the
        device facts (a constant fitted on one generation never prices another); FACT_SCALES scale them instead."""
        return any(set(self.constants.get(key, {})) - FACT_SCALES for key in (generation, device))

    def runs_value(self, option: str, value: Any) -> bool:
        """False when the framework never runs `option`=`value` (a placement: its completed rank order)."""
        if option == "placement":
            return complete_order(value) not in self.never.get("orders", ())
        if option == "recompute" and not self.recompute_modules and value not in RECOMPUTE_MODES:
            return False
        return value not in self.never.get(option, ())

    def lever_errors(self, plan: Plan) -> list[str]:
        """Why the framework cannot pull the plan's memory levers (a search's space leaves such values out before
        enumerating: `runs_value`)."""
        errors = []
        if not self.recompute_modules:
            if not self.runs_value("recompute", plan.recompute):
                errors.append(f"{self.title} recomputes none, selective or full, not the modules {plan.recompute} "
                              f"(Megatron-Core's --recompute-modules)")
            if plan.recompute_layers and not self.recomputes_some_layers:
                errors.append(f"{self.title} recomputes every layer under recompute=full: use recompute_layers=0")
        for name, (none, words) in LEVERS.items():
            if name not in self.levers and getattr(plan, name) != none:
                errors.append(f"{self.title} does not {words} ({name}={getattr(plan, name)}): use {name}={none}")
        return errors

    def axis_errors(self, plan: Plan) -> list[str]:
        """Why the framework cannot run the plan's parallel axes: each axis above degree 1 it does not declare."""
        return [f"{self.title} has no {axis.title}ism ({axis.name}={axis.degree(plan)}): it runs "
                f"{', '.join(self.axes)}; use {axis.name}=1" for axis in AXES
                if axis.name not in self.axes and axis.degree(plan) > 1]

    def errors(self, plan: Plan, spec: "WorkloadSpec") -> list[str]:
        """Every reason this framework cannot run `plan` for `spec` (empty: it can)."""
        errors = [*self.axis_errors(plan), *(f"{self.title} {e}" for e in self.rules(plan, spec))]
        precision = spec.training.precision
        if spec.training.compile and self.compiles_by_default is None:
            errors.append(f"{self.title} does not compile its model (training.compile=true): remove training.compile "
                          f"or use a framework that compiles (torchtitan)")
        if precision not in self.precisions:
            errors.append(f"{self.title} does not train in {precision} (it trains in {', '.join(self.precisions)})")
        errors += self.option_errors(plan)
        wanted = overlap_kinds(plan.overlap)
        if wanted is not None and wanted - self.overlappable:
            errors.append(f"{self.title} cannot overlap {'+'.join(sorted(wanted - self.overlappable))} communication "
                          f"(it overlaps {', '.join(sorted(self.overlappable)) or 'nothing'})")
        return errors

    def option_errors(self, plan: Plan) -> list[str]:
        """Why it cannot run the plan's axis options (`never`, with its reason in `never_why`): read only where the
        option's axis has a degree above 1, and a search's space drops these values before enumerating
        (`search_spaces.enumerate.runnable_space`), so the enumerator may check one plan of those differing in them."""
        errors = []
        for option, axis in OPTION_AXIS.items():
            if getattr(plan, axis) > 1 and option in self.never and getattr(plan, option) in self.never[option]:
                runs = ", ".join(v for v in OPTIONS[option] if v not in self.never[option])
                errors.append(f"{self.title} {self.never_why.get(option, 'does not run it')} ({option}="
                              f"{getattr(plan, option)}): use {option}={runs}")
        return errors

    def overlap(self, plan: Plan) -> frozenset[str]:
        """The kinds of communication the plan hides: its `overlap` field, or the framework's default."""
        wanted = overlap_kinds(plan.overlap)
        return (self.default_overlap(plan) if wanted is None else wanted) & self.overlappable


def other_orders(runs: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], ...]:
    """The rank orders (innermost first) a framework whose process groups build only `runs` never runs."""
    return tuple(o for o in permutations(DEFAULT_ORDER) if o not in runs)


def overlap_value(kinds: set[str] | frozenset[str]) -> str:
    """A plan's `overlap` naming exactly these kinds."""
    return "+".join(k for k in OVERLAP_KINDS if k in kinds) or "none"


def as_run(plan: Plan, framework: Framework, spec: "WorkloadSpec | None" = None) -> Plan:
    """The plan as `framework` runs it, which is what its launch file reads back as.

    overlap: the kinds it hides among the communication the plan has (gradients and parameters over dp·cp
    ranks, tp, pp), less what only Transformer Engine overlaps where the spec runs without it; cp_comm, dispatcher
    and schedule at their defaults where cp, ep or pp is 1; placement as the rank order.
    """
    exchanged: set[str] = set()
    if plan.group_size("dp") > 1:
        exchanged |= {"dp", "param"} if plan.zero >= 1 else {"dp"}
    exchanged |= {kind for kind in ("tp", "pp", "ep") if getattr(plan, kind) > 1}
    if plan.ep > 1:  # the experts' weight gradients delayed beside the expert all-to-all
        exchanged.add("wgrad")
    kinds = framework.overlap(plan) & exchanged
    if spec is not None and not kernels_of(spec, framework.kernels, "").transformer_engine:
        kinds -= framework.kernels.te_overlap
    return plan.with_(overlap=overlap_value(kinds),
                      placement="-".join(plan.rank_order), cp_comm=plan.cp_comm if plan.cp > 1 else "ring",
                      dispatcher=plan.dispatcher if plan.ep > 1 else DISPATCHERS[0],
                      schedule=plan.schedule if plan.pp > 1 else "1f1b")


def hidden(plan: Plan) -> frozenset[str]:
    """The overlapped kinds of a plan from `as_run` (its overlap is never 'auto')."""
    return overlap_kinds(plan.overlap) or frozenset()


def spec_recipe(spec: "WorkloadSpec") -> str | None:
    """The low-precision recipe the spec trains with: training.recipe, else the device's default (None in BF16/FP32)."""
    t = spec.training
    if t.precision not in ("fp8", "fp4"):
        return None
    gen = GENERATIONS.get(spec.cluster.device)
    return t.recipe or (default_recipe(t.precision, gen) if gen else None)


def inverse(mapping: dict[Any, Any]) -> dict[Any, Any]:
    return {v: k for k, v in mapping.items()}


def degree_args(plan: Plan, flags: Mapping[str, str]) -> list[str]:
    """The degree flags of every axis a framework's command line names (`flags`: its `Framework.axes`), in registry
    order."""
    return [token for axis in AXES if flags.get(axis.name)
            for token in (flags[axis.name], str(axis.degree(plan)))]


def read_degrees(value: Callable[[str], Any], flags: Mapping[str, str], spec: "WorkloadSpec") -> dict[str, int]:
    """Each axis's degree from the keys a framework names (`flags`: its `Framework.axes`); where it names no
    data-parallel degree, dp is what the others leave of the world size (as Megatron derives data_parallel_size)."""
    degrees = {a.name: int(value(flags[a.name])) if flags.get(a.name) else 1 for a in AXES}
    if not flags.get("dp"):
        degrees["dp"] = spec.cluster.gpus // math.prod(degrees[a.name] for a in AXES
                                                       if a.multiplies_gpus and a.name != "dp")
    return degrees


def args_text(args: list[str]) -> str:
    """A command line one option (a flag and its values) a line, each token shell-quoted."""
    lines: list[list[str]] = []
    for token in args:
        if token.startswith("--") or not lines:
            lines.append([])
        lines[-1].append(shlex.quote(token))
    return "\n".join(" ".join(line) for line in lines) + "\n"


def parse_args(tokens: list[str]) -> dict[str, list[str]]:
    """{flag: its values} of a command line (a flag without values maps to [])."""
    parsed: dict[str, list[str]] = {}
    values: list[str] = []
    for token in tokens:
        if token.startswith("--"):
            values = parsed.setdefault(token, [])
        else:
            values.append(token)
    return parsed
