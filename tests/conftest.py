"""Fixtures shared by the test modules: the local Ray cluster that validation runs place their ranks on, this
machine's measured CPU profile, and the command line of the checkout under test."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Scaledl:
    """`scaledl ARGS...` as `python -m orchestrator.cli` run from this checkout's root, which -m puts first on
    sys.path: the `scaledl` console script imports whichever checkout is installed, not the one under test."""

    argv = [sys.executable, "-m", "orchestrator.cli"]

    def run(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
        """Run to its end (ten minutes at most), its output captured as text."""
        return subprocess.run([*self.argv, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, **kwargs)

    def plan_spec(self, spec: dict[str, Any], out: Path) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
        """`scaledl plan` of `spec` (written beside `out`) with the analytical predictor, its top two: the run, which
        must end 0 (a plan) or 1 (nothing fits), and its report, whose search must be complete."""
        import yaml

        path = out.parent / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        run = self.run("plan", str(path), "--out", str(out), "--top-k", "2", "--predictor", "analytical")
        assert run.returncode in (0, 1), run.stderr[-3000:]
        report = json.loads((out / "report.json").read_text())
        assert report["search"]["complete"]
        return run, report

    def start(self, *args: str, **kwargs: Any) -> subprocess.Popen:
        """Start it and return at once, for a test that signals or watches the running command."""
        return subprocess.Popen([*self.argv, *args], cwd=ROOT, **kwargs)


@pytest.fixture(scope="session")
def scaledl() -> Scaledl:
    return Scaledl()


@pytest.fixture(scope="module")
def cpus_per_node() -> int:
    """CPUs each raylet of `two_nodes` declares; a module whose runs need more defines a fixture of this name."""
    return 1


@pytest.fixture(scope="module")
def two_nodes(cpus_per_node: int) -> Iterator[Any]:
    """Two raylets on this machine, this process connected: a `ray.cluster_utils.Cluster`, one per test module
    (a module's runs see the resources it declares, not those another module's runs left behind)."""
    pytest.importorskip("ray")
    from orchestrator.ray_cluster.local import local_cluster

    with local_cluster({"num_cpus": cpus_per_node}, {"num_cpus": cpus_per_node}) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def measured_cpu_profile() -> Path:
    """This machine's measured CPU profile in the user's cache (`$SCALEDL_CACHE`), measured on first use (about 45 s)
    as `device: cpu` is: the session's one measurement, which tests copy into their own cache instead of measuring
    again."""
    from predictor.measure import device as measure_device

    measure_device.measured_cpu()
    return measure_device.cache_dir() / measure_device.CACHE_FILE
