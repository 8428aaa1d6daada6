#!/usr/bin/env bash
# TRACE on Qwen3-8B, trained on HotpotQA, on 8 GPUs (one node) or more (multi-node through
# `ray job submit`), with OpenRLHF 0.11.2 underneath: `tracerl train --backend openrlhf`.
# See docs/openrlhf.md. What has and has not been run on GPUs is listed there; this script's
# flags are checked on CPU by tests/harness/openrlhf/test_launch_scripts.py (--check-only).
#
# docs/openrlhf.md is the cluster guide: follow it top to bottom. In short, before the first run:
#   1. install:   make install-gpu on every node, at the same repository path (it ends with
#                 `tracerl doctor --require-gpu`: driver >= 580, CUDA 13.0 nvcc, ninja, gcc >= 10)
#   2. model:     a local copy every node can read, MODEL=/shared/models/Qwen3-8B (a hub id
#                 makes every rank of every node download it)
#   3. data:      python scripts/prepare_hotpotqa.py --out data/hotpotqa
#   4. retriever: a Search-R1 wiki-18 e5 server, or `tracerl serve-retriever --index DIR --host
#                 0.0.0.0 --port 8000`, reachable from every node (RETRIEVER=http://HOST:8000)
#   5. check:     tracerl doctor --model "$MODEL" --data data/hotpotqa --retriever "$RETRIEVER"
#
# Single node, 8 GPUs:
#   MODEL=/shared/models/Qwen3-8B bash scripts/train_qwen3_8b_hotpotqa.sh
# Check every flag and value (paths, retriever, TP) without starting anything (works on CPU):
#   bash scripts/train_qwen3_8b_hotpotqa.sh --check-only
# `tracerl` comes from VENV if set, else the activated venv, else the repository's .venv.
# Multi-node (here 2 x 8 GPUs): `ray start` from the activated venv on every node, then on the
# head, from the repository root (with --check-only: checked here, and the submit printed):
#   NODES=2 SUBMIT_ADDRESS=http://HEAD:8265 RETRIEVER=http://HEAD_IP:8000 \
#       MODEL=/shared/models/Qwen3-8B bash scripts/train_qwen3_8b_hotpotqa.sh
# Baselines at the same budget (equal leaves per step), e.g. GRPO:
#   ALLOC_ARGS="--alloc.name uniform --alloc.uniform.group-size 12" \
#       RUN=runs/qwen3-8b-hotpotqa-grpo \
#       bash scripts/train_qwen3_8b_hotpotqa.sh
# Resume after a crash: add `--ckpt.load_enable` (same RUN and CKPT).
#
# Arguments given to this script go before `--`: trace-rl flags (`tracerl train --backend
# openrlhf --help`), or OpenRLHF flags, which then override the ones below.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# the venv's own tracerl (and ray), whether or not a venv is activated: Ray's entrypoint and a
# shell without `source .venv/bin/activate` find no `tracerl` on PATH
VENV=${VENV:-${VIRTUAL_ENV:-$ROOT/.venv}}
TRACERL=$VENV/bin/tracerl
if [[ ! -x "$TRACERL" ]]; then
  echo "$0: no tracerl in the venv $VENV ($TRACERL is missing): run \`make install-gpu\`" \
    "(\`make install\` for --check-only on CPU) in $ROOT, or set VENV to the venv that has it" >&2
  exit 1
fi

# Every path is made absolute against the directory the script is started from: Ray places the
# trainer and the model actors on any node, in a working directory of its own, where a relative
# path would name another place. On several nodes they must lie on a shared filesystem.
absolute() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }
MODEL=${MODEL:-Qwen/Qwen3-8B}                # a directory (made absolute), or a hub id
if [[ -d "$MODEL" ]]; then
  MODEL=$(absolute "$MODEL")
  export HF_HUB_OFFLINE=1                    # a local model: no rank asks the hub for anything
fi
DATA=$(absolute "${DATA:-data/hotpotqa}")
RETRIEVER=${RETRIEVER:-http://127.0.0.1:8000}
RUN=$(absolute "${RUN:-runs/qwen3-8b-hotpotqa-trace}")
CKPT=$(absolute "${CKPT:-$RUN/ckpt}")        # OpenRLHF's DeepSpeed checkpoints
OUTPUT=$(absolute "${OUTPUT:-$RUN/model}")   # the final model (OpenRLHF's default is ./ckpt)
NODES=${NODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
TP=${TP:-2}                                  # vLLM tensor parallelism per engine
ENGINES=$((NODES * GPUS_PER_NODE / TP))      # colocated: one engine per TP GPUs
# Budget per step: PROMPTS x LEAVES_PER_PROMPT leaves (GRPO's cost at these flags). With
# 2 continuations per bare rollout, TRACE spends a third on roots (1024) and the rest on
# prefixes: our reading of the paper's "(1024, 2)" main setting (docs/openrlhf.md).
PROMPTS=${PROMPTS:-256}
LEAVES_PER_PROMPT=${LEAVES_PER_PROMPT:-12}
ALLOC_ARGS=${ALLOC_ARGS:-"--alloc.name trace --alloc.trace.continuations-per-rollout 2 --alloc.trace.max-per-prompt 16"}

TRACE_ARGS=(
  --retriever "$RETRIEVER"
  --loss.advantage tree_grpo
  --env.max-turns 4 --env.top-k 3 --env.reward em
  --env.retrieval-deadline-s 60              # a 256-query turn against a loaded wiki-18 server
  --run-dir "$RUN"
  --seed 0
)
OPENRLHF_ARGS=(
  --actor.model_name_or_path "$MODEL"
  --data.prompt_dataset "$DATA/train.jsonl" --data.apply_chat_template
  --eval.dataset "$DATA/eval.jsonl" --eval.steps 10 --eval.n_samples_per_prompt 1
  --eval.temperature 0
  --data.max_len 8192 --rollout.max_new_tokens 1024
  --rollout.temperature 1.0 --rollout.top_p 1.0
  --rollout.batch_size "$PROMPTS" --rollout.n_samples_per_prompt "$LEAVES_PER_PROMPT"
  --rollout.micro_batch_size 4
  --train.batch_size 512 --train.micro_batch_size 2 --train.max_epochs 1
  --train.num_episodes 1
  --actor.num_nodes "$NODES" --actor.num_gpus_per_node "$GPUS_PER_NODE"
  --ref.num_nodes "$NODES" --ref.num_gpus_per_node "$GPUS_PER_NODE"
  --train.colocate_all --vllm.enable_sleep --ds.enable_sleep
  --vllm.num_engines "$ENGINES" --vllm.tensor_parallel_size "$TP"
  --vllm.gpu_memory_utilization 0.6 --vllm.enable_prefix_caching --vllm.sync_backend nccl
  --ds.zero_stage 3 --ds.param_dtype bf16 --actor.gradient_checkpointing_enable
  --actor.adam.lr 1e-6 --actor.eps_clip 0.2
  --algo.kl.init_coef 0.001 --algo.kl.use_loss --algo.kl.estimator k3
  --ckpt.path "$CKPT" --ckpt.save_steps 20 --ckpt.output_dir "$OUTPUT"
  --logger.tensorboard_dir "$RUN/tensorboard"
)

# shellcheck disable=SC2206  # ALLOC_ARGS is a word list on purpose
COMMAND=("$TRACERL" train --backend openrlhf "${TRACE_ARGS[@]}" "$@" $ALLOC_ARGS -- "${OPENRLHF_ARGS[@]}")
if [[ -n "${SUBMIT_ADDRESS:-}" ]]; then
  # The entrypoint runs on the head node, in a working directory of Ray's: every path above is
  # absolute, `tracerl` is this venv's (the same repository path on every node), and the job's
  # runtime env carries what every worker needs. DATA, RUN and CKPT must be paths every node
  # can read and write (a shared filesystem), because Ray places the model actors anywhere.
  RUNTIME_ENV="{\"env_vars\": {\"HF_HUB_OFFLINE\": \"${HF_HUB_OFFLINE:-0}\", \"VLLM_NO_USAGE_STATS\": \"1\"}}"
  # the job runs the run: this script's arguments without the check-only ones, so the printed
  # submit line, pasted, starts training
  RUN_ARGS=()
  skip=0
  for arg in "$@"; do
    if ((skip)); then
      skip=0
      continue
    fi
    case "$arg" in
      --check-only | --rehearse-steps=*) ;;
      --rehearse-steps) skip=1 ;;
      *) RUN_ARGS+=("$arg") ;;
    esac
  done
  # shellcheck disable=SC2206  # ALLOC_ARGS is a word list on purpose
  SUBMIT=("$VENV/bin/ray" job submit --address="$SUBMIT_ADDRESS" --runtime-env-json="$RUNTIME_ENV"
    -- "$TRACERL" train --backend openrlhf "${TRACE_ARGS[@]}" "${RUN_ARGS[@]}" $ALLOC_ARGS
    -- "${OPENRLHF_ARGS[@]}")
  if [[ " $* " == *" --check-only "* ]]; then
    # checked here, on this machine: a submit would only start the check on the head
    "${COMMAND[@]}" || exit $?
    printf 'would submit: '
    printf '%q ' "${SUBMIT[@]}"
    echo
    exit 0
  fi
  COMMAND=("${SUBMIT[@]}")
fi
if [[ -n "${PRINT_ONLY:-}" ]]; then
  printf '%q ' "${COMMAND[@]}"
  echo
  exit 0
fi
exec "${COMMAND[@]}"
