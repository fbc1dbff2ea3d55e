"""Layer graphs kept in memory and on disk, so a model is traced once per machine, not once per run.

Building a graph imports torch and traces the model (seconds for GPT-3 175B), while a stored one
loads in milliseconds; `scaledl plan` is run again and again on the same models. A graph is keyed
by the model spec and by what it is built from (the name and source of every module of this package: the builder,
the model zoo, the graph types, tensor-parallel roles and MoE tracing; the family records and presets; the torch and
transformers versions), so a change to any of them, or a module moved, builds it afresh. Models defined by user code
(`module:`) are kept in memory only: their source can change under the same spec (an `hf_config:` spec holds its
whole config, and the transformers version is in the key). `SCALEDL_GRAPH_CACHE` moves the folder; a read-only one
only costs speed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import pickle
from pathlib import Path

from predictor.graph.layer_graph import LayerGraph
from predictor.spec.workload import ModelSpec

CACHE_DIR = Path(os.environ.get("SCALEDL_GRAPH_CACHE", Path.home() / ".cache" / "scaledl" / "graphs"))
_SPEC_FILES = ("families.py", "presets.py")  # the family records and presets a graph is built from
_MEMORY: dict[str, LayerGraph] = {}


@functools.cache
def _builder_fingerprint() -> str:
    """What every graph of this process is built from; read once (a dataset asks for hundreds of graphs)."""
    here = Path(__file__).parent
    files = [*sorted(here.glob("*.py")), *(here.parent / "spec" / name for name in _SPEC_FILES)]
    sources = "".join(f"{path.parent.name}/{path.name}\n{path.read_text()}" for path in files)
    return sources + "".join(importlib.metadata.version(p) for p in ("torch", "transformers"))


def _disk_path(model: ModelSpec, key: str) -> Path | None:
    if model.module is not None:
        return None
    return CACHE_DIR / f"{hashlib.sha1((key + _builder_fingerprint()).encode()).hexdigest()[:24]}.pkl"


def graph_for(model: ModelSpec) -> LayerGraph:
    """The layer graph of `model`: from memory, else from disk, else built (and stored).

    The one way to get a graph: the builder never imports this module, so the dependency runs one way."""
    key = model.model_dump_json()
    if key in _MEMORY:
        return _MEMORY[key]
    path = _disk_path(model, key)
    graph = None
    if path is not None:
        try:
            graph = pickle.loads(path.read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError):
            pass  # absent, or written by an incompatible version: rebuild
    if graph is None:
        from predictor.graph.build import build_graph  # imports torch: only when a graph must be traced

        graph = build_graph(model)
        if path is not None:
            _store(path, graph)
    _MEMORY[key] = graph
    return graph


def clear_memory() -> None:
    """Forget the in-memory graphs (the disk copies stay)."""
    _MEMORY.clear()


def _store(path: Path, graph: LayerGraph) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(graph))
        tmp.replace(path)
    except OSError:
        pass
