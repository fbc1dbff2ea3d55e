"""Training frameworks, one module each (megatron, torchtitan, deepspeed, pytorch), and which one a spec trains with.

Each module builds a `Framework` (`predictor.frameworks.base`) from that framework's own documentation and code: the
plans it runs, its default overlap, its attention kernel, its calibrated constants, its memory accounting, its own
search space and its launch file. `FRAMEWORKS` registers them, and everything that names a framework reads it when it
asks (the spec's choices, `search_spaces`' spaces, the CLI's help, the launch readers), so a framework is its module
and its entry here. `predictor.spec.resolver.resolve` decides which one trains a workload, and `predictor.frameworks.launch` writes a
plan's launch file and parses one back into the plan it runs.
"""

from __future__ import annotations

from predictor.frameworks.base import Framework, LaunchError, as_run
from predictor.frameworks.deepspeed import DEEPSPEED
from predictor.frameworks.megatron import MEGATRON
from predictor.frameworks.pytorch import PYTORCH
from predictor.frameworks.torchtitan import TORCHTITAN

__all__ = ["DEFAULT_FRAMEWORK", "FRAMEWORKS", "MEASURED_FRAMEWORK", "Framework", "LaunchError", "as_run"]

FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (MEGATRON, TORCHTITAN, DEEPSPEED, PYTORCH)}
# What a spec that names no framework trains with on a catalogue GPU.
DEFAULT_FRAMEWORK = MEGATRON.name
# Measured devices (a CPU) cannot run Megatron-Core: they run ScaleDL's own runner, whatever the spec names.
MEASURED_FRAMEWORK = PYTORCH.name
