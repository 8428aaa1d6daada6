"""Issue 25: every `tracerl` subcommand answers bad input in one line, exit code 2, no traceback.

The cases (`benchmarks.perf.bad_inputs`) cover every command in `benchmarks.cli.COMMANDS`; the
reliability benchmark counts the same cases. `-v` still shows the traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.cli import COMMANDS, main
from benchmarks.perf.bad_inputs import bad_command_lines, run_command_line


def test_every_subcommand_answers_every_bad_input_in_one_line_without_a_traceback(tmp_path):
    cases = bad_command_lines(tmp_path)
    assert len(cases) >= 39 and {argv[0] for argv in cases.values()} >= set(COMMANDS)
    failures = {}
    for name, argv in cases.items():
        outcome = run_command_line(argv)
        if outcome.traceback or outcome.code != 2:
            failures[name] = (outcome.code, outcome.output[-600:])
    assert not failures, failures


def test_a_library_error_is_the_first_line_of_its_message_prefixed_by_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert main(["plot", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracerl plot: ") and len(err.strip().splitlines()) == 1


def test_verbose_shows_the_traceback(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="has no records to plot"):
        main(["-v", "plot", str(tmp_path / "missing")])


def test_an_unexpected_error_is_one_line_and_exit_code_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    import harness.training.metrics_log

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(harness.training.metrics_log, "plot_run", broken)
    assert main(["plot", "somewhere"]) == 1
    err = capsys.readouterr().err
    assert "tracerl plot: a bug" in err and "rerun with -v" in err and "Traceback" not in err
