"""The frameworks' own checks of a written launch file, run on this CPU machine (a test helper: megatron-core and
DeepSpeed are test extras, `pip install -e .[test]`).

- Megatron-Core 0.16.1 (beside Transformer Engine `TRANSFORMER_ENGINE` where none is installed): `TransformerConfig`
  (`MLATransformerConfig` for multi-latent attention) built from the written
  `pretrain_gpt.py` arguments, as Megatron-LM's `core_transformer_config_from_args` maps them (an argument named like a
  config field sets it; `RENAMED` the others), so its and `ModelParallelConfig`'s `__post_init__` checks run; then
  `parallel_state.initialize_model_parallel` over a fake process group of the plan's world size, whose group-size
  checks run as on the cluster.
- DeepSpeed 0.19.8: `DeepSpeedConfig` loads the file as a rank of the plan's data-parallel group would, then the
  engines' refusals that need a built model (`ENGINE_REFUSALS`, each quoting its file).
- torchtitan 0.2.2 (installed without its dependencies by `make setup`): `ConfigManager` loads the TOML as
  `torchtitan.train --job.config_file` does, then `ParallelDims` validates its degrees against the world size, as the
  trainer builds it (torchtitan/train.py).

Each returns the framework's refusals (empty: it accepts the file).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import sys
import shlex
import warnings
from contextlib import contextmanager, suppress
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from predictor.frameworks.base import parse_args

# Arguments whose config field has another name, or that set several fields (Megatron-LM's arguments.py and
# core_transformer_config_from_args).
RENAMED: dict[str, Callable[[list[str]], dict[str, Any]]] = {
    "--num-experts": lambda v: {"num_moe_experts": int(v[0])},
    "--swiglu": lambda v: {"gated_linear_unit": True, "activation_func": F.silu, "bias_activation_fusion": False},
    "--disable-bias-linear": lambda v: {"add_bias_linear": False},
    "--fp8-format": lambda v: {"fp8": v[0]},
    "--fp8-param-gather": lambda v: {"fp8_param": True},
    "--fp4-format": lambda v: {"fp4": v[0]},
    "--num-virtual-stages-per-pipeline-rank": lambda v: {"virtual_pipeline_model_parallel_size": int(v[0])},
    "--no-overlap-p2p-communication": lambda v: {"overlap_p2p_comm": False, "batch_p2p_comm": True},
    "--moe-layer-freq": lambda v: {"moe_layer_freq": eval(v[0], {"__builtins__": {}})},  # Megatron-LM's moe_freq_type
    "--bf16": lambda v: {"bf16": True, "params_dtype": torch.bfloat16, "pipeline_dtype": torch.bfloat16},
    "--fp16": lambda v: {"fp16": True, "params_dtype": torch.half, "pipeline_dtype": torch.half},
    # pretrain_mamba.py: a layer pattern makes the model hybrid; Nemotron-H's MLPs are squared ReLU
    "--hybrid-override-pattern": lambda v: {"is_hybrid_model": True},
    "--squared-relu": lambda v: {"activation_func": _squared_relu()},
}


def _squared_relu() -> Callable[[torch.Tensor], torch.Tensor]:
    from megatron.core.activations import squared_relu

    return squared_relu
# Training-loop, data, optimizer and checkpoint arguments: no field of the model's config.
NOT_CONFIG = {"--micro-batch-size", "--global-batch-size", "--seq-length", "--max-position-embeddings",
              "--position-embedding-type", "--untie-embeddings-and-output-weights", "--group-query-attention",
              "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
              "--use-precision-aware-optimizer", "--exp-avg-dtype", "--exp-avg-sq-dtype", "--grad-reduce-in-bf16",
              "--main-grads-dtype", "--optimizer-cpu-offload", "--optimizer-offload-fraction", "--ckpt-format",
              "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--use-tp-pp-dp-mapping",
              "--spec", "--optimizer"}


def _value(values: list[str]) -> Any:
    if not values:
        return True
    parsed: list[Any] = []
    for v in values:
        for kind in (int, float):
            with suppress(ValueError):
                parsed.append(kind(v))
                break
        else:
            parsed.append(v)
    return parsed[0] if len(parsed) == 1 else parsed


def transformer_config_kwargs(args: dict[str, list[str]]) -> tuple[type, dict[str, Any]]:
    """The config class and its keyword arguments from parsed `pretrain_gpt.py` arguments."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    cls = MLATransformerConfig if "--multi-latent-attention" in args else TransformerConfig
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {"params_dtype": torch.float32}
    for flag, values in args.items():
        if flag in RENAMED:
            kwargs.update(RENAMED[flag](values))
        elif flag in NOT_CONFIG:
            continue
        else:
            name = flag[2:].replace("-", "_")
            if name not in fields:
                raise KeyError(f"{flag} sets no field of {cls.__name__} and is not a known training argument")
            value = _value(values)
            kwargs[name] = [value] if name in ("recompute_modules", "offload_modules") and isinstance(value, str) \
                else value
    if kwargs.get("pipeline_model_parallel_size", 1) == 1:
        kwargs.pop("pipeline_dtype", None)
    return cls, kwargs


@contextmanager
def fake_world(size: int) -> Iterator[None]:
    """torch.distributed initialised over a fake process group of `size` ranks (this process rank 0)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
    try:
        yield
    finally:
        dist.destroy_process_group()


# The Transformer Engine the launch runs beside, which the config's FP8 and MoE checks ask the version of: the
# oldest megatron-core 0.16.1's own `dev` extra accepts (its METADATA: transformer-engine>=2.9.0a0,<2.12.0). Set only
# where Transformer Engine is not installed (a CPU machine), so an installed one answers for itself.
TRANSFORMER_ENGINE = "2.9.0"


# Transformer Engine's fused MoE permutation functions, which TransformerConfig asks for under moe_permute_fusion
# (megatron/core/transformer/moe/moe_utils.py imports them from it).
FUSED_PERMUTATION = ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                     "fused_sort_chunks_by_index_with_probs", "fused_unpermute")


def _transformer_engine_version() -> None:
    """Where Transformer Engine is not installed: its version, and stand-ins for the fused permutation functions
    (the checks build configs only; a stand-in refuses to run)."""
    from megatron.core import utils
    from megatron.core.transformer.moe import moe_utils
    from packaging.version import Version

    if utils.get_te_version() is None:
        utils._te_version = Version(TRANSFORMER_ENGINE)
        for name in FUSED_PERMUTATION:
            if getattr(moe_utils, name, None) is None:
                setattr(moe_utils, name, _not_installed)


def _not_installed(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("Transformer Engine is not installed: the checks build configs, they run no kernel")


def megatron_refusals(text: str, gpus: int) -> list[str]:
    """Megatron-Core's refusals of a written `megatron_args.txt` for a world of `gpus` ranks."""
    from megatron.core import parallel_state

    _transformer_engine_version()

    args = parse_args(shlex.split(text))
    cls, kwargs = transformer_config_kwargs(args)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = cls(**kwargs)
    except (AssertionError, ValueError, TypeError, RuntimeError) as err:
        return [f"{cls.__name__}: {err}"]
    order = "tp-cp-ep-pp-dp" if "--use-tp-pp-dp-mapping" in args else "tp-cp-ep-dp-pp"
    with fake_world(gpus):
        try:
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=config.tensor_model_parallel_size,
                pipeline_model_parallel_size=config.pipeline_model_parallel_size,
                virtual_pipeline_model_parallel_size=config.virtual_pipeline_model_parallel_size,
                context_parallel_size=config.context_parallel_size,
                expert_model_parallel_size=config.expert_model_parallel_size,
                expert_tensor_parallel_size=config.expert_tensor_parallel_size,
                order=order, create_gloo_process_groups=False)
        except (AssertionError, RuntimeError) as err:
            return [f"parallel_state: {err}"]
        finally:
            parallel_state.destroy_model_parallel()
    return []


# What DeepSpeed's engines refuse once they hold the model, which DeepSpeedConfig alone cannot see: (condition on the
# config and the Megatron-DeepSpeed arguments, the engine's words, where it says them).
ENGINE_REFUSALS: tuple[tuple[Callable[[dict[str, Any], dict[str, list[str]]], bool], str], ...] = (
    (lambda config, args: "--num-experts" in args and config["zero_optimization"]["stage"] == 3,
     "deepspeed/runtime/engine.py:2215: Native DeepSpeed MoE is not supported with ZeRO Stage 3"),
    (lambda config, args: "--no-pipeline-parallel" not in args and config["zero_optimization"]["stage"] >= 2,
     "deepspeed/runtime/pipe/engine.py:77: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"),
)


def deepspeed_refusals(text: str, dp: int, path: str) -> list[str]:
    """DeepSpeed's refusals of a written `deepspeed_config.json` (`path`: where it is written, for its loader) on a rank
    of a data-parallel group of `dp` ranks."""
    import deepspeed.comm as dist
    from deepspeed.runtime import config as ds_config

    config = json.loads(text)
    args = parse_args(config["megatron_deepspeed_args"])
    get_rank = dist.get_rank
    dist.get_rank = lambda *a, **k: 0  # no process group on a CPU test machine
    try:
        ds_config.DeepSpeedConfig(path, mpu=SimpleNamespace(get_data_parallel_world_size=lambda: dp))
    except (AssertionError, ValueError) as err:
        return [f"DeepSpeedConfig: {err}"]
    finally:
        dist.get_rank = get_rank
    return [words for refused, words in ENGINE_REFUSALS if refused(config, args)]


def torchtitan_module(name: str) -> ModuleType | None:
    """A module of the installed torchtitan, or None where it is not installed. Its package `__init__` is not run:
    it imports the Triton MoE kernels (triton: 1 GB, GPU only), which neither the config loader nor ParallelDims use;
    the modules' own code runs unchanged."""
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None or spec.submodule_search_locations is None:
            return None
        package = ModuleType("torchtitan")
        package.__path__, package.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules["torchtitan"] = package
    return importlib.import_module(name)


def torchtitan_refusals(path: str, world_size: int) -> list[str]:
    """torchtitan's refusals of a written `torchtitan.toml` at `path` for a job of `world_size` ranks: its loader's,
    then ParallelDims' (torchtitan/distributed/parallel_dims.py `_validate`)."""
    manager = torchtitan_module("torchtitan.config.manager")
    parallel_dims = torchtitan_module("torchtitan.distributed.parallel_dims")
    try:
        job = manager.ConfigManager().parse_args(["--job.config_file", path])
    except (SystemExit, ValueError, TypeError) as err:
        return [f"ConfigManager: {err}"]
    p = job.parallelism
    try:
        parallel_dims.ParallelDims(
            dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
            cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
            ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=world_size)
    except AssertionError as err:
        return [f"ParallelDims: {err}"]
    return []
