"""This machine's identity: its CPU model, which fingerprints measured figures and names what is kept per hardware.

Apart from the catalogue (`predictor.spec.hardware`) and from measuring (`predictor.measure`), because datasets,
checkpoints and the device profile all name the hardware and none should import the others for it.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path


def cpu_model_name() -> str:
    """This machine's CPU model as /proc/cpuinfo names it (fingerprints of measured CPU figures)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_slug(model: str) -> str:
    """A CPU model as a file-name part ('AMD EPYC' → 'amd-epyc'): names what is kept per hardware."""
    return re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "unknown"
