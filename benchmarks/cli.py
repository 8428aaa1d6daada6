"""The `tracerl` command line: the front door, on the top floor.

`COMMANDS` maps each subcommand to a `"module:function"` string that is imported only when that
command runs, as Gymnasium resolves an `entry_point`. So `tracerl --help` imports no torch. Every
string points down a floor (or to this room: `benchmarks.demo`, the main job, and `train`'s
backend switch here); nothing below imports this module. Each package or room keeps its
commands in its own `cli.py`; a command function takes the remaining argv and returns an exit
code (or None for 0).

`main` turns an error that escapes a command into one line on stderr (a `Refused` gets one
more line per reason): exit code 2 for bad input (a trace-rl typed error, a `ValueError`, an
`OSError`, a `LookupError`, or a command's own `SystemExit` message), 1 for anything else. `-v`
shows the traceback instead.
"""

from __future__ import annotations

import difflib
import importlib
import io
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import IO, cast

from harness.errors import Refused

__all__ = ["COMMANDS", "TRAINERS", "main"]

# name -> (entry point, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "benchmarks.demo:demo",
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
        "harness.training.cli:init_model",
        "train the tokenizer and warm-start the tiny policy",
    ),
    "train": (
        "benchmarks.cli:train_on_backend",
        "RL training with tree rollouts (CPU, or --backend openrlhf)",
    ),
    "plot": ("harness.training.cli:plot", "plot the curves of a training run"),
    "doctor": (
        "harness.training.cli:doctor",
        "check the machine, toolchain and a run's layout before a GPU run (--json)",
    ),
    "gpu-check": (
        "harness.openrlhf.gpu_check:command",
        "one-GPU check of the OpenRLHF trainer half, without Ray or vLLM (--device cpu too)",
    ),
    "smoke-data": (
        "harness.openrlhf.smoke_data:command",
        "write the GPU smoke's prompt files and BM25 index (the synthetic world)",
    ),
}

# `tracerl train --backend NAME` -> the trainer's own command
TRAINERS: dict[str, str] = {
    "transformers": "harness.training.cli:train",
    "openrlhf": "harness.openrlhf.launcher:main",
}

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
    return _load(COMMANDS[name][0])


def _load(target: str) -> Callable[[list[str]], int | None]:
    module_name, func_name = target.split(":")
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


def train_on_backend(argv: list[str]) -> int | None:
    """`tracerl train`: CPU RL with tree rollouts, or `--backend openrlhf` on GPUs.

    The two trainers are sibling rooms of the harness; this switch sits above both, so neither
    imports the other.
    """
    backend, argv = _split_backend(list(argv))
    if backend not in TRAINERS:
        raise SystemExit(f"tracerl train: --backend {backend!r}: choose transformers or openrlhf")
    return _load(TRAINERS[backend])(argv)


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
        print(f"tracerl {name}: {error_text(err)}", file=sys.stderr)
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


def error_text(err: BaseException) -> str:
    """What the user reads of `err`: its first line, and every reason of a refusal below it.

    >>> print(error_text(Refused("flags the trainer cannot use", ["--a is gone", "--b: no"])))
    flags the trainer cannot use:
    - --a is gone
    - --b: no
    """
    if isinstance(err, Refused):  # each reason is a line for the user: all of them are kept
        return str(err)
    return error_line(err)


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
