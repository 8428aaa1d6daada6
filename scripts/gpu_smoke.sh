#!/usr/bin/env bash
# One-GPU smoke test of the real OpenRLHF path: Ray, DeepSpeed, one vLLM engine, the tiny policy,
# the synthetic world and a few TRACE steps, in under 10 minutes. The last line it prints is
#   GPU SMOKE: PASS (...)   or   GPU SMOKE: FAIL (...)
# and the exit code says the same (0 / 1).
#
# UNVERIFIED: written without a GPU (no GPU was lent to the tasks that wrote it); on CPU its
# flags pass OpenRLHF's parser and the tree checks (it is step 4 of docs/openrlhf.md, "First
# hour on a cluster"). Run it after `make install-gpu`, from the repository root:
#   bash scripts/gpu_smoke.sh
# Environment: POLICY (a tiny policy directory; default: build or reuse RUN/tiny_policy/policy
# with `tracerl init-model`, a few minutes on CPU), RUN (default: runs/gpu_smoke), STEPS (3),
# TIMEOUT_S (600). `bash scripts/gpu_smoke.sh --check-only` checks every flag with OpenRLHF's
# parser and the tree checks and starts nothing (works on CPU; tests/harness/openrlhf runs it).
set -uo pipefail

absolute() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }
RUN=$(absolute "${RUN:-runs/gpu_smoke}")
STEPS=${STEPS:-3}
TIMEOUT_S=${TIMEOUT_S:-600}
PYTHON=${PYTHON:-python}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)

fail() {
  echo "GPU SMOKE: FAIL ($1; see $RUN/smoke.log)"
  exit 1
}

CHECK_ONLY=""
[[ " $* " == *" --check-only "* ]] && CHECK_ONLY=1
mkdir -p "$RUN"
: >"$RUN/smoke.log"
if [[ -z "$CHECK_ONLY" ]]; then
  "$PYTHON" -c "import torch; assert torch.cuda.is_available()" >>"$RUN/smoke.log" 2>&1 ||
    fail "no CUDA device visible to torch"
fi
if [[ -z "$CHECK_ONLY" ]]; then
  "$PYTHON" scripts/gpu_smoke_data.py --out "$RUN/data" >>"$RUN/smoke.log" 2>&1 ||
    fail "could not write the synthetic prompts and index"
fi
if [[ -z "${POLICY:-}" && -z "$CHECK_ONLY" ]]; then
  tracerl init-model --run-dir "$RUN" --no-progress >>"$RUN/smoke.log" 2>&1 ||
    fail "tracerl init-model failed"
  POLICY="$RUN/tiny_policy/policy"
fi
POLICY=$(absolute "${POLICY:-$RUN/tiny_policy/policy}")

# A budget of 16 leaves per step (8 prompts x 2), one optimizer step per training step.
timeout "$TIMEOUT_S" tracerl train --backend openrlhf \
  --retriever "$RUN/data/index" --run-dir "$RUN" --seed 0 \
  --env.max-turns 4 --env.top-k 3 --env.reward em "$@" \
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
  --ds.zero_stage 2 --ds.param_dtype bf16 --ds.attn_implementation sdpa \
  --actor.adam.lr 1e-5 --algo.kl.init_coef 0 \
  --ckpt.path "$RUN/ckpt" --ckpt.save_steps "$STEPS" --ckpt.output_dir "$RUN/model" \
  >>"$RUN/smoke.log" 2>&1
code=$?
elapsed=$(($(date +%s) - START))
[[ $code -eq 124 ]] && fail "timed out after ${TIMEOUT_S} s"
[[ $code -ne 0 ]] && fail "tracerl train exited with code $code"
if [[ -n "$CHECK_ONLY" ]]; then
  grep -m1 "vLLM engines" "$RUN/smoke.log"
  echo "GPU SMOKE: CHECKED (flags only, nothing started)"
  exit 0
fi
"$PYTHON" - "$RUN" "$STEPS" >>"$RUN/smoke.log" 2>&1 <<'PY' || fail "the run's outputs are incomplete"
import json, sys
from pathlib import Path

run, steps = Path(sys.argv[1]), int(sys.argv[2])
records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
trained = [r for r in records if "loss/policy" in r]
assert trained, "no step trained (no leaf with signal?)"
assert all(r["budget/leaves"] == 16 for r in records if "budget/leaves" in r), "budget not exact"
assert (run / "checkpoints" / f"global_step{records[-1]['step']}" / "state.json").exists()
assert any((run / "model").glob("*.safetensors")), "no final model in RUN/model"
print(f"{len(records)} steps logged, {len(trained)} trained; last: {records[-1]}")
PY
echo "GPU SMOKE: PASS (${elapsed} s, $STEPS TRACE steps, run $RUN)"
