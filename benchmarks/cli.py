"""The `tracerl` command line.

`COMMANDS` maps each subcommand to a `"module:function"` string that is imported only when that
command runs, as Gymnasium resolves an `entry_point`. So `tracerl --help` imports no torch, and
the table adds no import edge between packages. Each package keeps its commands in its own
`cli.py`; a command function takes the remaining argv and returns an exit code (or None for 0).

`main` turns an error that escapes a command into one line on stderr: exit code 2 for bad input
(a trace-rl typed error, a `ValueError`, an `OSError`, a `LookupError`, or a command's own
`SystemExit` message), 1 for anything else. `-v` shows the traceback instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import io
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, cast

import tyro

from harness.doctor import Target

__all__ = ["COMMANDS", "main"]

# name -> (entry point, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "harness.evaluation.demo:demo",
        "main job: world, tiny policy, TRACE training, before/after eval",
    ),
    "demo-env": ("envs.cli:demo_env", "run the scripted agents on the default synthetic world"),
    "world": ("envs.cli:world", "generate a synthetic world and export its corpus and questions"),
    "index": (
        "retrieval.cli:index",
        "build, search, compress or measure an index (`index build|search|compress|stats`)",
    ),
    "serve-retriever": (
        "retrieval.cli:serve_retriever",
        "serve an index over Search-R1's HTTP API",
    ),
    "bench": (
        "harness.evaluation.bench:bench",
        "evaluate an agent on a QA dataset (EM / sub-EM / F1)",
    ),
    "corpus": (
        "harness.evaluation.bench:corpus",
        "build a retrieval corpus from datasets' paragraphs",
    ),
    "tree": (
        "harness.evaluation.tree_view:tree",
        "render a rollout tree as text or a picture (`tree show`)",
    ),
    "init-model": (
        "benchmarks.cli:init_model",
        "train the tokenizer and warm-start the tiny policy",
    ),
    "train": (
        "benchmarks.cli:train",
        "RL training with tree rollouts (CPU, or --backend openrlhf)",
    ),
    "plot": ("benchmarks.cli:plot", "plot the curves of a training run"),
    "doctor": (
        "benchmarks.cli:doctor",
        "check the machine, toolchain and a run's layout before a GPU run (--json)",
    ),
}

log = logging.getLogger("tracerl")

_OWN_PACKAGES = frozenset({"envs", "retrieval", "harness", "benchmarks", "trace_alloc"})
_USAGE_ERROR = 2  # argparse's and tyro's exit code for bad input


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        "usage: tracerl [-v|-q] COMMAND [ARGS...]",
        "",
        "Agentic RL on search/QA with forkable environments and TRACE rollout allocation.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "Run `tracerl COMMAND --help` for a command's options."]
    return "\n".join(lines)


def resolve(name: str) -> Callable[[list[str]], int | None]:
    """Import and return the function behind a command name.

    Raises:
        SystemExit: for an unknown name, with the closest valid names.
    """
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise SystemExit(f"tracerl: unknown command {name!r}.{hint} Run `tracerl --help`.")
    module_name, func_name = COMMANDS[name][0].split(":")
    return getattr(importlib.import_module(module_name), func_name)


class AboveBars(io.TextIOBase):
    """stderr through `tqdm.write`: a log line goes above the bars, never into a bar's line."""

    def write(self, text: str) -> int:
        from tqdm import tqdm

        tqdm.write(text, file=sys.stderr, end="")
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def _setup_logging(level: int) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    # stderr, so that stdout carries only a command's output (`--json`'s last line stays parseable)
    handler = RichHandler(
        console=Console(file=cast("IO[str]", AboveBars())),
        show_path=False,
        rich_tracebacks=False,
        markup=False,
    )
    # the handler filters too: bm25s sets its own logger to DEBUG at import, which the root
    # level alone would let through to the user
    handler.setLevel(level)
    if level > logging.DEBUG:
        # httpx logs every request at INFO: a line per search step of an env on a remote index
        logging.getLogger("httpx").setLevel(logging.WARNING)
        # faiss logs each CPU-feature variant it tries at import: eight lines before any output
        logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    logging.basicConfig(level=level, format="%(message)s", datefmt="[%X]", handlers=[handler])


def _split_backend(argv: list[str]) -> tuple[str, list[str]]:
    """Take `--backend NAME` (or `--backend=NAME`) out of argv; the default is transformers."""
    rest, backend, i = [], "transformers", 0
    while i < len(argv):
        if argv[i] == "--backend" and i + 1 < len(argv):
            backend, i = argv[i + 1], i + 2
        elif argv[i].startswith("--backend="):
            backend, i = argv[i].split("=", 1)[1], i + 1
        elif argv[i] == "--":  # everything after belongs to OpenRLHF's own parser
            rest += argv[i:]
            break
        else:
            rest.append(argv[i])
            i += 1
    return backend, rest


def train(argv: list[str]) -> int:
    """`tracerl train`: CPU RL with tree rollouts, or `--backend openrlhf` on GPUs.

    `--resume` continues the run in `--run-dir` from its latest checkpoint with the config saved
    there; flags given on the command line override it (e.g. a larger `--steps`).
    """
    backend, argv = _split_backend(list(argv))
    if backend == "openrlhf":
        from harness.openrlhf.launcher import main as launch_openrlhf

        return launch_openrlhf(argv)
    if backend != "transformers":
        raise SystemExit(f"tracerl train: --backend {backend!r}: choose transformers or openrlhf")
    from harness.config import TrainConfig, load_config
    from harness.trainer import train as run_training

    config = tyro.cli(TrainConfig, args=argv, prog="tracerl train")
    if config.resume:
        saved = dataclasses.replace(load_config(config.run_dir), resume=True)
        config = tyro.cli(TrainConfig, args=argv, prog="tracerl train", default=saved)
    summary = run_training(config)
    final = summary.final
    log.info(
        "finished step %d in %.0f s: reward %.3f, effective ratio %.2f; policy in %s",
        summary.steps,
        summary.wall_s,
        final.get("rollout/reward", float("nan")),
        final.get("rollout/effective_ratio", float("nan")),
        summary.policy_dir,
    )
    return 0


@dataclasses.dataclass(frozen=True)
class PlotConfig:
    """`tracerl plot RUN_DIR`: draw a training run's curves into a PNG."""

    run_dir: tyro.conf.Positional[Path]
    """A `tracerl train` run directory."""
    out: Path | None = None
    """Image path; unset: RUN_DIR/curves.png."""


def plot(argv: list[str]) -> int:
    """`tracerl plot RUN_DIR`: the curves of a training run (matplotlib PNG)."""
    from harness.metrics_log import plot_run

    config = tyro.cli(PlotConfig, args=argv, prog="tracerl plot")
    path = plot_run(config.run_dir, config.out)
    print(path)
    return 0


@dataclasses.dataclass(frozen=True)
class DoctorConfig:
    """`tracerl doctor`: check this machine, its toolchain and a run's layout (docs/openrlhf.md)."""

    target: tyro.conf.OmitArgPrefixes[Target] = dataclasses.field(default_factory=Target)
    json: bool = False
    """Print one JSON object instead of lines."""


def doctor(argv: list[str]) -> int:
    """`tracerl doctor`: one line per check, each failure with its fix; exit 1 on a failure."""
    from harness.doctor import Probes, format_report, run_checks

    config = tyro.cli(DoctorConfig, args=argv, prog="tracerl doctor")
    checks = run_checks(Probes.local(), config.target)
    failed = any(c.status == "fail" for c in checks)
    if config.json:
        rows = [dataclasses.asdict(c) for c in checks]
        print(json.dumps({"ok": not failed, "checks": rows}, indent=2))
    else:
        print(format_report(checks))
    return 1 if failed else 0


def init_model(argv: list[str]) -> int:
    """`tracerl init-model`: train the tokenizer and warm-start the tiny policy (cached)."""
    import tyro
    from rich.console import Console

    from harness.tiny_policy import InitModelArgs, summary_table
    from harness.tiny_policy import init_model as build_policy

    args = tyro.cli(InitModelArgs, args=argv, prog="tracerl init-model")
    artifacts = build_policy(args.policy, args.run_dir, force=args.force, progress=args.progress)
    Console().print(summary_table(artifacts))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tracerl` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    level = logging.INFO
    while args and args[0] in ("-v", "--verbose", "-q", "--quiet"):
        level = logging.DEBUG if args.pop(0) in ("-v", "--verbose") else logging.WARNING
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if os.environ.get("RANK", "0") != "0":  # torchrun's other ranks: rank 0 speaks for all
        level = max(level, logging.WARNING)
        os.environ["TQDM_DISABLE"] = "1"  # tqdm's own switch: no bars from this process
    _setup_logging(level)
    try:
        code = resolve(name)(rest)
    except SystemExit as stop:
        if not isinstance(stop.code, str):
            raise  # tyro's usage errors and --help: already printed, with their exit code
        print(stop.code, file=sys.stderr)
        return _USAGE_ERROR
    except Exception as err:
        if level <= logging.DEBUG:
            raise
        print(f"tracerl {name}: {error_line(err)}", file=sys.stderr)
        if is_user_error(err):
            return _USAGE_ERROR
        print("(an internal error: rerun with -v for the traceback and report it)", file=sys.stderr)
        return 1
    return int(code or 0)


def is_user_error(err: BaseException) -> bool:
    """Whether `err` tells the user about their input rather than about a bug.

    trace-rl's own typed errors are messages for the user by design; `ValueError`, `OSError`
    (a missing, unreadable or unwritable path) and `LookupError` are what a bad argument
    raises in the libraries underneath.
    """
    own = type(err).__module__.split(".")[0] in _OWN_PACKAGES
    return own or isinstance(err, ValueError | OSError | LookupError)


def error_line(err: BaseException) -> str:
    """`err`'s message on one line: its first non-blank line (some libraries write pages).

    >>> error_line(OSError("no such model\\n\\nsee the docs"))
    'no such model'
    >>> error_line(KeyError("task-7"))
    "KeyError: 'task-7'"
    """
    text = "" if type(err) is KeyError else str(err)  # a bare KeyError's str is just the key
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first[:1_000] if first else f"{type(err).__name__}: {err}"


if __name__ == "__main__":
    sys.exit(main())
