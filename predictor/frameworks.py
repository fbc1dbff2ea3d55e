"""Training frameworks: which plans each can run, and what it overlaps by default.

A plan is only worth predicting if a framework can launch it as predicted. Each `Framework`
states, from the framework's own documentation and code:
- `rules`: why a plan is outside it (every reason, as `plan_errors` does);
- `default_overlap`: the communication its performance recipes hide behind computation;
- `overlappable`: what it can overlap at all (a plan's `overlap` may switch kinds off, or on
  where the framework offers them; the rules refuse a switch the framework does not have);
- `fused_attention`: whether its attention is a fused (flash) kernel, which saves no s² scores
  and skips the masked half of causal attention.

Sources (`orchestrator.launch` writes each framework's launch file from the same sources):
- Megatron-Core: NVIDIA/Megatron-LM `megatron/training/arguments.py` (`validate_args`): DDP or the
  distributed optimizer (ZeRO-1); Megatron-FSDP (`--use-megatron-fsdp`, `--data-parallel-sharding-strategy
  optim_grads` / `optim_grads_params`: ZeRO-2/3) turns `overlap_grad_reduce` on (and `overlap_param_gather`
  for optim_grads_params) by itself, and its guide (`docs/user-guide/features/megatron_fsdp.md`,
  `custom_fsdp.md`: "compatible with TP, EP and CP"; issue #1455 asks for PP) runs it without pipelines;
  `--overlap-param-gather` needs the distributed optimizer or Megatron-FSDP and `--overlap-grad-reduce`;
  `--tp-comm-overlap` needs `--sequence-parallel`; 1F1B and interleaved pipelines (no GPipe), the
  interleaved one only with more than one virtual stage (`virtual_pipeline_model_parallel_size` 1 is
  None), its p2p overlapped by default (`--no-overlap-p2p-communication`) and without that overlap only
  for pp > 2, the non-interleaved one never overlapping p2p; CP; rank order tp-cp-ep-dp-pp or
  tp-cp-ep-pp-dp (`--use-tp-pp-dp-mapping`); EP (`--expert-model-parallel-size`, expert tensor parallelism 1,
  MoE beside TP only with sequence parallelism), its all-to-all overlapped by the combined 1F1B schedule
  (`--overlap-moe-expert-parallel-comm`, without a pipeline or interleaved), which Megatron-Core's MoE
  performance guide (`docs/.../moe` "General Setup") turns on. Megatron-Bridge recipes overlap grad reduce, param
  gather (with the distributed optimizer), TP (with SP) and the interleaved p2p; Transformer Engine's
  fused attention.
- torchtitan: pytorch/torchtitan `torchtitan/config/job_config.py` (`Parallelism`), `distributed/
  parallel_dims.py` (`fsdp_enabled = dp_shard_enabled or cp_enabled`: FSDP2 whenever cp > 1),
  `models/llama3/infra/parallelize.py` (`fsdp_reshard_after_forward` never = ZeRO-2, always = ZeRO-3,
  default = never with a pipeline; DDP replicate = ZeRO-0; no ZeRO-1), TP always with sequence-parallel
  norms, async TP (`enable_async_tensor_parallel`, off by default), `distributed/pipeline_parallel.py`
  (`torch.distributed.pipelining` GPipe, 1F1B, Interleaved1F1B; a multi-stage schedule needs >= 2 stages
  per rank), CP, float8 (torchao); mesh order pp-dp-cp-tp (tp innermost). FSDP2 prefetches all-gathers
  and overlaps reduce-scatters, DDP overlaps its bucketed all-reduce, neither can be switched off; SDPA
  flash attention.
- DeepSpeed: microsoft/DeepSpeed `deepspeed/runtime/zero/config.py` (`overlap_comm` defaults to stage == 3;
  "overlap the reduction of the gradients with backward": the ZeRO optimizers' switch, ZeRO-3's
  parameter prefetch on the same stream), `deepspeed/runtime/pipe/engine.py` ("ZeRO-2 and ZeRO-3 are
  incompatible with pipeline parallelism"; it schedules the gradient all-reduce after the pipeline
  flush), its 1F1B `TrainSchedule` only, `PipeModelDataParallelTopology` (pipe, data, model: tp-dp-pp);
  TP and SP through microsoft/Megatron-DeepSpeed, no CP, no FP8; Megatron-DeepSpeed's GPT uses unfused
  attention (as vTrain's measurements ran).
- pytorch: ScaleDL's own runner (`predictor.measure`), what `--validate`, `scaledl profile` and the
  shipped datasets measure: DDP, ZeroRedundancyOptimizer, FSDP, DTensor TP, pipelining; eager
  attention; the runner waits for each collective (nothing overlapped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import permutations
from typing import TYPE_CHECKING, Any, Callable, Mapping

from predictor.plan import DEFAULT_ORDER, complete_order
from predictor.hardware import DEVICES
from predictor.plan import OVERLAP_KINDS, RECOMPUTE_MODES, Plan, overlap_kinds

if TYPE_CHECKING:  # pragma: no cover
    from predictor.workload import WorkloadSpec

FRAMEWORK_NAMES: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed", "pytorch")
DEFAULT_FRAMEWORK = "megatron"
# Measured devices (a CPU) cannot run Megatron-Core: they run ScaleDL's own runner.
MEASURED_DEFAULT = "pytorch"


@dataclass(frozen=True)
class Framework:
    """One training framework's plan rules, default overlap and attention kernel."""

    name: str
    title: str
    rules: Callable[[Plan, "WorkloadSpec"], list[str]]
    default_overlap: Callable[[Plan], frozenset[str]]
    overlappable: frozenset[str]
    fused_attention: bool
    precisions: tuple[str, ...]
    # Values of plan options it never runs, whatever the other fields ('orders': rank orders, innermost first):
    # the search leaves them out before generating plans; `rules` refuses them too.
    never: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    # Whether it recomputes named modules and a count of full layers (Megatron-Core's --recompute-modules and
    # --recompute-method block --recompute-num-layers); the others recompute none, selective or full only.
    recompute_modules: bool = False

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
        if self.recompute_modules:
            return []
        errors = []
        if not self.runs_value("recompute", plan.recompute):
            errors.append(f"{self.title} recomputes none, selective or full, not the modules {plan.recompute} "
                          f"(Megatron-Core's --recompute-modules)")
        if plan.recompute_layers:
            errors.append(f"{self.title} recomputes every layer under recompute=full: use recompute_layers=0")
        return errors

    def errors(self, plan: Plan, spec: "WorkloadSpec") -> list[str]:
        """Every reason this framework cannot run `plan` for `spec` (empty: it can)."""
        errors = [f"{self.title} {e}" for e in self.rules(plan, spec)]
        precision = spec.training.precision
        if precision not in self.precisions:
            errors.append(f"{self.title} does not train in {precision} (it trains in {', '.join(self.precisions)})")
        wanted = overlap_kinds(plan.overlap)
        if wanted is not None and wanted - self.overlappable:
            errors.append(f"{self.title} cannot overlap {'+'.join(sorted(wanted - self.overlappable))} communication "
                          f"(it overlaps {', '.join(sorted(self.overlappable)) or 'nothing'})")
        return errors

    def overlap(self, plan: Plan) -> frozenset[str]:
        """The kinds of communication the plan hides: its `overlap` field, or the framework's default."""
        wanted = overlap_kinds(plan.overlap)
        return (self.default_overlap(plan) if wanted is None else wanted) & self.overlappable


# The rank orders (innermost first) each framework's process groups can build.
MEGATRON_ORDERS: tuple[tuple[str, ...], ...] = (("tp", "cp", "dp", "pp"), ("tp", "cp", "pp", "dp"))
TORCHTITAN_ORDERS: tuple[tuple[str, ...], ...] = (("tp", "cp", "dp", "pp"),)
DEEPSPEED_ORDERS = TORCHTITAN_ORDERS


def _other_orders(runs: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], ...]:
    return tuple(o for o in permutations(DEFAULT_ORDER) if o not in runs)


def _megatron_rules(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    errors = []
    if plan.schedule == "gpipe":
        errors.append("has no GPipe schedule (use schedule=1f1b or interleaved)")
    if plan.schedule == "interleaved" and plan.v == 1:
        errors.append("runs schedule=interleaved with v=1 as 1F1B (use v >= 2 or schedule=1f1b)")
    if plan.rank_order not in MEGATRON_ORDERS:
        errors.append(f"orders ranks tp-cp-dp-pp or tp-cp-pp-dp only, not {'-'.join(plan.rank_order)} "
                      f"(placement=tp-dp-pp or tp-pp-dp)")
    if spec.model.is_moe and plan.tp > 1 and not plan.sp:
        errors.append("runs a mixture of experts beside tensor parallelism only with sequence parallelism (sp=true)")
    if plan.zero >= 2 and plan.pp > 1:
        errors.append(f"runs zero={plan.zero} as Megatron-FSDP, which does not run beside pipeline parallelism "
                      f"(use zero=0 or 1 with pp > 1)")
    wanted = overlap_kinds(plan.overlap)
    if wanted is None:
        return errors
    if "tp" in wanted and plan.tp > 1 and not plan.sp:
        errors.append("overlaps tensor-parallel communication (--tp-comm-overlap) only with sp=true")
    if "param" in wanted and plan.zero >= 1 and "dp" not in wanted:
        errors.append("overlaps the parameter all-gather (--overlap-param-gather) only beside the gradient "
                      "reduction (overlap=dp+param)")
    if "ep" in wanted and plan.ep > 1 and plan.pp > 1 and plan.schedule != "interleaved":
        errors.append("overlaps the expert all-to-all (--overlap-moe-expert-parallel-comm) only without a pipeline "
                      "or in the interleaved schedule")
    if plan.pp > 1 and plan.schedule != "interleaved" and "pp" in wanted:
        errors.append(f"overlaps pipeline send/recv only in the interleaved schedule, not {plan.schedule}")
    if plan.schedule == "interleaved" and plan.pp <= 2 and "pp" not in wanted:
        errors.append(f"runs the interleaved schedule without p2p overlap only with pp > 2, not pp={plan.pp} "
                      f"(overlap must include pp)")
    forced = "+".join(sorted({2: {"dp"}, 3: {"dp", "param"}}.get(plan.zero, set()) - wanted))
    if forced:
        errors.append(f"always overlaps {forced} in Megatron-FSDP (zero={plan.zero}): overlap must include {forced}")
    return errors


def _megatron_overlap(plan: Plan) -> frozenset[str]:
    kinds = {"dp"}
    if plan.ep > 1 and (plan.pp == 1 or plan.schedule == "interleaved"):
        kinds.add("ep")  # the MoE recipes' --overlap-moe-expert-parallel-comm (combined 1F1B: pp=1 or interleaved)
    if plan.zero >= 1:
        kinds.add("param")
    if plan.tp > 1 and plan.sp:
        kinds.add("tp")
    if plan.schedule == "interleaved":
        kinds.add("pp")
    return frozenset(kinds)


def _torchtitan_rules(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    errors = []
    if plan.zero == 1:
        errors.append("has no ZeRO-1 (it runs DDP replicate = zero=0, FSDP2 without resharding = zero=2, "
                      "FSDP2 = zero=3)")
    if plan.zero == 0 and plan.cp > 1:
        errors.append(f"shards with FSDP2 over the context-parallel ranks whenever cp > 1, so zero=0 (DDP) "
                      f"cannot run with cp={plan.cp} (use zero=2 or 3)")
    if plan.tp > 1 and not plan.sp:
        errors.append("always runs tensor parallelism with sequence-parallel norms (use sp=true)")
    if plan.schedule == "interleaved" and plan.v == 1:
        errors.append("needs at least 2 stages per rank for Interleaved1F1B (use v >= 2 or schedule=1f1b)")
    if plan.rank_order not in TORCHTITAN_ORDERS:
        errors.append(f"orders ranks tp-cp-dp-pp only (its mesh is pp, dp, cp, tp), not {'-'.join(plan.rank_order)}")
    wanted = overlap_kinds(plan.overlap)
    if wanted is None:
        return errors
    always = {"dp"} if plan.dp * plan.cp > 1 else set()
    if plan.zero >= 2:
        always.add("param")
    if plan.pp > 1:
        always.add("pp")
    forced = "+".join(sorted(always - wanted))
    if forced:
        errors.append(f"always overlaps {forced} (FSDP2 prefetch and reduce-scatter, DDP buckets, pipelining "
                      f"send/recv): overlap must include {forced}")
    return errors


def _torchtitan_overlap(plan: Plan) -> frozenset[str]:
    return frozenset({"dp", "param", "pp"} if plan.zero >= 2 else {"dp", "pp"})


def _deepspeed_rules(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    errors = []
    if plan.pp > 1 and plan.zero > 1:
        errors.append(f"runs its pipeline engine only with ZeRO stage 0 or 1, not zero={plan.zero}")
    if plan.schedule != "1f1b":
        errors.append(f"has one pipeline schedule (1F1B), not {plan.schedule}")
    if plan.cp > 1:
        errors.append("has no context parallelism (cp must be 1)")
    if plan.ep > 1:
        errors.append("profile here has no expert parallelism (DeepSpeed-MoE is not modelled; ep must be 1)")
    if plan.rank_order not in DEEPSPEED_ORDERS:
        errors.append(f"orders ranks tp-dp-pp only, not {'-'.join(plan.rank_order)}")
    wanted = overlap_kinds(plan.overlap)
    if wanted is None:
        return errors
    if "dp" in wanted and plan.dp > 1 and (plan.zero == 0 or plan.pp > 1):
        errors.append("overlaps the gradient reduction only in its ZeRO optimizers without a pipeline "
                      f"(overlap_comm), not with zero={plan.zero}, pp={plan.pp}")
    if "param" in wanted and plan.zero in (1, 2):
        errors.append(f"gathers zero={plan.zero} parameters after the optimizer step: it cannot overlap param")
    if plan.zero == 3 and ("dp" in wanted) != ("param" in wanted):
        errors.append("switches ZeRO-3's gradient reduce-scatter and parameter prefetch together (overlap_comm): "
                      "overlap must include both dp and param or neither")
    return errors


def _deepspeed_overlap(plan: Plan) -> frozenset[str]:
    return frozenset({"dp", "param"} if plan.zero == 3 else set())


def _pytorch_rules(plan: Plan, spec: "WorkloadSpec") -> list[str]:
    from predictor.moe import runner_ep_error

    error = runner_ep_error(plan, spec.model)
    return [f"cannot run {error}"] if error else []


def _nothing(plan: Plan) -> frozenset[str]:
    return frozenset()


FRAMEWORKS: dict[str, Framework] = {
    "megatron": Framework("megatron", "Megatron-Core", _megatron_rules, _megatron_overlap,
                          frozenset(OVERLAP_KINDS), fused_attention=True,
                          precisions=("fp32", "fp16", "bf16", "fp8", "fp4"),
                          never={"schedule": ("gpipe",), "orders": _other_orders(MEGATRON_ORDERS)},
                          recompute_modules=True),
    "torchtitan": Framework("torchtitan", "torchtitan", _torchtitan_rules, _torchtitan_overlap,
                            frozenset(OVERLAP_KINDS) - {"ep"}, fused_attention=True, precisions=("fp32", "bf16", "fp8"),
                            never={"zero": (1,), "orders": _other_orders(TORCHTITAN_ORDERS)}),
    "deepspeed": Framework("deepspeed", "DeepSpeed", _deepspeed_rules, _deepspeed_overlap,
                           frozenset({"dp", "param"}), fused_attention=False, precisions=("fp32", "fp16", "bf16"),
                           never={"schedule": ("gpipe", "interleaved"), "orders": _other_orders(DEEPSPEED_ORDERS)}),
    "pytorch": Framework("pytorch", "ScaleDL's runner", _pytorch_rules, _nothing, frozenset(), fused_attention=False,
                         precisions=("fp32", "fp16", "bf16")),
}
assert tuple(FRAMEWORKS) == FRAMEWORK_NAMES


def framework_of(spec: "WorkloadSpec") -> Framework:
    """The framework a spec trains with: `training.framework`, else Megatron-Core on catalogue GPUs and
    ScaleDL's runner on a measured device."""
    name = spec.training.framework
    if name is None:
        name = MEASURED_DEFAULT if DEVICES.get(spec.cluster.device) is None or spec.cluster.device_profile else DEFAULT_FRAMEWORK
    return FRAMEWORKS[name]
