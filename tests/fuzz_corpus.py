"""A generated corpus of malformed workload specs, each with what its one error message must name.

Bad input is a test suite (issue 26): every entry must make `scaledl predict SPEC` exit with status 2
and one message naming the field or the file, no traceback, in bounded time and memory. The
corpus is written into a folder; `module:` entries also write small Python modules there, so that
folder must be on the import path (PYTHONPATH for a subprocess). Names are "category/case".
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, NamedTuple

import yaml

# A valid spec that predicts in well under a second; every entry breaks one thing of it.
VALID: dict[str, Any] = {
    "model": {"family": "gpt", "hidden": 512, "layers": 4, "heads": 8, "seq_len": 256, "vocab": 50304},
    "training": {"global_batch": 32},
    "cluster": {"device": "a100-80gb", "nodes": 1, "gpus_per_node": 8},
}
MODULE = "fuzz_models"  # the module the `module:` entries import
PLAN = "dp=8"  # valid for VALID and for the module specs' cluster


class Case(NamedTuple):
    name: str  # "category/case"
    path: Path
    names: str  # what the error message must contain: the field, else the file


# The user modules: a working model, and one module per way a module can fail on import.
_MODELS = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(2)])

    def forward(self, x):
        return self.blocks(x)


class Wordy(Net):
    def forward(self, x):
        return "not a tensor"


def net(width: int = 16):
    return Net(width)


def wordy():
    return Wordy()


def raises():
    raise RuntimeError("the factory fails on purpose")


def not_a_module():
    return 42


def returns_none():
    pass


NOT_CALLABLE = 3
'''
_BROKEN_MODULES = {
    "fuzz_import_error": 'raise ImportError("broken on purpose")\n',
    "fuzz_zero_division": "1 / 0\n",
    "fuzz_syntax_error": "def f(:\n",
    "fuzz_exits": "import sys\nsys.exit(3)\n",
    "fuzz_missing_dependency": "import fuzz_no_such_dependency\n",
}


def _with(section: str, **values: Any) -> dict[str, Any]:
    """VALID with keys of one section replaced (a None value deletes the key)."""
    data = copy.deepcopy(VALID)
    data[section].update(values)
    data[section] = {k: v for k, v in data[section].items() if v is not None}
    return data


def _module_spec(module: str, inputs: Any = None, **model: Any) -> dict[str, Any]:
    return {**copy.deepcopy(VALID), "model": {"module": module, "inputs": inputs or [{"shape": [16]}], **model}}


def _hf(**config: Any) -> dict[str, Any]:
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128, "vocab_size": 50257}
    return {**copy.deepcopy(VALID), "model": {"hf_config": {**gpt2, **config}}}


def _text(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def _valid_text(replace: str, by: str) -> str:
    """VALID's YAML with one line replaced: for what safe_dump cannot write (tags, aliases, bad syntax)."""
    text = _text(VALID)
    assert replace in text, replace
    return text.replace(replace, by, 1)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _laughs(levels: int, width: int) -> str:
    """A billion laughs: each level a list of `width` aliases of the level below, `width**levels` values."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return _text(VALID) + "search:\n" + "".join(f"  {line}\n" for line in lines)


def _mapping_bomb(levels: int) -> str:
    """The same with mappings of aliases: `8**levels` values."""
    lines = ["m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8}"]
    lines += [f"m{i}: &m{i} {{{', '.join(f'k{j}: *m{i - 1}' for j in range(8))}}}" for i in range(1, levels + 1)]
    return _text(VALID) + "search:\n" + "".join(f"  {line}\n" for line in lines)


# (name, content, what the message names). Content: bytes or str written as is, a dict dumped as YAML.
# "FILE" stands for the entry's own file name.
_ENTRIES: list[tuple[str, bytes | str | dict[str, Any], str]] = [
    # the file itself
    ("file/binary", bytes(range(256)) * 4, "FILE"),
    ("file/utf16", _text(VALID).encode("utf-16"), "FILE"),
    ("file/latin1", _valid_text("gpt", "gpt  # déjà").encode("latin-1"), "FILE"),
    ("file/nul-character", _valid_text("training:", "training:\x00"), "#x0000"),
    ("file/empty", b"", "FILE"),
    ("file/whitespace-only", " \n\t\n", "FILE"),
    ("file/comments-only", "# model: gpt\n", "FILE"),
    ("file/oversized", _text(VALID) + "#" * (2 << 20) + "\n", "FILE"),
    # YAML that does not parse or convert
    ("yaml/5000-digit-int", _valid_text("hidden: 512", "hidden: " + "9" * 5000), "line 3"),
    ("yaml/syntax-error", _valid_text("training:", "training: [global_batch: 8"), "line"),
    ("yaml/tab-indent", _valid_text("  hidden: 512", "\thidden: 512"), "line"),
    ("yaml/two-documents", _text(VALID) + "---\n" + _text(VALID), "line"),
    ("yaml/python-tag", _valid_text("hidden: 512", "hidden: !!python/object/apply:os.getcwd []"), "line 3"),
    ("yaml/bad-int-tag", _valid_text("hidden: 512", "hidden: !!int wide"), "line 3"),
    ("yaml/bad-timestamp", _valid_text("hidden: 512", "hidden: !!timestamp 2024-13-45"), "line 3"),
    ("yaml/undefined-alias", _valid_text("hidden: 512", "hidden: *nowhere"), "line 3"),
    ("yaml/top-level-list", "- model\n- training\n", "FILE"),
    ("yaml/top-level-scalar", "gpt3-175b\n", "FILE"),
    # shapes that cost time or memory to read
    ("structure/alias-bomb", _laughs(levels=9, width=9), "alias bomb"),
    ("structure/mapping-bomb", _mapping_bomb(levels=8), "alias bomb"),
    ("structure/recursive-alias", _text(VALID) + "search: &loop {again: *loop}\n", "alias *loop"),
    ("structure/nested-10000-lists", _text(VALID) + f"search: {{deep: {_nested(10_000)}}}\n", "nested deeper"),
    ("structure/nested-100-mappings", _text(VALID) + "search: " + "{a: " * 100 + "1" + "}" * 100 + "\n",
     "nested deeper"),
    ("structure/50000-values", _text(VALID) + f"search: {{many: [{', '.join(['1'] * 50_000)}]}}\n", "10,000 values"),
    ("structure/long-string", _with("cluster", device="x" * 100_000), "cluster.device"),
    ("structure/2000-unknown-keys", {**VALID, **{f"extra{i}": i for i in range(2000)}}, "and 1990 more"),
    # numbers
    ("numbers/layers-1e12", _with("model", layers=10**12), "model.layers"),
    ("numbers/hidden-1e100", _with("model", hidden=10**100), "model.hidden"),
    ("numbers/global-batch-1e30", _with("training", global_batch=10**30), "training.global_batch"),
    ("numbers/nodes-1e20", _with("cluster", nodes=10**20), "cluster.nodes"),
    ("numbers/negative-nodes", _with("cluster", nodes=-1), "cluster.nodes"),
    ("numbers/nodes-over-bound", _with("cluster", nodes=10**6), "cluster.nodes"),
    ("numbers/gpus-per-node-over-bound", _with("cluster", gpus_per_node=4096), "cluster.gpus_per_node"),
    ("numbers/zero-batch", _with("training", global_batch=0), "training.global_batch"),
    ("numbers/negative-hidden", _with("model", hidden=-512), "model.hidden"),
    ("numbers/fractional-heads", _with("model", heads=8.5), "model.heads"),
    ("numbers/infinite-seq-len", _with("model", seq_len=float("inf")), "model.seq_len"),
    ("numbers/nan-bandwidth", _with("cluster", intra_node={"bandwidth_gbps": float("nan"), "latency_us": 1}),
     "cluster.intra_node.bandwidth_gbps"),
    ("numbers/negative-latency", _with("cluster", intra_node={"bandwidth_gbps": 300, "latency_us": -1}),
     "cluster.intra_node.latency_us"),
    ("numbers/seq-len-over-bound", _with("model", seq_len=2**30), "model.seq_len"),
    ("numbers/attention-too-large", _with("model", hidden=2**20, heads=2**20, seq_len=2**24), "attention scores"),
    ("numbers/vision-patches-too-many", _with("model", family="vit", seq_len=None, vocab=None, image_size=65536,
                                              patch_size=1), "attention scores"),
    ("numbers/kwargs-1e40", _with("model", kwargs={"n_inner": 10**40}), "model.kwargs.n_inner"),
    # types
    ("types/layers-bool", _with("model", layers=True), "model.layers"),
    ("types/nodes-bool", _with("cluster", nodes=True), "cluster.nodes"),
    ("types/global-batch-bool", _with("training", global_batch=True), "training.global_batch"),
    ("types/hidden-string", _with("model", hidden="wide"), "model.hidden"),
    ("types/model-list", {**VALID, "model": ["gpt", 512]}, "model"),
    ("types/training-scalar", {**VALID, "training": 32}, "training"),
    ("types/cluster-null", {**VALID, "cluster": None}, "cluster"),
    ("types/family-number", _with("model", family=42), "model.family"),
    ("types/device-list", _with("cluster", device=["a100-80gb"]), "cluster.device"),
    ("types/kwargs-list", _with("model", kwargs=[1, 2]), "model.kwargs"),
    ("types/hf-config-string", {**VALID, "model": {"hf_config": "config.json"}}, "hf_config must be a mapping"),
    ("types/inputs-not-a-list", _module_spec(f"{MODULE}:net", inputs={"shape": [16]}), "model.inputs"),
    ("types/shape-strings", _module_spec(f"{MODULE}:net", inputs=[{"shape": ["16"]}]), "model.inputs.0.shape.0"),
    # keys
    ("keys/top-level-typo", {**{k: v for k, v in VALID.items() if k != "model"}, "modle": VALID["model"]},
     "did you mean 'model'"),
    ("keys/model-typo", _with("model", layers=None, layer=4), "did you mean 'layers'"),
    ("keys/cluster-typo", _with("cluster", gpus_per_node=None, gpu_per_node=8), "did you mean 'gpus_per_node'"),
    ("keys/link-typo", _with("cluster", intra_node={"bandwidth": 300, "latency_us": 1}), "did you mean 'bandwidth_gbps'"),
    ("keys/input-typo", _module_spec(f"{MODULE}:net", inputs=[{"shpe": [16]}]), "did you mean 'shape'"),
    ("keys/no-close-key", _with("training", zzzz=1), "known keys: global_batch"),
    # model semantics
    ("model/unknown-preset", {**VALID, "model": {"preset": "gpt3-175"}}, "unknown preset"),
    ("model/unknown-family", _with("model", family="gpt5"), "model.family"),
    ("model/unknown-device", _with("cluster", device="a200"), "unknown device"),
    ("model/two-sources", {**VALID, "model": {"preset": "gpt3-125m", "hf_config": {"model_type": "gpt2"}}},
     "preset and hf_config"),
    ("model/no-source", {**VALID, "model": {"hidden": 512}}, "give one of"),
    ("model/heads-do-not-divide", _with("model", heads=7), "heads=7"),
    ("model/missing-dims", _with("model", vocab=None), "vocab"),
    ("model/module-without-colon", _module_spec(MODULE), "module must look like"),
    ("model/module-without-inputs", {**VALID, "model": {"module": f"{MODULE}:net"}}, "inputs"),
    ("model/hf-without-model-type", {**VALID, "model": {"hf_config": {"n_layer": 2}}}, "model_type"),
    ("model/hf-unknown-type", _hf(model_type="no_such_model"), "model_type"),
    ("model/input-rank-9", _module_spec(f"{MODULE}:net", inputs=[{"shape": [1] * 9}]), "model.inputs.0.shape"),
    ("model/input-negative-dim", _module_spec(f"{MODULE}:net", inputs=[{"shape": [-16]}]), "model.inputs.0.shape.0"),
    ("model/input-high-1e20", _module_spec(f"{MODULE}:net", inputs=[{"shape": [16], "dtype": "int64",
                                                                    "high": 10**20}]), "model.inputs.0.high"),
    # user code: the module's import, its factory, what the factory returns, its forward
    ("module/factory-raises", _module_spec(f"{MODULE}:raises"), "model.module"),
    *((f"module/{name.removeprefix('fuzz_').replace('_', '-')}", _module_spec(f"{name}:f"), "model.module")
      for name in _BROKEN_MODULES),
    ("module/not-installed", _module_spec("fuzz_not_installed:f"), "model.module"),
    ("module/no-such-factory", _module_spec(f"{MODULE}:nothing"), "model.module"),
    ("module/not-callable", _module_spec(f"{MODULE}:NOT_CALLABLE"), "model.module"),
    ("module/empty-module-name", _module_spec(":net"), "model.module"),
    ("module/returns-int", _module_spec(f"{MODULE}:not_a_module"), "model.module"),
    ("module/returns-none", _module_spec(f"{MODULE}:returns_none"), "model.module"),
    ("module/unknown-kwarg", _module_spec(f"{MODULE}:net", kwargs={"depth": 3}), "model.module"),
    ("module/shape-does-not-fit", _module_spec(f"{MODULE}:net", inputs=[{"shape": [7]}]), "model.inputs"),
    ("module/no-features", _module_spec(f"{MODULE}:net", inputs=[{"shape": []}]), "model.inputs"),
    ("module/too-many-inputs", _module_spec(f"{MODULE}:net", inputs=[{"shape": [16]}, {"shape": [16]}]),
     "model.inputs"),
    ("module/forward-returns-string", _module_spec(f"{MODULE}:wordy"), "model.inputs"),
    # user config handed to transformers
    ("hf/unknown-activation", _hf(activation_function="nope"), "model.hf_config"),
    ("hf/kwargs-clash", _with("model", family="gpt2", kwargs={"n_layer": 5}), "model.kwargs"),
]


CASE_NAMES: list[str] = [name for name, _, _ in _ENTRIES]


def _write(path: Path, content: bytes | str | dict[str, Any]) -> None:
    if isinstance(content, dict):
        content = _text(content)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)


def corpus(folder: Path) -> list[Case]:
    """Write every entry (and the user modules) into `folder`; one Case per entry, in category order."""
    (folder / f"{MODULE}.py").write_text(_MODELS)
    for name, source in _BROKEN_MODULES.items():
        (folder / f"{name}.py").write_text(source)
    cases = []
    for name, content, names in _ENTRIES:
        path = folder / (name.replace("/", "__") + ".yaml")
        _write(path, content)
        cases.append(Case(name, path, path.name if names == "FILE" else names))
    return cases

