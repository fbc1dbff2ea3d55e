"""How many causal-LM architectures of the installed transformers ScaleDL reads: for every config class its
`AutoModelForCausalLM` maps, an `hf_config:` spec of the config's default sizes (two layers where the config has a
plain layer count, 128 tokens) is validated, its layer graph traced on the meta device and one plan priced. A config
transformers itself cannot instantiate on the meta device at those sizes (its defaults leave a field unset) is
counted apart ("n/a"): the share is of those that can be instantiated.

    .venv/bin/python -m bench.transformers_coverage [--only llama,mamba2] [--record]

Prints each failure with its stage and first error line, and the count that build a graph and plan; `--record` writes
bench/results/transformers_coverage.json (tests/test_transformers_coverage.py, marked slow, asserts the share).
"""

from __future__ import annotations

import argparse
import signal
import time
import warnings
from typing import Any

from bench.common import RESULTS, merge_json

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
SECONDS = 120  # per architecture: tracing a default-size model takes a few seconds


def architectures() -> list[str]:
    """The model types transformers' AutoModelForCausalLM builds."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _small(model_type: str) -> dict[str, Any]:
    """The config of `model_type` at its defaults, two layers where its layer count is a plain field (a config
    whose layers follow a per-layer list keeps its default stack)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    per_layer = any(isinstance(v, list) and len(v) == getattr(config, "num_hidden_layers", -1)
                    for v in vars(config).values())
    key = next((k for k in LAYER_KEYS if k in vars(config)), None)
    return {"model_type": model_type, **({key: 2} if key and not per_layer else {})}


def _instantiate(config: dict[str, Any]) -> None:
    """Build the model with transformers alone on the meta device: what the issue's denominator requires."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    rest = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **rest))


class _Timeout(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise _Timeout(f"more than {SECONDS} s")


def attempt(model_type: str) -> tuple[str, str]:
    """('ok', '') or (the stage that failed, its first error line)."""
    from predictor.graph.cache import graph_for
    from predictor.models.analytical import AnalyticalPredictor
    from predictor.plan import Plan
    from predictor.spec.workload import parse_spec

    stage = "n/a"  # until transformers has built its config and model: not ScaleDL's failure
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS)
    try:
        config = _small(model_type)
        _instantiate(config)
        stage = "spec"
        spec = parse_spec({"model": {"hf_config": config, "seq_len": 128}, "training": {"global_batch": 8},
                           "cluster": {"device": "h100", "nodes": 1, "gpus_per_node": 8}})
        stage = "graph"
        graph = graph_for(spec.model)
        stage = "plan"
        table = AnalyticalPredictor().predict_table(spec, graph, [Plan(dp=8, mbs=1)])
        if not table.iter_time_s[0] > 0:
            return stage, f"iteration time {table.iter_time_s[0]}"
        return "ok", ""
    except BaseException as err:  # noqa: BLE001 - every failure is a row of the table, KeyboardInterrupt aside
        if isinstance(err, KeyboardInterrupt):
            raise
        first = (str(err).strip().splitlines() or [""])[-1 if stage == "spec" else 0]
        return stage, f"{type(err).__name__}: {first[:200]}"
    finally:
        signal.alarm(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated model types (default: every causal LM)")
    ap.add_argument("--record", action="store_true", help="write bench/results/transformers_coverage.json")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    types = [t for t in args.only.split(",") if t] or architectures()
    results: dict[str, dict[str, str]] = {}
    start = time.time()
    for model_type in types:
        t0 = time.time()
        stage, error = attempt(model_type)
        results[model_type] = {"stage": stage, "error": error}
        print(f"{model_type:32s} {stage:6s} {time.time() - t0:5.1f}s {error}", flush=True)
    built = sum(r["stage"] == "ok" for r in results.values())
    usable = sum(r["stage"] != "n/a" for r in results.values())
    print(f"\n{built} of the {usable} causal-LM architectures of transformers {transformers.__version__} it "
          f"instantiates on the meta device build a graph and plan ({100 * built / max(usable, 1):.1f} %; "
          f"{len(types) - usable} it cannot instantiate at their defaults; {built} of all {len(types)}), "
          f"{time.time() - start:.0f} s")
    if args.record and not args.only:
        merge_json(RESULTS / "transformers_coverage.json",
                   {"transformers": transformers.__version__, "architectures": len(types), "instantiable": usable,
                    "built": built, "failures": {t: r for t, r in results.items() if r["stage"] != "ok"}})


if __name__ == "__main__":
    main()
