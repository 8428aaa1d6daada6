"""The `tracerl` command line.

`COMMANDS` maps each subcommand to a `"module:function"` string that is imported only when that
command runs, as Gymnasium resolves an `entry_point`. So `tracerl --help` imports no torch, and
the table adds no import edge between packages. Each package keeps its commands in its own
`cli.py`; a command function takes the remaining argv and returns an exit code (or None for 0).
"""

from __future__ import annotations

import difflib
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

__all__ = ["COMMANDS", "main"]

# name -> (entry point, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("benchmarks.demo:demo", "main job: world, tiny policy, TRACE training, before/after eval"),
    "demo-env": ("envs.cli:demo_env", "run the scripted agents on the default synthetic world"),
    "world": ("envs.cli:world", "generate a synthetic world and export its corpus and questions"),
    "index": ("retrieval.cli:index", "build or search a BM25 / dense index (`index build|search`)"),
    "serve-retriever": (
        "retrieval.cli:serve_retriever",
        "serve an index over Search-R1's HTTP API",
    ),
    "bench": ("benchmarks.cli:bench", "evaluate an agent on a QA dataset (EM / sub-EM / F1)"),
    "corpus": ("benchmarks.cli:corpus", "build a retrieval corpus from datasets' paragraphs"),
    "tree": (
        "benchmarks.tree_view:tree",
        "render a rollout tree as text or a picture (`tree show`)",
    ),
    "init-model": ("harness.cli:init_model", "train the tokenizer and warm-start the tiny policy"),
    "train": ("harness.cli:train", "RL training with tree rollouts (CPU, or --backend openrlhf)"),
    "plot": ("harness.cli:plot", "plot the curves of a training run"),
}

log = logging.getLogger("tracerl")


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


def _setup_logging(level: int) -> None:
    from rich.logging import RichHandler

    handler = RichHandler(show_path=False, rich_tracebacks=False, markup=False)
    logging.basicConfig(level=level, format="%(message)s", datefmt="[%X]", handlers=[handler])


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
    command = resolve(name)
    _setup_logging(level)
    code = command(rest)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
