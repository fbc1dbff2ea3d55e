"""At least 90 % of the causal-LM architectures the installed transformers defines build a layer graph and plan from
their default config (bench/transformers_coverage.py, which prints each failure's stage and error)."""

from __future__ import annotations

import pytest

from bench.transformers_coverage import architectures, attempt


@pytest.mark.slow
def test_nine_in_ten_causal_lm_architectures_build_and_plan() -> None:
    types = architectures()
    failures = {t: r for t in types if (r := attempt(t))[0] != "ok"}
    assert len(types) - len(failures) >= 0.9 * len(types), failures
