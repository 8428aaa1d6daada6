#!/usr/bin/env bash
# One-GPU smoke test of the real OpenRLHF path: Ray, DeepSpeed, one vLLM engine, the shipped tiny
# policy, the synthetic world and a few TRACE steps. The last line it prints is
#   GPU SMOKE: PASS (...)   or   GPU SMOKE: FAIL (...)
# and the exit code says the same (0 / 1).
#
# Run it after `make install-gpu`, from anywhere:   bash scripts/gpu_smoke.sh
# It runs the project's own venv (.venv/bin/python, or $PYTHON), never what PATH finds.
#
# UNVERIFIED ON A GPU: written without one (no GPU has been lent to this project's tasks yet).
# `bash scripts/gpu_smoke.sh --check-only` works on CPU: it checks every flag with OpenRLHF's
# parser and the tree checks, then rehearses the same TRACE steps on CPU with the transformers
# backend (no Ray, vLLM or DeepSpeed) and fails if no step keeps a leaf with a training signal.
#
# The environment the policy is played in (turns, documents per search, document length,
# prompt) is read from the policy's own tiny_policy.json (--env-from-policy): the tiny policy
# answers nothing right in any other one, and then no step has anything to train on.
#
# Environment: POLICY (default: the shipped harness/tiny_policy/warm_start), RUN (default:
# runs/gpu_smoke), STEPS (3), TIMEOUT_S (900: a cold first start pays Ray's start, vLLM's start
# and DeepSpeed's FusedAdam build), PYTHON (default: the repository's .venv/bin/python).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
absolute() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$ROOT/$1" ;; esac; }
RUN=$(absolute "${RUN:-runs/gpu_smoke}")
POLICY=$(absolute "${POLICY:-harness/tiny_policy/warm_start}")
STEPS=${STEPS:-3}
TIMEOUT_S=${TIMEOUT_S:-900}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The venv's bin first on PATH: torch's extension builder finds ninja only there, and the Ray
# workers inherit it (DeepSpeed's FusedAdam builds in them). A Ray of its own (never a stale
# local one, with whatever GPU memory its actors hold), and a torch-extensions folder of this
# run's (a build killed by the timeout can leave a lock that the next run would wait on).
export PATH="$(dirname "$PYTHON"):$PATH"
export RAY_ADDRESS=local TORCH_EXTENSIONS_DIR="$RUN/torch_extensions"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
START=$(date +%s)

fail() {
  echo "GPU SMOKE: FAIL ($1; see $RUN/smoke.log)"
  exit 1
}

CHECK_ONLY=""
ARGS=()
for arg in "$@"; do
  if [[ "$arg" == "--check-only" ]]; then CHECK_ONLY=1; else ARGS+=("$arg"); fi
done
mkdir -p "$RUN"
: >"$RUN/smoke.log"
[[ -x "$PYTHON" ]] || fail "no Python at $PYTHON: run \`make install-gpu\` first (or set PYTHON)"

# Versions, then one clear line for the first missing component.
"$PYTHON" - "$CHECK_ONLY" >>"$RUN/smoke.log" 2>&1 <<'PY'
import importlib.metadata as md, platform, sys

print(f"python {platform.python_version()} at {sys.executable}")
for name in ("torch", "transformers", "vllm", "ray", "deepspeed", "openrlhf", "flash_attn"):
    versions = []
    for dist in (name.replace("_", "-"), f"{name}-cpu"):
        try:
            versions.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            pass
    print(", ".join(versions) if versions else f"{name} not installed")
import torch

print(f"cuda {torch.version.cuda}, devices: {torch.cuda.device_count()}")
for i in range(torch.cuda.device_count()):
    print(f"  {i}: {torch.cuda.get_device_name(i)}")
PY
echo "--- versions (also in $RUN/smoke.log)"
cat "$RUN/smoke.log"
for module in torch transformers openrlhf deepspeed ray vllm; do
  "$PYTHON" -c "import $module" >>"$RUN/smoke.log" 2>&1 ||
    fail "$module does not import in $PYTHON: run \`make install-gpu\`"
done
# The machine and its toolchain (driver, nvcc, ninja, Python headers, gcc, GPUs, disk): one
# line per failure with its fix. On CPU (--check-only) the GPU checks are skipped.
REQUIRE_GPU=()
[[ -z "$CHECK_ONLY" ]] && REQUIRE_GPU=(--require-gpu)
"$PYTHON" -m benchmarks.cli doctor --checkpoint-dir "$RUN" --min-disk-gb 5 "${REQUIRE_GPU[@]}" \
  >"$RUN/doctor.txt" 2>&1
doctor=$?
cat "$RUN/doctor.txt" | tee -a "$RUN/smoke.log"
[[ $doctor -eq 0 ]] || fail "tracerl doctor: $(grep -m1 '^FAIL' "$RUN/doctor.txt")"
if [[ -z "$CHECK_ONLY" ]]; then
  "$PYTHON" -c "import torch; assert torch.cuda.is_available()" >>"$RUN/smoke.log" 2>&1 ||
    fail "torch in $PYTHON sees no CUDA device (a CPU torch, or no GPU on this node)"
  "$PYTHON" -c "import flash_attn" >>"$RUN/smoke.log" 2>&1 ||
    echo "flash-attn not installed: the run uses sdpa attention (make install-gpu FLASH_ATTN=0)"
fi
[[ -f "$POLICY/tiny_policy.json" ]] || fail "$POLICY is not a tiny policy (no tiny_policy.json)"
"$PYTHON" -m benchmarks.cli smoke-data --out "$RUN/data" >>"$RUN/smoke.log" 2>&1 ||
  fail "could not write the synthetic prompts and index"

# A budget of 16 leaves per step (8 prompts x 2), one optimizer window per training step; the
# learning rate starts at its peak (no warm-up within 3 steps); ZeRO-3, as the 8B run.
MODE=()
[[ -n "$CHECK_ONLY" ]] && MODE=(--check-only --rehearse-steps "$STEPS")
timeout "$TIMEOUT_S" "$PYTHON" -m benchmarks.cli train --backend openrlhf \
  --retriever "$RUN/data/index" --run-dir "$RUN" --seed 0 \
  --env-from-policy --env.reward em "${MODE[@]}" "${ARGS[@]}" \
  --alloc.name trace --alloc.trace.continuations-per-rollout 1 -- \
  --actor.model_name_or_path "$POLICY" \
  --data.prompt_dataset "$RUN/data/train.jsonl" --data.max_samples $((8 * STEPS)) \
  --eval.dataset "$RUN/data/eval.jsonl" --eval.steps "$STEPS" --eval.temperature 0 \
  --data.max_len 1024 --rollout.max_new_tokens 48 --rollout.temperature 1.0 \
  --rollout.batch_size 8 --rollout.n_samples_per_prompt 2 --rollout.micro_batch_size 4 \
  --train.batch_size 16 --train.micro_batch_size 4 --train.max_epochs 1 --train.num_episodes 1 \
  --actor.num_nodes 1 --actor.num_gpus_per_node 1 --ref.num_nodes 1 --ref.num_gpus_per_node 1 \
  --train.colocate_all --vllm.enable_sleep --ds.enable_sleep \
  --vllm.num_engines 1 --vllm.tensor_parallel_size 1 --vllm.gpu_memory_utilization 0.3 \
  --vllm.enable_prefix_caching --vllm.enforce_eager \
  --ds.zero_stage 3 --ds.param_dtype bf16 --ds.attn_implementation sdpa \
  --actor.adam.lr 1e-5 --actor.lr_warmup_ratio 0 --algo.kl.init_coef 0 \
  --ckpt.path "$RUN/ckpt" --ckpt.save_steps "$STEPS" --ckpt.output_dir "$RUN/model" \
  >>"$RUN/smoke.log" 2>&1
code=$?
elapsed=$(($(date +%s) - START))
[[ $code -eq 124 ]] && fail "timed out after ${TIMEOUT_S} s (raise TIMEOUT_S)"
# the log's last error line, with a refusal's reasons (the "- " lines under it) joined on
last_error() {
  awk '/^[A-Za-z_.]*(Error|Exception)([^A-Za-z0-9_]|$)|^tracerl train: / {last = $0; open = 1; next}
       open && /^- / {last = last " " $0; next}
       {open = 0}
       END {print last}' "$RUN/smoke.log"
}
[[ $code -ne 0 ]] &&
  fail "tracerl train exited with code $code: $(last_error) (if it failed in attention on Hopper: VLLM_FLASH_ATTN_VERSION=2)"
if [[ -n "$CHECK_ONLY" ]]; then
  grep -m1 "vLLM engines" "$RUN/smoke.log"
  grep "^rehearsal" "$RUN/smoke.log"
  signal=$(sed -n 's/^rehearsal: \([0-9]*\) leaves with signal.*/\1/p' "$RUN/smoke.log")
  [[ "${signal:-0}" -gt 0 ]] ||
    fail "no rehearsed TRACE step kept a leaf with a training signal: nothing would train"
  echo "GPU SMOKE: CHECKED (flags parsed, $signal leaves with signal in $STEPS rehearsed steps on CPU; nothing started)"
  exit 0
fi
"$PYTHON" - "$RUN" "$STEPS" >>"$RUN/smoke.log" 2>&1 <<'PY' || fail "the run's outputs are incomplete"
import json, math, sys
from pathlib import Path

run, steps = Path(sys.argv[1]), int(sys.argv[2])
records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
trained = [r for r in records if "loss/policy" in r]
assert trained, "no step trained (no leaf with signal?)"
assert all(r["budget/leaves"] == 16 for r in records if "budget/leaves" in r), "budget not exact"
assert all("rollout/effective_ratio" in r for r in trained), "tree metrics missing"
for r in trained:
    for key in ("loss/policy", "ppo_kl", "kl"):
        assert key not in r or math.isfinite(r[key]), f"{key} is not finite at step {r['step']}"
gaps = [r["rollout_logprob_gap"] for r in trained if "rollout_logprob_gap" in r]
assert gaps, "no rollout_logprob_gap logged"
assert max(gaps) < 0.1, f"vLLM's and the trainer's log-probs disagree: gap {max(gaps):.3f}"
assert (run / "checkpoints" / f"global_step{records[-1]['step']}" / "state.json").exists()
assert any((run / "model").glob("*.safetensors")), "no final model in RUN/model"
print(f"{len(records)} steps logged, {len(trained)} trained; last: {records[-1]}")
PY
echo "GPU SMOKE: PASS (${elapsed} s, $STEPS TRACE steps, run $RUN)"
