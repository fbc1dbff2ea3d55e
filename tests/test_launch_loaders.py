"""The launch files loaded by the frameworks' own configuration loaders, where those install on a CPU machine beside
torch: DeepSpeed's `DeepSpeedConfig` (its batch arithmetic, ZeRO and precision sections). Skipped, with the reason,
where the package is absent (it is no dependency of ScaleDL: `pip install deepspeed` builds its CPU wheel in ~20 s).
torchtitan 0.3 has no TOML job-config loader (it builds its config from a Python `config_registry` function with tyro
overrides); tests/test_torchtitan_config.py checks the file against 0.2.2's JobConfig and loads it with 0.2's
ConfigManager where that is installed."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from predictor.frameworks.launch import launch_files
from predictor.plan import Plan
from predictor.spec.resolver import resolve
from predictor.spec.workload import WorkloadSpec, parse_spec

ds_config = pytest.importorskip("deepspeed.runtime.config", reason="DeepSpeed is not installed (pip install deepspeed)")


def _spec(preset: str, nodes: int, global_batch: int, precision: str = "bf16") -> WorkloadSpec:
    return parse_spec({"model": {"preset": preset},
                       "training": {"global_batch": global_batch, "precision": precision, "framework": "deepspeed"},
                       "cluster": {"device": "a100-80gb", "nodes": nodes, "gpus_per_node": 8}})


@pytest.mark.parametrize("preset, nodes, batch, plan, precision", [
    ("gpt3-1.3b", 2, 64, "dp=16,mbs=4,zero=3", "bf16"),
    ("gpt3-1.3b", 2, 64, "dp=4,tp=2,pp=2,mbs=2,zero=1,recompute=full", "fp16"),
    ("mixtral-8x7b", 4, 256, "dp=32,mbs=1,zero=2,optimizer_offload=1", "bf16"),
])
def test_deepspeed_loads_the_written_config(preset: str, nodes: int, batch: int, plan: str, precision: str,
                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeedConfig reads the file as the engine would on a rank of the plan's data-parallel group (its world size
    from Megatron-DeepSpeed's mpu) and accepts it: train_batch = micro-batch x accumulation x dp, the ZeRO stage,
    offload and precision are the plan's."""
    import deepspeed.comm as dist

    spec, p = _spec(preset, nodes, batch, precision), Plan.parse(plan)
    path = tmp_path / "deepspeed_config.json"
    path.write_text(launch_files(p, resolve(spec))["deepspeed_config.json"])
    monkeypatch.setattr(dist, "get_rank", lambda *args, **kwargs: 0)  # no process group on a CPU test machine
    mpu = SimpleNamespace(get_data_parallel_world_size=lambda: p.dp)
    loaded = ds_config.DeepSpeedConfig(str(path), mpu=mpu)
    assert loaded.world_size == p.dp
    assert (loaded.train_batch_size, loaded.train_micro_batch_size_per_gpu,
            loaded.gradient_accumulation_steps) == (batch, p.mbs, p.microbatches(batch))
    assert loaded.zero_optimization_stage == p.zero
    assert (loaded.bfloat16_config.enabled, loaded.float16_config.enabled) == (precision == "bf16", precision == "fp16")
    offload = loaded.zero_config.offload_optimizer
    assert (offload is not None and offload.device == "cpu") == bool(p.optimizer_offload)
    assert json.loads(path.read_text())["megatron_deepspeed_args"]  # the training script's half rides along
