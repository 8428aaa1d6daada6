"""`tracerl train --backend openrlhf`: tree-rollout RL on OpenRLHF's Ray + DeepSpeed + vLLM.

Command line: trace-rl's flags (`TreeTrainConfig`, parsed by tyro), then `--`, then OpenRLHF's
own flags, parsed by OpenRLHF 0.11.2's `openrlhf.cli.train_ppo_ray` parser itself:

    tracerl train --backend openrlhf --retriever http://127.0.0.1:8000 alloc:trace \\
        -- --actor.model_name_or_path Qwen/Qwen3-8B --data.prompt_dataset data/hotpotqa.jsonl \\
           --vllm.num_engines 4 --vllm.enable_prefix_caching ...

That parser only exists inside the `if __name__ == "__main__":` block of upstream's script, so
`parse_openrlhf_args` runs exactly that block (its argparse declarations and its checks), with
`train` swapped for a function that hands the parsed flags back. No OpenRLHF flag is declared a
second time here. Flags this launcher needs and the user did not give get a default
(`OPENRLHF_DEFAULTS`); settings that cannot work with precomputed tree advantages are refused
with one error listing all of them (`check_openrlhf_args`).

`launch` then builds what OpenRLHF's `train()` builds (strategy, vLLM engines, actor and
reference groups, optional colocation) and runs `TreePPOTrainer` instead of `PPOTrainer`. There
is no critic (tree advantages need none) and no reward model (the environment scores answers).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import inspect
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tyro

from harness.errors import HarnessError, Refused
from harness.openrlhf.config import TreeTrainConfig
from harness.training.config import renamed_flags
from harness.training.doctor import (
    Check,
    Probes,
    Target,
    check_model,
    check_retriever,
    check_shared_disk,
    compare_nodes,
    is_loopback_url,
    node_report,
)

__all__ = [
    "FLASH_ATTN_FREE_DEFAULTS",
    "OPENRLHF_DEFAULTS",
    "OPENRLHF_VERSION",
    "REWARD_PLACEHOLDER",
    "check_layout",
    "check_openrlhf_args",
    "driver_node_strategy",
    "launch",
    "main",
    "parse_args",
    "parse_openrlhf_args",
    "preflight_nodes",
    "ray_runtime_env",
    "refuse_failures",
    "run_size",
    "split_argv",
]

log = logging.getLogger(__name__)

OPENRLHF_VERSION = "0.11.2"
"""The OpenRLHF release this integration is written against (pinned in the `gpu` extra)."""

PROG = "tracerl train --backend openrlhf"

REWARD_PLACEHOLDER = "trace-rl:env"
"""`--reward.remote_url` value that tells OpenRLHF's checks rewards come with the samples (from the
environment), so no reward model is created. Its engines never call it."""

OPENRLHF_DEFAULTS: dict[str, str] = {
    "--data.input_key": "prompt",
    "--data.label_key": "task",
    "--reward.remote_url": REWARD_PLACEHOLDER,
    # any non-GAE name: GAE would make OpenRLHF create a critic; the estimator is not used
    "--algo.advantage.estimator": "reinforce",
}
"""OpenRLHF flags given on the user's behalf when absent (the prompt files of
`scripts/prepare_hotpotqa.py` have `prompt` and `task` columns)."""

FLASH_ATTN_FREE_DEFAULTS: dict[str, str] = {"--ds.attn_implementation": "sdpa"}
"""Also given when absent if flash-attn is not installed (`make install-gpu FLASH_ATTN=0`):
OpenRLHF's default, `flash_attention_2`, would fail in every model actor."""


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the first `--`: trace-rl's flags before, OpenRLHF's after.

    >>> split_argv(["--seed", "1", "--", "--train.seed", "2"])
    (['--seed', '1'], ['--train.seed', '2'])
    >>> split_argv(["--seed", "1"])
    (['--seed', '1'], [])
    """
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def _check_version() -> None:
    try:
        found = importlib.metadata.version("openrlhf")
    except importlib.metadata.PackageNotFoundError as err:
        raise HarnessError(
            f"OpenRLHF is not installed. On GPUs: `pip install 'trace-rl[gpu]'`; on CPU: "
            f"`pip install --no-deps openrlhf=={OPENRLHF_VERSION}` (see docs/openrlhf.md)"
        ) from err
    if found != OPENRLHF_VERSION:
        raise HarnessError(
            f"openrlhf {found} is installed, but trace-rl's trainer subclasses the internals of "
            f"openrlhf=={OPENRLHF_VERSION}; install that version (`pip install --no-deps "
            f"openrlhf=={OPENRLHF_VERSION}`)"
        )


def _with_defaults(argv: Sequence[str]) -> list[str]:
    from harness.training.openrlhf_compat import flash_attn_installed

    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    defaults = dict(OPENRLHF_DEFAULTS)
    if not flash_attn_installed():
        defaults.update(FLASH_ATTN_FREE_DEFAULTS)
    extra = [
        item for flag, value in defaults.items() if flag not in given for item in (flag, value)
    ]
    return [*argv, *extra]


def parse_openrlhf_args(argv: Sequence[str]) -> Any:
    """OpenRLHF's flags, parsed and checked by `openrlhf.cli.train_ppo_ray`'s own code.

    Args:
        argv: OpenRLHF flags (what follows `--`); `OPENRLHF_DEFAULTS` fill the gaps.

    Returns:
        The hierarchised namespace (`args.actor.model_name_or_path`, ...), after upstream's
        own validation.

    Raises:
        HarnessError: OpenRLHF is missing or not the pinned version, or its script changed shape.
        SystemExit: argparse's answer to a bad flag or `--help` (usage printed by argparse).
    """
    _check_version()
    from harness.training.openrlhf_compat import ensure_flash_attn

    ensure_flash_attn()
    import openrlhf.cli.train_ppo_ray as script

    block = next(
        (node for node in ast.parse(inspect.getsource(script)).body if _is_main_guard(node)), None
    )
    if block is None:
        raise HarnessError(
            f"{script.__file__} has no `if __name__ == '__main__':` block to take its parser from"
        )
    assert isinstance(block, ast.If)  # _is_main_guard matched it
    code = compile(ast.Module(body=block.body, type_ignores=[]), script.__file__, "exec")
    parsed: list[Any] = []
    namespace = dict(vars(script))
    namespace["train"] = parsed.append  # the block ends with train(args): keep args instead
    saved = sys.argv
    sys.argv = [f"{PROG} --", *_with_defaults(argv)]
    try:
        exec(code, namespace)  # upstream's own parser and checks, nothing else
    finally:
        sys.argv = saved
    if len(parsed) != 1:
        raise HarnessError(f"{script.__file__}'s main block did not reach train(args)")
    return parsed[0]


def _is_main_guard(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def check_openrlhf_args(args: Any) -> None:
    """Refuse OpenRLHF settings that cannot work with precomputed tree advantages.

    Raises:
        Refused: one reason per problem found, with what to do instead.
    """
    problems = []
    if not args.actor.model_name_or_path:
        problems.append("--actor.model_name_or_path is required")
    if not args.data.prompt_dataset:
        problems.append("--data.prompt_dataset is required (scripts/prepare_hotpotqa.py)")
    if not args.vllm.num_engines:
        problems.append("--vllm.num_engines must be >= 1: rollouts run on OpenRLHF's vLLM engines")
    if args.rollout.max_new_tokens is None:
        problems.append("--rollout.max_new_tokens is required: it is the per-turn action cap")
    if args.algo.advantage.estimator == "gae":
        problems.append(
            "--algo.advantage.estimator gae needs a critic; tree advantages need none "
            "(choose the tree advantage with trace-rl's --loss.advantage)"
        )
    if args.train.agent_func_path:
        problems.append("--train.agent_func_path: the tree engine is the agent; drop the flag")
    if args.reward.model_name_or_path:
        problems.append("--reward.model_name_or_path: rewards come from the environment")
    if args.reward.remote_url != [REWARD_PLACEHOLDER]:
        problems.append("--reward.remote_url: rewards come from the environment (leave it out)")
    if args.algo.dynamic_filtering_enable:
        problems.append(
            "--algo.dynamic_filtering_enable: use the allocator instead (alloc:dynamic-sampling)"
        )
    if (
        args.reward.overlong_buffer_len is not None
        or args.reward.stop_properly_penalty_coef is not None
    ):
        problems.append(
            "--reward.overlong_buffer_len / --reward.stop_properly_penalty_coef reshape scalar "
            "rewards, which tree advantages do not use"
        )
    if args.train.async_enable:
        problems.append("--train.async_enable is not supported by the tree trainer (synchronous)")
    if args.data.max_images_per_prompt:
        problems.append("--data.max_images_per_prompt: the search environment is text-only")
    if args.algo.kl.target:
        problems.append(
            "--algo.kl.target (adaptive KL) is refused until it is safe: OpenRLHF feeds the "
            "controller the step's logged `kl`, which its own code marks incompatible with this "
            "trainer, and the tree advantages read the coefficient; use a fixed "
            "--algo.kl.init_coef"
        )
    colocated = args.train.colocate_actor_ref or args.train.colocate_all
    ref_layout = (args.ref.num_nodes, args.ref.num_gpus_per_node)
    actor_layout = (args.actor.num_nodes, args.actor.num_gpus_per_node)
    if colocated and args.algo.kl.init_coef > 0 and ref_layout != actor_layout:
        problems.append(
            f"colocating the reference model (KL {args.algo.kl.init_coef}) needs its layout to "
            f"be the actor's: --ref.num_nodes x --ref.num_gpus_per_node = {ref_layout[0]} x "
            f"{ref_layout[1]}, actor {actor_layout[0]} x {actor_layout[1]} (they share one "
            "placement group)"
        )
    from harness.training.openrlhf_compat import flash_attn_installed

    if not flash_attn_installed():
        if args.ds.attn_implementation.startswith("flash_attention"):
            problems.append(
                f"--ds.attn_implementation {args.ds.attn_implementation} needs flash-attn, "
                "which is not installed: use sdpa (the default without flash-attn), or "
                "`make install-gpu` (FLASH_ATTN=1) to build it"
            )
        if args.ds.packing_samples:
            problems.append(
                "--ds.packing_samples needs flash-attn's variable-length kernels, which are not "
                "installed (packed samples would attend to each other under sdpa)"
            )
    from harness.openrlhf.experience import actor_ranks  # torch: only once flags are parsed

    ranks = actor_ranks(args)
    if args.train.batch_size % (args.rollout.micro_batch_size * ranks):
        problems.append(
            f"--train.batch_size {args.train.batch_size} must be a multiple of "
            f"--rollout.micro_batch_size x actor ranks = {args.rollout.micro_batch_size} x "
            f"{ranks}: then the zero-weight fillers that round a step's leaf count up never "
            "make up a whole optimizer step (whose loss would divide by zero tokens)"
        )
    if problems:
        raise Refused("OpenRLHF flags the tree trainer cannot use", problems)
    if not args.vllm.enable_prefix_caching:
        log.warning(
            "--vllm.enable_prefix_caching is off: every fork recomputes its shared prefix; "
            "turn it on for tree rollouts"
        )


def parse_args(argv: Sequence[str]) -> tuple[TreeTrainConfig, Any]:
    """Both halves of the command line: trace-rl's config and OpenRLHF's checked flags.

    Flags before `--` that tyro does not know are OpenRLHF's too, applied after the ones that
    follow `--` (argparse keeps the last value), so they override a launch script's settings;
    a typo gets OpenRLHF's "unrecognized arguments" error.

    Raises:
        HarnessError: see `parse_openrlhf_args` and `check_openrlhf_args`.
        SystemExit: a bad flag or `--help`.
    """
    ours, theirs = split_argv(argv)
    ours = renamed_flags(ours)
    config, unknown = tyro.cli(TreeTrainConfig, args=ours, return_unknown_args=True, prog=PROG)
    args = parse_openrlhf_args([*theirs, *unknown])
    check_openrlhf_args(args)
    if config.env_from_policy:
        config = _with_policy_env(config, args.actor.model_name_or_path, ours)
    return config, args


def _with_policy_env(
    config: TreeTrainConfig, policy_dir: str, argv: Sequence[str]
) -> TreeTrainConfig:
    """`config` with the env settings the policy's `policy_protocol.json` records.

    An `--env.*` flag in `argv` overrides its field (logged as an override); one warning names
    every field where the env played differs from the policy's. A policy without the file keeps
    `config` (an explicit `--env-from-policy` then is an error).

    Raises:
        HarnessError: `--env-from-policy` was given and the policy records no protocol, or the
            file is unreadable.
    """
    from harness.policies.policy_protocol import (
        ENV_FIELDS,
        PolicyProtocolError,
        read_policy_protocol,
    )

    try:
        protocol = read_policy_protocol(policy_dir) if Path(policy_dir).is_dir() else None
    except PolicyProtocolError as err:
        raise HarnessError(f"--env-from-policy: {err}") from err
    if protocol is None:
        if "--env-from-policy" in argv:
            raise HarnessError(
                f"--env-from-policy: {policy_dir} has no policy_protocol.json (nor a "
                "tiny_policy.json): only a policy trained here records its environment"
            )
        return config
    given = {a.split("=")[0].removeprefix("--env.").replace("-", "_") for a in argv}
    filled = {k: v for k, v in protocol.env_kwargs().items() if k not in given}
    env = dataclasses.replace(config.env, **filled)
    for name in sorted(set(ENV_FIELDS) & given):
        log.info("override: --env.%s %r", name.replace("_", "-"), getattr(env, name))
    differences = protocol.differences({k: getattr(env, k) for k in ENV_FIELDS})
    if differences:
        log.warning(
            "%s is played under a protocol that differs from its own: %s",
            policy_dir,
            "; ".join(differences),
        )
    return dataclasses.replace(config, env=env)


def launch(config: TreeTrainConfig, args: Any) -> None:
    """Build OpenRLHF's Ray actors and run `TreePPOTrainer` to the end (needs GPUs).

    What OpenRLHF's `train()` builds, minus the critic and reward model: the DeepSpeed strategy,
    the vLLM engines (with `processed_logprobs`, so rollout log-probs are those of the sampled
    distribution), the policy and reference groups (colocated if asked), then the trainer.
    """
    import ray
    from openrlhf.trainer.ray import create_vllm_engines
    from openrlhf.trainer.ray.launcher import RayActorGroup, ReferenceModelActor
    from openrlhf.utils import get_strategy
    from ray.util.placement_group import placement_group

    from harness.openrlhf.actor import TreePolicyModelActor
    from harness.openrlhf.tree_trainer import TreePPOTrainer

    if not ray.is_initialized():
        ray.init(runtime_env=ray_runtime_env(os.environ))
    preflight_nodes(
        Target(
            checkpoint_dir=Path(args.ckpt.path),
            model=args.actor.model_name_or_path,
            retriever=config.retriever,
            nodes=args.actor.num_nodes,
            shared_fs=config.shared_fs,
        )
    )
    strategy = get_strategy(args)
    strategy.print(args)
    n_actor_gpus = args.actor.num_nodes * args.actor.num_gpus_per_node
    shared = None
    if args.train.colocate_actor_ref or args.train.colocate_all:
        shared = placement_group([{"GPU": 1, "CPU": 1}] * n_actor_gpus, strategy="PACK")
        ray.get(shared.ready())
    if (
        args.train.colocate_all
        and n_actor_gpus != args.vllm.num_engines * args.vllm.tensor_parallel_size
    ):
        raise HarnessError(
            "--train.colocate_all needs actor GPUs == vllm.num_engines x vllm.tensor_parallel_size"
        )
    engines = create_vllm_engines(
        args.vllm.num_engines,
        args.vllm.tensor_parallel_size,
        args.actor.model_name_or_path,
        args.train.seed,
        args.train.full_determinism_enable,
        args.vllm.enable_prefix_caching,
        args.vllm.enforce_eager,
        args.data.max_len,
        shared if args.train.colocate_all else None,
        args.vllm.gpu_memory_utilization,
        args.vllm.enable_sleep,
        "processed_logprobs",
    )
    duplicates = args.ds.ring_attn_size * args.ds.tensor_parallel_size
    fraction = 0.2 if shared else 1
    actor = RayActorGroup(
        args.actor.num_nodes,
        args.actor.num_gpus_per_node,
        TreePolicyModelActor,
        pg=shared,
        num_gpus_per_actor=fraction,
        duplicate_actors=duplicates,
    )
    reference = None
    if args.algo.kl.init_coef > 0:
        reference = RayActorGroup(
            args.ref.num_nodes,
            args.ref.num_gpus_per_node,
            ReferenceModelActor,
            pg=shared,
            num_gpus_per_actor=fraction,
            duplicate_actors=duplicates,
        )
    trainer = TreePPOTrainer.options(scheduling_strategy=driver_node_strategy()).remote(
        args.actor.model_name_or_path,
        strategy,
        actor,
        None,
        None,
        reference,
        engines,
        config=config,
        do_sample=True,
        max_len=args.data.max_len,
        max_new_tokens=args.rollout.max_new_tokens,
        temperature=args.rollout.temperature,
        top_p=args.rollout.top_p,
    )
    max_steps = ray.get(trainer.get_max_steps.remote())
    refs = actor.async_init_model_from_pretrained(
        strategy, args.actor.model_name_or_path, max_steps, engines
    )
    if reference is not None:
        refs.extend(
            reference.async_init_model_from_pretrained(strategy, args.actor.model_name_or_path)
        )
    ray.get(refs)
    ray.get(trainer.fit.remote())
    ray.get(actor.async_save_model())


def check_layout(config: TreeTrainConfig, args: Any, probes: Probes | None = None) -> list[Check]:
    """Values, not only flags: what the cluster would refuse, found before anything starts.

    The model (with its weights) and the prompt files exist (when they are local paths), the
    retriever is no loopback address on several nodes and answers from here (a remote one that
    does not is a warning: the trainer's node may reach what this machine cannot), the folders
    the run writes lie on a shared filesystem on several nodes, and the vLLM tensor parallel
    size divides the GPUs per node and the model's attention heads.

    Args:
        config: trace-rl's flags.
        args: OpenRLHF's parsed flags.
        probes: `harness.training.doctor.Probes` (tests inject them); default this machine's.
    """
    probes = probes or Probes.local()
    nodes = int(args.actor.num_nodes)
    model = str(args.actor.model_name_or_path)
    target = Target(model=model, retriever=config.retriever, nodes=nodes)
    checks = [check_model(probes, target)]
    retriever = check_retriever(probes, target)
    unreachable = retriever.status == "fail" and "no answer" in retriever.detail
    if unreachable and not is_loopback_url(config.retriever):  # we may be off its network
        retriever = dataclasses.replace(retriever, status="warn")
    checks.append(retriever)
    for flag, value in (
        ("--data.prompt_dataset", args.data.prompt_dataset),
        ("--eval.dataset", args.eval.dataset),
    ):
        local = value and (str(value).startswith(("/", ".")) or Path(value).suffix in _DATA_FILES)
        if local and not Path(value).exists():
            checks.append(
                Check(
                    name="data",
                    status="fail",
                    detail=f"{flag} {value} does not exist",
                    fix="python scripts/prepare_hotpotqa.py --out DIR (DATA=DIR in the script)",
                )
            )
    for flag, folder in (
        ("--run-dir", config.run_dir),
        ("--ckpt.path", args.ckpt.path),
        ("--ckpt.output_dir", args.ckpt.output_dir),
    ):
        written = Target(checkpoint_dir=Path(folder), nodes=nodes, shared_fs=config.shared_fs)
        shared = check_shared_disk(probes, written)
        if shared.status in ("fail", "warn"):
            checks.append(dataclasses.replace(shared, detail=f"{flag} {shared.detail}"))
    tp, per_node = int(args.vllm.tensor_parallel_size), int(args.actor.num_gpus_per_node)
    if per_node % tp:
        checks.append(
            Check(
                name="tensor parallel",
                status="fail",
                detail=f"--vllm.tensor_parallel_size {tp} does not divide the {per_node} GPUs "
                "per node (--actor.num_gpus_per_node)",
                fix=f"TP = one of {[d for d in range(1, per_node + 1) if per_node % d == 0]}",
            )
        )
    heads = _attention_heads(model)
    if heads and any(h % tp and tp % h for h in heads):  # vLLM splits (or replicates) heads
        checks.append(
            Check(
                name="tensor parallel",
                status="fail",
                detail=f"--vllm.tensor_parallel_size {tp} does not split {model}'s "
                f"{heads[0]} attention heads ({heads[1]} key/value heads)",
                fix="a TP that divides the attention heads",
            )
        )
    return checks


_DATA_FILES = frozenset({".json", ".jsonl", ".parquet", ".csv", ".arrow"})


def _attention_heads(model: str) -> tuple[int, int] | None:
    """A local model's (attention heads, key/value heads) from its config.json, or None."""
    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    heads = config.get("num_attention_heads")
    if not isinstance(heads, int):
        return None
    return heads, int(config.get("num_key_value_heads") or heads)


def refuse_failures(checks: Sequence[Check], what: str) -> None:
    """Log the warnings; raise one error that lists every failure with its fix, one line each.

    Raises:
        Refused: at least one check failed.
    """
    for check in checks:
        if check.status == "warn":
            log.warning("%s", check.line())
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        raise Refused(
            f"{what} would fail",
            [f"{c.name}: {c.detail}" + (f" -> {c.fix}" if c.fix else "") for c in failed],
        )


def preflight_nodes(target: Target) -> None:
    """`tracerl doctor` on every alive Ray node, one task pinned to each, before anything starts.

    Every node answers `harness.training.doctor.node_report`; `compare_nodes` turns the answers into
    checks (the same Ray version as the driver's, each node's own failures).

    Raises:
        HarnessError: a node failed a check, with the node and the fix.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0)(node_report)
    refs = [
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote(
            dataclasses.replace(target, require_gpu=node.get("Resources", {}).get("GPU", 0) > 0)
        )
        for node in ray.nodes()
        if node.get("Alive")
    ]
    reports = ray.get(refs, timeout=600)
    log.info("preflight: %d nodes answered", len(reports))
    refuse_failures(compare_nodes(ray.__version__, reports), "the cluster's preflight")


def driver_node_strategy() -> Any:
    """A Ray scheduling strategy that puts an actor on the driver's own node.

    The trainer actor runs the environments, so it must reach the retriever the driver checked
    (a loopback URL on one node, for example); unpinned, Ray may place it on any node.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def ray_runtime_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The `runtime_env` of the run's `ray.init`: OpenRLHF's worker defaults, the flash-attn shim.

    Every Ray worker (model actors, vLLM engines, the trainer) gets OpenRLHF's environment
    defaults that `environ` does not set (one it sets comes from the job's runtime env or from
    the shell of `ray start`). Without flash-attn installed, every worker also
    runs `harness.training.openrlhf_compat.ensure_flash_attn` before anything else (Ray's worker
    set-up hook): OpenRLHF's model actors import `openrlhf.models`, which imports flash-attn's
    helpers at module level, and they never import trace-rl's modules that would install the
    stand-in.

    Args:
        environ: The driver's environment (`os.environ`).
    """
    from harness.training.openrlhf_compat import flash_attn_installed

    defaults = {
        "TOKENIZERS_PARALLELISM": "true",
        "NCCL_DEBUG": "WARN",
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
    }
    # a key the driver already has is left out: `ray job submit --runtime-env-json` may set it,
    # and Ray refuses a job whose runtime env and `ray.init`'s name the same key, equal or not
    runtime_env: dict[str, Any] = {
        "env_vars": {k: v for k, v in defaults.items() if k not in environ}
    }
    if not flash_attn_installed():
        runtime_env["worker_process_setup_hook"] = (
            "harness.training.openrlhf_compat.ensure_flash_attn"
        )
    return runtime_env


def main(argv: Sequence[str]) -> int:
    """Entry point of `tracerl train --backend openrlhf` (the `tracerl` table routes here).

    Args:
        argv: trace-rl's flags, `--`, OpenRLHF's flags (without `--backend openrlhf`).

    Returns:
        0 once training has finished and the model is saved.

    Raises:
        HarnessError: unusable flags, or OpenRLHF missing or at another version.
    """
    config, args = parse_args(argv)
    print(run_size(config, args), flush=True)  # the numbers that size a run, before it starts
    refuse_failures(check_layout(config, args), "the run's layout")
    if config.rehearse_steps:
        from harness.openrlhf.rehearsal import rehearse

        steps = rehearse(config, args, steps=config.rehearse_steps)
        for step in steps:
            print(step.line(), flush=True)
        print(
            f"rehearsal: {sum(s.n_signal for s in steps)} leaves with signal in {len(steps)} "
            f"steps ({', '.join(str(s.n_signal) for s in steps)})",
            flush=True,
        )
    if not config.check_only:
        launch(config, args)
    return 0


def run_size(config: TreeTrainConfig, args: Any) -> str:
    """One paragraph with the numbers that size a run (nanoGPT prints its own; so do we)."""
    from harness.openrlhf.experience import batch_unit  # torch: only once flags are parsed

    leaves = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    budget = (
        f"{leaves} leaves"
        if config.budget.currency == "leaves"
        else f"{config.budget.per_step} tokens"
    )
    return (
        f"{args.actor.model_name_or_path}: {type(config.alloc.build()).__name__} allocator, "
        f"{config.loss.advantage} advantages, {args.rollout.batch_size} prompts and {budget} "
        "per step, "
        f"samples padded to a multiple of {batch_unit(args)}; "
        f"actor {args.actor.num_nodes}x{args.actor.num_gpus_per_node} GPUs "
        f"(ZeRO-{args.ds.zero_stage}), "
        f"{args.vllm.num_engines} vLLM engines x TP{args.vllm.tensor_parallel_size}"
        f"{' (prefix caching)' if args.vllm.enable_prefix_caching else ''}; "
        f"{args.rollout.max_new_tokens} tokens per action, {args.data.max_len} per episode; "
        f"env: {config.env.max_turns} turns, {config.env.top_k} documents of at most "
        f"{config.env.max_doc_chars} characters, prompt {config.env.prompt_template!r}; "
        f"retriever {config.retriever}"
    )
