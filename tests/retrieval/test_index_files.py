"""Index directories that cannot lie: a file table, atomic replacement, files changed later."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest

from retrieval import BM25Retriever, load_index
from retrieval.cli import index as index_command
from retrieval.errors import IndexChangedError, IndexFileError, IndexFormatError
from retrieval.index_files import atomic_directory
from retrieval.manifest import MANIFEST_NAME, read_manifest


@pytest.fixture
def saved(tmp_path: Path, toy_bm25: BM25Retriever) -> Path:
    toy_bm25.save(tmp_path / "idx")
    return tmp_path / "idx"


def test_the_manifest_lists_every_file_with_its_size_and_hash(saved: Path) -> None:
    files = json.loads((saved / MANIFEST_NAME).read_text())["files"]
    on_disk = {
        p.relative_to(saved).as_posix(): p.stat().st_size
        for p in saved.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME
    }
    assert {name: entry["size"] for name, entry in files.items()} == on_disk
    assert all(len(entry["sha256"]) == 64 for entry in files.values())


def test_a_missing_short_or_extra_file_is_refused_naming_it(saved: Path) -> None:
    arrays = sorted((saved / "bm25s").glob("*.npy"))
    victim = arrays[0]
    data = victim.read_bytes()
    victim.write_bytes(data[:-1])
    with pytest.raises(IndexFileError, match=rf"{victim.name} holds {len(data) - 1} bytes"):
        load_index(saved)
    victim.write_bytes(data)
    (saved / "bm25s" / "stray.npy").write_bytes(b"x")
    with pytest.raises(IndexFileError, match=r"bm25s/stray\.npy is not in the manifest"):
        load_index(saved)
    (saved / "bm25s" / "stray.npy").unlink()
    victim.unlink()
    with pytest.raises(IndexFileError, match=rf"{victim.name} is missing") as caught:
        load_index(saved)
    assert caught.value.path == str(victim)


def test_an_index_written_before_the_table_opens_with_a_warning(
    saved: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record = json.loads((saved / MANIFEST_NAME).read_text())
    del record["files"]
    (saved / MANIFEST_NAME).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
        assert load_index(saved).search(["capital of Italy"], 1)[0][0].doc_id == "d1"
    assert any("rebuild it" in r.getMessage() for r in caplog.records)


def test_verify_finds_a_byte_changed_in_place(saved: Path, capsys: pytest.CaptureFixture) -> None:
    assert index_command(["verify", str(saved)]) == 0
    assert "every file matches" in capsys.readouterr().out
    corpus = saved / "corpus.jsonl"
    data = bytearray(corpus.read_bytes())
    data[data.index(b"Paris")] = ord("B")  # same size: only the hash sees it
    corpus.write_bytes(bytes(data))
    assert index_command(["verify", str(saved)]) == 1  # a finding, not a usage error (2)
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert re.search(r"^tracerl index verify: .*corpus\.jsonl has SHA-256 .* changed after", err)


def test_a_failed_save_keeps_the_old_index_whole(saved: Path, toy_docs) -> None:
    before = read_manifest(saved)
    with pytest.raises(KeyboardInterrupt), atomic_directory(saved, marker=MANIFEST_NAME) as work:
        (work / "corpus.jsonl").write_text("half of a new build")
        raise KeyboardInterrupt  # a kill half-way through the new build
    assert read_manifest(saved) == before
    assert load_index(saved).search(["capital of Italy"], 1)[0][0].doc_id == "d1"
    assert [p.name for p in saved.parent.iterdir()] == ["idx"]  # no stray build left
    # a save over it replaces it whole: the new index, and none of the old files
    BM25Retriever.build(toy_docs[:3]).save(saved)
    assert load_index(saved).manifest.n_documents == 3


def test_a_directory_that_is_not_an_index_is_never_replaced(
    tmp_path: Path, toy_bm25: BM25Retriever
) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(IndexFormatError, match="not an index directory"):
        toy_bm25.save(tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_a_mapped_array_replaced_under_an_open_index_is_refused(saved: Path) -> None:
    retriever = load_index(saved, mmap=True)
    assert retriever.search(["capital of Italy"], 1)[0][0].doc_id == "d1"
    victim = sorted((saved / "bm25s").glob("*.npy"))[0]
    replacement = victim.with_name("new.npy")
    replacement.write_bytes(victim.read_bytes())
    os.replace(replacement, victim)  # same bytes, another file: not the one that was mapped
    with pytest.raises(IndexChangedError, match=rf"{victim.name} was replaced or changed"):
        retriever.search(["capital of Italy"], 1)


def test_serve_verify_refuses_a_changed_index_before_serving(saved: Path) -> None:
    from retrieval.cli import serve_retriever

    corpus = saved / "corpus.jsonl"
    data = bytearray(corpus.read_bytes())
    data[data.index(b"Paris")] = ord("B")
    corpus.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match=r"serve-retriever: .*corpus\.jsonl has SHA-256"):
        serve_retriever(["--index", str(saved), "--verify", "--port", "0"])
