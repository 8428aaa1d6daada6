"""One-GPU check of the trainer half of the OpenRLHF path, in one process, without Ray or vLLM.

It runs OpenRLHF 0.11.2's own DeepSpeed policy actor (trace-rl's `TreePolicyModelActorBase`,
a subclass of upstream's `PolicyModelActor`) on the shipped tiny policy and the synthetic world,
with import-only stand-ins for Ray and vLLM (`harness/openrlhf/stand_ins/`; by default always: a
real Ray would be handed in-process values where it expects object refs). First it runs
`tracerl doctor`'s machine checks (driver, nvcc, ninja, gcc, Python headers, GPUs), then checks
in order:

1. `trace_step`: one TRACE step of trace-rl's tree engine on the device (the transformers
   backend, the smoke's settings, the policy's own environment): the exact leaf budget, at least
   one leaf with a training signal, advantages zero off the action tokens;
2. `actor`: `PolicyModelActor.init_model_from_pretrained` under ZeRO-3 (bf16, sdpa, NCCL at
   world size 1, DeepSpeed's FusedAdam);
3. `experience`: `TreeExperienceMaker.make_experience_batch` (OpenRLHF's actor forward) on the
   step's leaves and at least one filler; rollout and trainer log-probs compared on the action
   tokens; every logged per-sample value finite;
4. `ppo_step`: one `fit` (OpenRLHF's `ppo_train` with `PolicyLoss`): finite, non-zero loss and
   gradient norm, every logged metric finite, the weights moved, a positive learning rate;
5. `weight_gather`: `broadcast_to_vllm` through the CUDA-IPC path into a recording engine: every
   parameter gathered from its ZeRO-3 partitions at its full shape and dtype;
6. `checkpoint`: a DeepSpeed checkpoint and the tree state saved, the HF model saved and
   reloaded with the same logits, another step, then the checkpoint loaded back: the client
   states and the saved weights return.

It writes `OUT/gpu_check.json` and ends with `GPU TRAINER CHECK: PASS (...)`, or stops at the
first broken check with `GPU TRAINER CHECK: FAIL (stage: why)` and exit code 1; an exception
of any kind in a stage is that stage's failure, with its type and message (also under "failed"
in `gpu_check.json`).

`--device cpu` runs the same stages on CPU for the test suite, with an in-process stand-in for
the DeepSpeed actor (`CPUPolicyActor`: OpenRLHF's `Actor` and `PolicyLoss`, torch's AdamW),
because `PolicyModelActor` calls CUDA directly (`torch.cuda.set_device`, `current_device`,
`synchronize`, a `cuda:` replay buffer); so on CPU the stages test the stand-ins, the
orchestration and trace-rl's side, not DeepSpeed. How to run it on a bare GPU machine from a
folder of wheels: docs/openrlhf.md, "The one-GPU trainer check".

Usage: `tracerl gpu-check --out OUT [--device cuda|cpu]` (or `python -m harness.openrlhf.gpu_check`,
from a checkout whose packages are not installed).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["CheckFailed", "GpuCheckArgs", "command", "main", "run_stage"]

STAND_INS = Path(__file__).resolve().parent / "stand_ins"
POLICY = Path(__file__).resolve().parents[1] / "tiny_policy" / "warm_start"
PROMPTS = 8
"""Prompts in the TRACE step (2 leaves each: the smoke's budget of 16)."""
MODULES = (
    # on the machine already (CUDA torch, transformers and what they bring)
    *("torch", "transformers", "numpy", "scipy", "yaml", "jinja2", "httpx", "tqdm"),
    *("peft", "accelerate", "einops", "sympy", "aiohttp", "psutil", "PIL"),
    # from the folder of wheels (docs/openrlhf.md, "The one-GPU trainer check")
    *("deepspeed", "pydantic", "hjson", "msgpack", "cpuinfo", "openrlhf", "torchdata", "optree"),
    *("pylatexenc", "gymnasium", "cloudpickle", "tyro", "typeguard", "docstring_parser"),
    *("bm25s", "Stemmer", "msgspec", "faiss", "rich", "markdown_it", "mdurl", "pygments"),
)
"""Every top-level module the check imports (measured: its CPU run with the stand-ins, with
HF datasets, pandas, pyarrow, scikit-learn and numba blocked)."""
MAX_LOGPROB_GAP = 0.1
"""Largest mean |rollout - trainer| log-prob on action tokens (nats) that bf16 noise explains;
a shift by one token or a temperature applied twice gives several nats."""


@dataclass(frozen=True)
class GpuCheckArgs:
    """Options of the trainer check."""

    out: Path
    """Where `gpu_check.json`, the data, the checkpoints and the saved model go."""
    device: Literal["cuda", "cpu"] = "cuda"
    """`cpu`: the suite's run, with an in-process stand-in for the DeepSpeed actor."""
    stand_ins: Literal["auto", "always", "never"] = "always"
    """Put the Ray and vLLM stand-ins first on the import path: always (the check is one process
    by design: a real Ray would get in-process values where it expects object refs), when
    either is not installed (`auto`), or never."""
    zero_stage: int = 3
    """DeepSpeed ZeRO stage of the actor."""


class CheckFailed(RuntimeError):
    """A check did not hold; the message says which and with what values."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


# --- stand-ins ---------------------------------------------------------------------------------


def install_stand_ins(mode: str) -> bool:
    """Put `harness/openrlhf/stand_ins` first on `sys.path` if `mode` asks for it.

    Returns:
        Whether the stand-ins are in use.

    Raises:
        CheckFailed: Ray or vLLM was imported already (the stand-ins would not take effect).
    """
    missing = [m for m in ("ray", "vllm") if importlib.util.find_spec(m) is None]
    use = mode == "always" or (mode == "auto" and bool(missing))
    if use:
        _require(
            "ray" not in sys.modules and "vllm" not in sys.modules,
            "ray or vllm was imported before the stand-ins could be installed",
        )
        sys.path.insert(0, str(STAND_INS))
    return use


class RemoteMethod:
    """`handle.method.remote(...)` for an in-process object: the call itself.

    With the Ray stand-in, a value is its own reference.
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        self.remote = function


class RecordingEngine:
    """Stands in for a vLLM `RolloutRayActor` during the weight sync: records each update."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any, tuple[int, ...]]] = []
        self.n_cache_resets = 0
        self.update_weight_cuda_ipc = RemoteMethod(self._update)
        self.update_weight = RemoteMethod(self._update)
        self.reset_prefix_cache = RemoteMethod(self._reset)

    def _update(self, name: str, dtype: Any, shape: Any, **kwargs: Any) -> None:
        self.updates.append((name, dtype, tuple(shape)))

    def _reset(self) -> None:
        self.n_cache_resets += 1


class LocalGroup:
    """In-process stand-in for OpenRLHF's `RayActorGroup` of one rank."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def async_run_method(self, method_name: str, **kwargs: Any) -> list[Any]:
        """One result per rank."""
        return [getattr(self.actor, method_name)(**kwargs)]

    def async_run_method_batch(self, method_name: str, **kwargs: Any) -> list[list[Any]]:
        """One list of results per rank, one per item."""
        n = len(next(iter(kwargs.values())))
        method = getattr(self.actor, method_name)
        return [[method(**{k: v[i] for k, v in kwargs.items()}) for i in range(n)]]


# --- the CPU stand-in for the DeepSpeed actor ---------------------------------------------------


class CPUPolicyActor:
    """`PolicyModelActor`'s interface on CPU (not DeepSpeed).

    OpenRLHF's `Actor`, `PolicyLoss` and loss normalisers, and torch's AdamW.
    """

    def __init__(self, strategy: Any, pretrain: str, vllm_engines: list[Any]) -> None:
        import torch
        from openrlhf.models import Actor, PolicyLoss
        from openrlhf.utils.utils import get_tokenizer

        self.strategy = strategy
        self.args = strategy.args
        self.pretrain = pretrain
        self.vllm_engines = vllm_engines
        from transformers import AutoModelForCausalLM

        # float32, which `Actor`'s own loader does not offer; `Actor` wraps a module as it is
        self.model = Actor(
            AutoModelForCausalLM.from_pretrained(
                pretrain, dtype=torch.float32, attn_implementation="sdpa"
            )
        )
        self.model.packing_samples = False  # set by the loader only
        self.model.is_vlm = False
        self.tokenizer = get_tokenizer(pretrain, self.model.model, "left", strategy)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.args.actor.adam.lr)
        self.loss = PolicyLoss()
        self.buffer: list[Any] = []

    def forward(self, sequences: Any, action_mask: Any, attention_mask: Any, **_: Any) -> Any:
        """Action log-probs, as `PolicyModelActor.forward`."""
        import torch

        with torch.no_grad():
            return self.model(sequences, action_mask, attention_mask=attention_mask)

    def empty_cache(self) -> None:
        """Nothing to free on CPU."""

    def reload_states(self) -> None:
        """Nothing offloaded on CPU."""

    def offload_states(self) -> None:
        """Nothing to offload on CPU."""

    def append(self, experience: Any) -> None:
        """Into the replay buffer, one micro-batch at a time."""
        self.buffer.append(experience)

    def fit(self, kl_ctl: float = 0.0) -> dict[str, float]:
        """One pass over the buffer, one optimizer step over all of it (token-mean loss)."""
        import torch
        from openrlhf.utils.loss_utils import _optimizer_step_loss_norm

        from harness.openrlhf.actor import finite_filler_metrics

        norm = _optimizer_step_loss_norm([e.action_mask for e in self.buffer], None, 1, 1)
        sums: dict[str, float] = {}
        n_tokens = 0.0
        for exp in self.buffer:
            log_probs = self.model(
                exp.sequences, exp.action_mask, attention_mask=exp.attention_mask
            )
            loss, clip_ratio, ppo_kl, _, _ = self.loss(
                log_probs, exp.action_log_probs, exp.advantages, action_mask=exp.action_mask, **norm
            )
            loss.backward()
            status = finite_filler_metrics(
                {
                    "metrics": {"ppo_kl": ppo_kl.detach(), "ppo_clip_ratio": clip_ratio.detach()},
                    "weights": {"ppo_kl": "token", "ppo_clip_ratio": "token"},
                    "num_action_tokens": float(exp.action_mask.sum()),
                }
            )
            tokens = status["num_action_tokens"]
            for key, value in status["metrics"].items():
                sums[key] = sums.get(key, 0.0) + float(value) * tokens
            sums["policy_loss"] = sums.get("policy_loss", 0.0) + loss.item()
            n_tokens += tokens
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.buffer = []
        status_mean = {k: v / max(n_tokens, 1.0) for k, v in sums.items() if k != "policy_loss"}
        status_mean["policy_loss"] = sums["policy_loss"]
        status_mean["actor_grad_norm"] = grad_norm
        status_mean["actor_lr"] = float(self.optimizer.param_groups[0]["lr"])
        return status_mean

    def broadcast_to_vllm(self) -> None:
        """Every parameter to every engine, by name, as the CUDA-IPC sync names them."""
        params = list(self.model.model.named_parameters())
        for count, (name, param) in enumerate(params, start=1):
            for engine in self.vllm_engines:
                engine.update_weight_cuda_ipc.remote(
                    name, dtype=param.dtype, shape=param.shape, empty_cache=count == len(params)
                )

    def save_checkpoint(self, tag: str, client_states: dict[str, Any] | None = None) -> None:
        """Model, optimizer and client states under `ckpt.path/_actor/tag`."""
        import torch

        folder = Path(self.args.ckpt.path) / "_actor" / tag
        folder.mkdir(parents=True, exist_ok=True)
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "client_states": client_states or {},
        }
        torch.save(state, folder / "state.pt")
        (Path(self.args.ckpt.path) / "_actor" / "latest").write_text(tag)

    def load_checkpoint(self) -> dict[str, Any]:
        """The latest checkpoint back into the model and optimizer; returns its client states."""
        import torch

        root = Path(self.args.ckpt.path) / "_actor"
        state = torch.load(root / (root / "latest").read_text() / "state.pt", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        return state["client_states"]

    def save_model(self) -> None:
        """The HF model and tokenizer to `ckpt.output_dir`."""
        self.model.model.save_pretrained(self.args.ckpt.output_dir)
        self.tokenizer.save_pretrained(self.args.ckpt.output_dir)

    def weights(self) -> dict[str, Any]:
        """Every parameter, whole, on CPU."""
        return {n: p.detach().clone() for n, p in self.model.model.named_parameters()}

    def logits(self, input_ids: Any) -> Any:
        """The policy's logits for `input_ids` `(1, T)`."""
        import torch

        with torch.no_grad():
            return self.model.model(input_ids).logits.float()


# --- helpers for the DeepSpeed actor -----------------------------------------------------------


def ds_weights(actor: Any) -> dict[str, Any]:
    """Every parameter of a DeepSpeed actor, gathered from its ZeRO partitions, on CPU."""
    import deepspeed

    module = actor.actor.model.module
    out = {}
    for name, param in module.named_parameters():
        with deepspeed.zero.GatheredParameters([param], enabled=hasattr(param, "ds_shape")):
            out[name] = param.detach().float().cpu().clone()
    return out


def ds_logits(actor: Any, input_ids: Any) -> Any:
    """The DeepSpeed model's logits for `input_ids` `(1, T)` (a forward under ZeRO-3 gathers)."""
    import torch

    with torch.no_grad():
        return actor.actor.model.module(input_ids.cuda()).logits.float().cpu()


def ds_load_checkpoint(actor: Any) -> dict[str, Any]:
    """OpenRLHF's checkpoint loading, as `PolicyModelActor` does it with --ckpt.load_enable."""
    _, states = actor.strategy.load_ckpt(
        actor.actor.model, os.path.join(actor.strategy.args.ckpt.path, "_actor")
    )
    return states


# --- the check ---------------------------------------------------------------------------------


def check_args(out: Path, zero_stage: int, device: str) -> list[str]:
    """The command line the check parses: the smoke's settings, one GPU, ZeRO-`zero_stage`."""
    data = out / "data"
    return [
        *("--retriever", str(data / "index"), "--run-dir", str(out / "run"), "--seed", "0"),
        *("--env-from-policy", "--env.reward", "em"),
        *("--alloc.name", "trace", "--alloc.trace.continuations-per-rollout", "1", "--"),
        *("--actor.model_name_or_path", str(POLICY)),
        *("--data.prompt_dataset", str(data / "train.jsonl"), "--data.max_samples", str(PROMPTS)),
        *("--data.max_len", "1024", "--rollout.max_new_tokens", "48"),
        *("--rollout.temperature", "1.0", "--rollout.batch_size", str(PROMPTS)),
        *("--rollout.n_samples_per_prompt", "2", "--rollout.micro_batch_size", "4"),
        *("--train.batch_size", "16", "--train.micro_batch_size", "4"),
        *("--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1"),
        *("--train.colocate_all", "--vllm.num_engines", "1", "--vllm.enable_prefix_caching"),
        *(("--ds.enable_sleep",) if device == "cuda" else ()),
        *("--ds.zero_stage", str(zero_stage), "--ds.param_dtype", "bf16"),
        *("--ds.attn_implementation", "sdpa", "--actor.adam.lr", "1e-4"),
        *("--actor.lr_warmup_ratio", "0", "--algo.kl.init_coef", "0"),
        *("--ckpt.path", str(out / "ckpt"), "--ckpt.output_dir", str(out / "model")),
    ]


def _all_finite(values: dict[str, Any]) -> list[str]:
    """Keys of numeric values that are not finite."""
    return [k for k, v in values.items() if isinstance(v, int | float) and not math.isfinite(v)]


def run_checks(
    args: GpuCheckArgs, report: dict[str, Any]
) -> Iterator[tuple[str, Callable[[], dict]]]:
    """The stages, in order, as (name, function returning that stage's figures)."""
    import torch

    from harness.openrlhf.experience import pad_to_multiple
    from harness.openrlhf.launcher import parse_args
    from harness.openrlhf.rehearsal import read_prompt_file, tree_step_generator

    state: dict[str, Any] = {}
    out = args.out
    cuda = args.device == "cuda"

    def trace_step() -> dict[str, Any]:
        from harness.openrlhf import smoke_data  # the smoke's synthetic world and index

        smoke_data.main(smoke_data.SmokeDataArgs(out=out / "data", n_train=PROMPTS, n_eval=0))
        config, oargs = parse_args(check_args(out, args.zero_stage, args.device))
        prompts = read_prompt_file(oargs)
        generator = tree_step_generator(
            config,
            oargs,
            prompts,
            device=args.device,
            dtype="bfloat16" if cuda else "float32",
        )
        experiences = generator.run_tree_step(prompts.prompts, prompts.labels)
        metrics = generator.last_metrics
        _require(metrics["budget/leaves"] == 16, f"budget not exact: {metrics['budget/leaves']}")
        real = [e for e in experiences if not float(e.info["filler"][0])]
        _require(len(real) > 0, "no leaf with a training signal in the TRACE step")
        for exp in real:
            off = exp.advantages[exp.action_mask == 0]
            _require(bool(torch.all(off == 0)), "advantages are not zero off the action tokens")
            _require(int(exp.action_mask[0, 0]) == 0, "a prompt token is marked as an action")
        # at least one filler, so that its path (finite logs, no loss) runs on the device
        if len(real) == len(experiences):
            experiences = pad_to_multiple(real[:-1], generator.unit)
        state.update(config=config, args=oargs, generator=generator, experiences=experiences)
        return {
            "leaves": metrics["budget/leaves"],
            "leaves_with_signal": len(real),
            "samples": len(experiences),
            "fillers": sum(int(float(e.info["filler"][0])) for e in experiences),
            "reward": metrics["rollout/reward"],
        }

    def actor() -> dict[str, Any]:
        from openrlhf.utils import get_strategy

        from harness.openrlhf.actor import tree_steps

        strategy = get_strategy(state["args"])
        engine = RecordingEngine()
        policy: Any
        weights: Callable[[Any], dict[str, Any]]
        logits: Callable[[Any, Any], Any]
        if cuda:
            from harness.openrlhf.actor import TreePolicyModelActorBase

            policy = TreePolicyModelActorBase(1, 0, None, None)
            max_steps = tree_steps(PROMPTS, PROMPTS, 1) + 1  # the step, and one more after saving
            policy.init_model_from_pretrained(strategy, str(POLICY), max_steps, [engine])
            weights, logits = ds_weights, ds_logits
        else:
            policy = CPUPolicyActor(strategy, str(POLICY), [engine])
            weights, logits = CPUPolicyActor.weights, CPUPolicyActor.logits
        state.update(strategy=strategy, engine=engine, actor=policy, weights=weights, logits=logits)
        state["before"] = weights(policy)
        return {
            "tensors": len(state["before"]),
            "parameters": sum(w.numel() for w in state["before"].values()),
        }

    def experience() -> dict[str, Any]:
        from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

        from harness.openrlhf.experience_maker import TreeExperienceMaker

        tokenizer = state["generator"].tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        maker = TreeExperienceMaker(
            LocalGroup(state["actor"]),
            None,
            None,
            None,
            FixedKLController(0.0),
            state["strategy"],
            tokenizer,
        )
        made = maker.make_experience_batch(state["experiences"])
        gaps, n_tokens = 0.0, 0
        for exp in made:
            mask = exp.action_mask.bool()
            rollout = exp.rollout_log_probs.float()
            trainer = exp.action_log_probs.float().cpu()
            gaps += float((rollout - trainer).abs()[mask].sum())
            n_tokens += int(mask.sum())
            for key in ("kl", "logprobs_diff"):
                _require(bool(torch.isfinite(exp.info[key]).all()), f"info[{key!r}] not finite")
        gap = gaps / max(n_tokens, 1)
        _require(gap < MAX_LOGPROB_GAP, f"rollout and trainer log-probs differ by {gap:.3f} nats")
        state["made"] = made
        return {"micro_batches": len(made), "action_tokens": n_tokens, "mean_logprob_gap": gap}

    def ppo_step() -> dict[str, Any]:
        policy = state["actor"]
        for exp in state["made"]:
            policy.append(exp)
        policy.reload_states()
        status = policy.fit(0.0)
        policy.offload_states()
        _require(not _all_finite(status), f"metrics not finite: {_all_finite(status)}")
        _require(status["policy_loss"] != 0.0, "the policy loss is exactly 0")
        _require(status["actor_grad_norm"] > 0.0, "the gradient norm is 0")
        _require(status.get("actor_lr", 0.0) > 0.0, f"learning rate {status.get('actor_lr')}")
        after = state["weights"](policy)
        moved = sum(not torch.equal(after[n], w) for n, w in state["before"].items())
        _require(moved > 0, "no parameter moved")
        state["after"] = after
        keys = ("policy_loss", "actor_grad_norm", "actor_lr", "ppo_kl", "ppo_clip_ratio", "kl")
        return {k: float(status[k]) for k in keys if k in status} | {"parameters_moved": moved}

    def weight_gather() -> dict[str, Any]:
        from transformers import AutoConfig, AutoModelForCausalLM

        engine = state["engine"]
        state["actor"].broadcast_to_vllm()
        hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(POLICY))
        expected = {n: tuple(p.shape) for n, p in hf.named_parameters()}  # tied lm_head once
        got = {name: shape for name, _, shape in engine.updates}
        _require(got == expected, f"synced {sorted(set(got) ^ set(expected))[:5]} differ")
        dtypes = sorted({str(dtype) for _, dtype, _ in engine.updates})
        if cuda:
            _require(dtypes == ["torch.bfloat16"], f"synced dtypes {dtypes}")
        return {
            "tensors": len(engine.updates),
            "dtypes": dtypes,
            "cache_resets": engine.n_cache_resets,
        }

    def checkpoint() -> dict[str, Any]:
        from transformers import AutoModelForCausalLM

        policy, generator = state["actor"], state["generator"]
        client = {"episode": 0, "global_step": 1, "total_consumed_prompts": PROMPTS}
        tree_dir = out / "run" / "checkpoints" / "global_step1"
        generator.save_state(tree_dir)
        policy.save_checkpoint("global_step1", client_states=client)
        policy.save_model()
        saved = state["after"]
        reloaded = AutoModelForCausalLM.from_pretrained(
            state["args"].ckpt.output_dir, dtype=torch.bfloat16 if cuda else torch.float32
        )
        ids = state["experiences"][0].sequences[:, :64]
        if cuda:
            reloaded = reloaded.cuda()
        with torch.no_grad():
            hf_logits = reloaded(ids.to(reloaded.device)).logits.float().cpu()
        logit_gap = float((hf_logits - state["logits"](policy, ids)).abs().max())
        _require(logit_gap < 0.05, f"the saved model's logits differ by {logit_gap:.4f}")
        # train once more, then load the checkpoint back
        for exp in state["made"]:
            policy.append(exp)
        policy.reload_states()
        policy.fit(0.0)  # states stay loaded for the checkpoint to come back into
        states = ds_load_checkpoint(policy) if cuda else policy.load_checkpoint()
        _require(
            all(states.get(k) == v for k, v in client.items()), f"client states came back {states}"
        )
        back = state["weights"](policy)
        _require(all(torch.equal(back[n], w) for n, w in saved.items()), "weights did not reload")
        rng_before = generator.tree_step.rng.bit_generator.state
        generator.tree_step.rng.integers(10, size=3)
        generator.load_state(tree_dir)
        _require(
            generator.tree_step.rng.bit_generator.state == rng_before, "tree state did not reload"
        )
        return {"saved_logit_gap": logit_gap, "client_states": sorted(client)}

    yield from [
        ("trace_step", trace_step),
        ("actor", actor),
        ("experience", experience),
        ("ppo_step", ppo_step),
        ("weight_gather", weight_gather),
        ("checkpoint", checkpoint),
    ]


def versions(stand_ins: bool) -> dict[str, Any]:
    """Versions of what the check runs on, and the device."""
    import torch

    found: dict[str, Any] = {"python": sys.version.split()[0], "stand_ins": stand_ins}
    for name in ("torch", "transformers", "deepspeed", "openrlhf", "ray", "vllm", "flash_attn"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    found["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        found["device"] = torch.cuda.get_device_name(0)
        found["capability"] = list(torch.cuda.get_device_capability(0))
    return found


def run_stage(name: str, stage: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One stage's figures; any error it raises becomes a `CheckFailed` named by the stage.

    Raises:
        CheckFailed: `"name: why"`, for a check that did not hold or any other exception.
    """
    try:
        return stage()
    except CheckFailed as err:
        raise CheckFailed(f"{name}: {err}") from err
    except Exception as err:  # a crash is this stage's failure too, with its type and message
        first = next((line for line in str(err).splitlines() if line.strip()), "")
        raise CheckFailed(f"{name}: {type(err).__name__}: {first[:500]}") from err


def toolchain(device: str) -> dict[str, Any]:
    """`tracerl doctor`'s machine checks (driver, nvcc, ninja, gcc, Python headers, GPUs).

    The stages after `trace_step` build DeepSpeed's FusedAdam just in time; a missing piece is
    named here with its fix instead of deep in a build log. On CPU the GPU checks are skipped.

    Raises:
        CheckFailed: the first failed check's line.
    """
    from harness.training.doctor import TOOLCHAIN, Probes, Target

    probes, target = Probes.local(), Target(require_gpu=device == "cuda")
    checks = [check(probes, target) for check in TOOLCHAIN]
    failed = [c for c in checks if c.status == "fail"]
    _require(not failed, failed[0].line() if failed else "")
    return {c.name: c.status for c in checks}


def main(args: GpuCheckArgs) -> dict[str, Any]:
    """Run every stage; return the report (also written to `OUT/gpu_check.json`).

    Raises:
        CheckFailed: the first check that did not hold.
    """
    start = time.perf_counter()
    stand_ins = install_stand_ins(args.stand_ins)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    missing = [m for m in MODULES if importlib.util.find_spec(m) is None]
    _require(
        not missing,
        f"not installed here: {', '.join(missing)}; add their wheels to the folder "
        "(docs/openrlhf.md, 'The one-GPU trainer check')",
    )
    report_doctor = run_stage("doctor", lambda: toolchain(args.device))
    from harness.training.openrlhf_compat import ensure_flash_attn

    ensure_flash_attn()
    import torch

    _require(args.device == "cpu" or torch.cuda.is_available(), "torch sees no CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "versions": versions(stand_ins),
        "doctor": report_doctor,
        "stages": {},
        "passed": False,
    }
    try:
        for name, stage in run_checks(args, report):
            t0 = time.perf_counter()
            figures = run_stage(name, stage)
            report["stages"][name] = {**figures, "seconds": round(time.perf_counter() - t0, 2)}
            print(f"{name}: {json.dumps(report['stages'][name], default=str)}", flush=True)
        report["passed"] = True
    except CheckFailed as failure:
        report["failed"] = str(failure)  # "stage: why", as the FAIL line says
        raise
    finally:
        report["seconds"] = round(time.perf_counter() - start, 1)
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def command(argv: list[str]) -> int:
    """`tracerl gpu-check`: every stage, then one `GPU TRAINER CHECK: PASS|FAIL (...)` line."""
    import tyro

    arguments = tyro.cli(GpuCheckArgs, args=argv, prog="tracerl gpu-check")
    try:
        result = main(arguments)
    except CheckFailed as failure:
        print(f"GPU TRAINER CHECK: FAIL ({failure})", flush=True)
        return 1
    except Exception as failure:  # before the stages: imports, the device
        print(f"GPU TRAINER CHECK: FAIL (setup: {type(failure).__name__}: {failure})", flush=True)
        return 1
    print(f"GPU TRAINER CHECK: PASS ({result['seconds']} s on {arguments.device})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(command(sys.argv[1:]))
