"""`benchmarks.records`: RESULTS.md is the records' text, and a bad record is named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.records import (
    RESULTS_MD,
    RecordError,
    load_record,
    load_records,
    main,
    render,
)

RECORD = {
    "schema_version": 1,
    "section": "Retrieval",
    "title": "A benchmark",
    "measures": "What it measures.",
    "command": "python -m benchmarks.perf.x --json",
    "date": "2026-12-02",
    "machine": "2 vCPU, shared",
    "commit": "abc1234",
    "tables": [{"columns": ["k", "v"], "rows": [["a", "1"]]}],
    "notes": ["A note."],
}


def write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_the_committed_results_md_is_the_records_text() -> None:
    assert RESULTS_MD.read_text(encoding="utf-8") == render(load_records()), (
        "benchmarks/RESULTS.md differs from its records: run `make results` (never edit it by hand)"
    )


def test_a_record_renders_its_command_date_machine_commit_table_and_notes(tmp_path: Path) -> None:
    text = render([load_record(write(tmp_path / "a.json", RECORD))])
    assert "## Retrieval\n\n### A benchmark\n" in text
    assert "`python -m benchmarks.perf.x --json`" in text
    assert "Measured 2026-12-02 at commit abc1234 on 2 vCPU, shared." in text
    assert "| k | v |\n|---|---:|\n| a | 1 |" in text and "A note." in text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"command": ""}, "missing or empty field(s): command"),
        ({"date": None}, "missing or empty field(s): date"),
        ({"section": "Elsewhere"}, "section 'Elsewhere' is not one of"),
        ({"tables": [{"columns": ["a", "b"], "rows": [["1"]]}]}, "tables[0].rows[0] has not 2"),
        ({"tables": [{"columns": ["a"], "align": "x", "rows": []}]}, "tables[0].align"),
        ({"include": "absent.txt"}, "absent.txt, which is not beside the record"),
        ({"notes": "one string"}, "`notes` must be a list of strings"),
    ],
)
def test_a_malformed_record_is_refused_with_its_file_named(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    path = write(tmp_path / "bad.json", RECORD | change)
    with pytest.raises(RecordError) as err:
        load_record(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_a_file_that_is_not_json_stops_the_render_with_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "good.json", RECORD)
    (tmp_path / "torn.json").write_text('{"title": "half', encoding="utf-8")
    out = tmp_path / "RESULTS.md"
    assert main(["--records", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'torn.json'}: not valid JSON" in err
    assert not out.exists()  # nothing half-written


def test_check_fails_on_a_hand_edit_and_passes_after_a_render(tmp_path: Path) -> None:
    write(tmp_path / "a.json", RECORD)
    out = tmp_path / "RESULTS.md"
    assert main(["--records", str(tmp_path), "--out", str(out)]) == 0
    assert main(["--check", "--records", str(tmp_path), "--out", str(out)]) == 0
    out.write_text(out.read_text(encoding="utf-8") + "a hand edit\n", encoding="utf-8")
    assert main(["--check", "--records", str(tmp_path), "--out", str(out)]) == 1


def test_raw_benchmark_output_beside_the_records_is_not_a_record(tmp_path: Path) -> None:
    write(tmp_path / "a.json", RECORD)
    write(tmp_path / "experiment-x.json", {"schema_version": 1, "cells": {}})
    assert [r.path.name for r in load_records(tmp_path)] == ["a.json"]


def test_run_writes_a_benchmark_s_json_line_as_a_record_and_keeps_its_notes(
    tmp_path: Path,
) -> None:
    out = tmp_path / "x.json"
    figures = {
        "rows": [{"depth": 1, "us": 2.5}],
        "ratio": 3.0,
        "sample": "a\nb",
        "modes": {"batched": {"s": 1.5}, "serial": {"s": 9.0}},
    }
    bench = f"import json; print('table'); print(json.dumps({figures!r}))"
    args = ["run", str(out), "--section", "Retrieval", "--title", "X", "--measures", "Speed."]
    assert main([*args, "--", sys.executable, "-c", bench]) == 0
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["result"] == figures and record["command"].startswith(sys.executable)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    assert record["commit"] == head.stdout.strip() and record["date"][:2] == "20"
    assert "CPUs" in record["machine"]
    text = render([load_record(out)])
    assert "| depth | us |\n|---:|---:|\n| 1 | 2.5 |" in text and "| `ratio` | 3 |" in text
    assert "| `modes` | s |\n|---|---:|\n| batched | 1.5 |\n| serial | 9 |" in text
    assert "a\nb" not in text  # a text sample stays in the record, out of the tables
    record["notes"] = ["Why the ratio is what it is."]
    write(out, record)
    assert main([*args, "--", sys.executable, "-c", bench]) == 0
    assert json.loads(out.read_text(encoding="utf-8"))["notes"] == ["Why the ratio is what it is."]


def test_run_refuses_a_command_whose_last_line_is_not_json(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    args = ["run", str(out), "--section", "Retrieval", "--title", "X", "--measures", "Speed."]
    assert main([*args, "--", sys.executable, "-c", "print('no json')"]) == 1
    assert main([*args, "--", sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert not out.exists()


def test_a_superseded_record_is_named_but_its_figures_stay_in_the_record(tmp_path: Path) -> None:
    old = RECORD | {"title": "Old run", "superseded_by": "new.json", "notes": ["Old prose."]}
    pairs = (("new.json", RECORD), ("old.json", old))
    text = render([load_record(write(tmp_path / name, data)) for name, data in pairs])
    assert "### A benchmark" in text and "### Old run" not in text and "Old prose." not in text
    flat = " ".join(text.split())
    assert "Older runs, superseded (figures in their records): `old.json` (2026-12-02)" in flat


def test_run_never_overwrites_a_benchmark_s_raw_output(tmp_path: Path) -> None:
    raw = write(tmp_path / "experiment-x.json", {"schema_version": 1, "cells": {}})
    args = ["run", str(raw), "--section", "Retrieval", "--title", "X", "--measures", "Speed."]
    assert main([*args, "--", sys.executable, "-c", "print('{}')"]) == 1
    assert json.loads(raw.read_text(encoding="utf-8")) == {"schema_version": 1, "cells": {}}


def test_an_included_markdown_s_headings_become_bold_lines(tmp_path: Path) -> None:
    (tmp_path / "run-NAME.md").write_text("# The run\n\n| a |\n|---|\n| 1 |\n", encoding="utf-8")
    text = render([load_record(write(tmp_path / "a.json", RECORD | {"include": "run-NAME.md"}))])
    assert "**The run**\n\n| a |" in text and "\n# The run" not in text
