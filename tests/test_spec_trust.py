"""A spec cannot run code unless the user says so: `module:` needs `--trust-module` on the command line (never the
spec), its factory must be defined in the module it names (no builtins, no standard library), and a YAML key given
twice is an error rather than a silent override."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.job import main as job_main
from predictor.graph.modelzoo import build_model
from predictor.spec.workload import SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
TRAINING = {"global_batch": 16, "framework": "pytorch"}
CLUSTER = {"device": "a100-80gb", "nodes": 1, "gpus_per_node": 8}
USER_MODULE = '''
from os import system
from torch import nn


def build(d=16):
    return nn.Sequential(nn.Linear(d, d), nn.Linear(d, d))
'''


def _write(folder: Path, model: dict) -> Path:
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump({"model": {"inputs": [{"shape": [8, 16]}], **model}, "training": TRAINING,
                                    "cluster": CLUSTER}))
    return path


@pytest.fixture()
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "trust_user_model.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _predict(capsys: pytest.CaptureFixture[str], spec: Path, *flags: str) -> tuple[int, str]:
    code = main(["predict", str(spec), "--plan", "dp=8", "--predictor", "analytical", *flags])
    return code, capsys.readouterr().err


def test_a_module_spec_is_refused_without_the_flag_which_the_error_names(user_module: Path, capsys) -> None:
    spec = _write(user_module, {"module": "trust_user_model:build"})
    with pytest.raises(SpecError, match="--trust-module"):
        load_spec(spec)
    assert load_spec(spec, trust_module=True).model.module_trusted
    code, err = _predict(capsys, spec)
    assert code == 2 and "--trust-module" in err and "Traceback" not in err
    code, err = _predict(capsys, spec, "--trust-module")
    assert code == 0, err


def test_the_spec_cannot_trust_itself(user_module: Path) -> None:
    """No key of the spec allows its module: the model's keys are validated strictly, and the trust is no field."""
    data = {"model": {"module": "trust_user_model:build", "inputs": [{"shape": [8, 16]}], "module_trusted": True,
                      "_module_trusted": True}, "training": TRAINING, "cluster": CLUSTER}
    with pytest.raises(SpecError, match="module_trusted"):
        parse_spec(data)
    spec = parse_spec({**data, "model": {"module": "trust_user_model:build", "inputs": [{"shape": [8, 16]}]}})
    with pytest.raises(SpecError, match="--trust-module"):
        build_model(spec.model)  # a spec parsed without trust (a stored one, a dict) builds nothing either


def test_os_system_does_not_run_even_trusted(tmp_path: Path, capsys) -> None:
    marker = tmp_path / "ran"
    spec = _write(tmp_path, {"module": "os:system", "kwargs": {"command": f"touch {marker}"}})
    for flags in ((), ("--trust-module",)):
        code, err = _predict(capsys, spec, *flags)
        assert code == 2 and "model.module 'os:system'" in err, err
        assert not marker.exists()
    assert "standard library" in err


def test_shutil_rmtree_deletes_nothing_even_trusted(tmp_path: Path, capsys) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("x")
    spec = _write(tmp_path, {"module": "shutil:rmtree", "kwargs": {"path": str(victim)}})
    code, err = _predict(capsys, spec, "--trust-module")
    assert code == 2 and "standard library" in err
    assert (victim / "keep.txt").exists()


@pytest.mark.parametrize("name, why", [("builtins:exec", "builtin module"), ("posix:system", "builtin module"),
                                       ("subprocess:run", "standard library"),
                                       ("trust_user_model:system", "not defined in 'trust_user_model'")])
def test_builtins_stdlib_and_imported_callables_are_refused(user_module: Path, name: str, why: str) -> None:
    spec = parse_spec({"model": {"module": name, "inputs": [{"shape": [8, 16]}]}, "training": TRAINING,
                       "cluster": CLUSTER}, trust_module=True)
    with pytest.raises(SpecError, match=why):
        build_model(spec.model)


def test_orchestrator_job_needs_the_flag_too(user_module: Path, capsys) -> None:
    """`ray job submit -- python -m orchestrator.job --spec S`: the spec runs on the head node only with the flag,
    refused before Ray starts."""
    spec = _write(user_module, {"module": "trust_user_model:build"})
    code = job_main(["--spec", str(spec), "--out", str(user_module / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "--trust-module" in err
    assert not (user_module / "out").exists()


def test_a_key_given_twice_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text("model:\n  preset: gpt3-125m\ntraining:\n  global_batch: 8\n  global_batch: 16\ncluster:\n"
                    "  device: a100-80gb\n  nodes: 1\n")
    with pytest.raises(SpecError, match=r"line 5.*'global_batch' is given twice \(first on line 4\)"):
        load_spec(path)
    path.write_text("model:\n  preset: gpt3-125m\ntraining:\n  global_batch: 8\ncluster:\n  device: a100-80gb\n"
                    "model:\n  module: os:system\n")
    with pytest.raises(SpecError, match="'model' is given twice"):
        load_spec(path)
    path.write_text("base: &b {device: a100-80gb, nodes: 1}\nmodel:\n  preset: gpt3-125m\ntraining:\n  global_batch: 8"
                    "\ncluster:\n  <<: *b\n  nodes: 2\n")
    with pytest.raises(SpecError, match="base"):  # a merge key may be overridden; the unknown top key is refused
        load_spec(path)


def test_the_scaledl_console_refuses_it_as_a_subprocess(tmp_path: Path) -> None:
    """The path a user takes: no traceback, exit 2, the flag named."""
    marker = tmp_path / "ran"
    spec = _write(tmp_path, {"module": "os:system", "kwargs": {"command": f"touch {marker}"}})
    run = subprocess.run([sys.executable, "-m", "orchestrator.cli", "plan", str(spec), "--out", str(tmp_path / "o")],
                         cwd=ROOT, env={**os.environ}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--trust-module" in run.stderr and "Traceback" not in run.stderr
    assert not marker.exists()
