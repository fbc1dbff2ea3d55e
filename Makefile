# Two commands: `make plan` and `make test`. Both create .venv when missing (idempotent).
# `make test-all` adds the slow tests (real multi-node Ray runs, killed nodes, training) to `make test`'s.
PYTHON ?= python3.11
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXAMPLE ?= examples/gpt3-175b-a100x1024.yaml

.PHONY: setup plan test test-all bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the pinned CPU build is on local disk; an unpinned one pulls a multi-GB CUDA build.
	# TORCH_SPEC is passed unquoted so it may carry pip options (e.g. an --index-url for a CUDA build).
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e ".[test]"
	# torchtitan's config loader and ParallelDims check the written torchtitan.toml in the tests; --no-deps: its data,
	# tokenizer and logging stack is not needed, and its Triton MoE kernels (1 GB) are never imported.
	$(BIN)/pip install -q --no-deps torchtitan==0.2.2
	touch $(STAMP)

plan: setup
	$(BIN)/scaledl plan $(EXAMPLE) --out out/plan

test: setup
	$(BIN)/python -m pytest -q

test-all: setup
	$(BIN)/python -m pytest -q -m 'slow or not slow'

# The quick benchmarks (a few minutes); the accuracy tables (bench.paper_table, bench.data_cost) take ~50 min.
bench: setup
	$(BIN)/python -m bench.accuracy
	$(BIN)/python -m bench.predict_speed
	$(BIN)/python -m bench.plan_speed --runs 2
	$(BIN)/python -m bench.validate_plans

clean:
	rm -rf $(VENV) build *.egg-info
