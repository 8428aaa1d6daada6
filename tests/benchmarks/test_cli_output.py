"""What `tracerl` prints: log lines above the progress bars, and one voice under torchrun."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler
from tqdm import tqdm

import benchmarks.cli as cli

ROOT = Path(__file__).resolve().parents[2]


def test_a_log_line_during_a_bar_goes_above_it_not_into_it(capsys):
    handler = RichHandler(console=Console(file=cli.AboveBars(), width=200), show_path=False)
    logger = logging.getLogger("test_cli_output")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        bar = tqdm(total=3, file=sys.stderr, bar_format="BAR {n}/{total}", mininterval=0)
        bar.update(1)
        logger.warning("retrying the request")
        bar.close()
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    line = next(s for s in re.split(r"[\r\n]", err) if "retrying the request" in s)
    assert "BAR" not in line, repr(err)


def test_other_torchrun_ranks_draw_no_bars():
    # a fresh process, as torchrun starts one: tqdm reads TQDM_DISABLE when it is imported
    probe = (
        "import benchmarks.cli as cli\n"
        "def command(argv):\n"
        "    from tqdm.auto import tqdm\n"
        "    print(tqdm(total=1).disable)\n"
        "cli.resolve = lambda name: command\n"
        "cli.main(['bench'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "1"}
    env.pop("TQDM_DISABLE", None)
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "True", out.stderr[-2000:]
