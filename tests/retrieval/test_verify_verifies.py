"""`tracerl index verify` verifies (issue 42): what it cannot check, or a manifest that
contradicts itself, is refused in one line with exit code 1; so is an index whose damage it
finds. And a file written in place with its mtime put back is still noticed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_compressed import _split_index

from retrieval import BM25Retriever, load_index
from retrieval.cli import index as index_command
from retrieval.compressed import COMPRESSED_NAME, CompressedIndex
from retrieval.errors import IndexChangedError, IndexFileError, IndexFormatError
from retrieval.manifest import MANIFEST_NAME


def _verify(directory: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = index_command(["verify", str(directory)])
    captured = capsys.readouterr()
    return code, captured.err if code else captured.out


def _edit(path: Path, change) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


@pytest.fixture
def bm25_dir(tmp_path: Path, toy_bm25: BM25Retriever) -> Path:
    toy_bm25.save(tmp_path / "bm25")
    return tmp_path / "bm25"


def test_a_manifest_without_a_file_table_is_not_verified(bm25_dir, capsys) -> None:
    _edit(bm25_dir / MANIFEST_NAME, lambda r: r.pop("files"))
    code, err = _verify(bm25_dir, capsys)
    assert code == 1 and len(err.splitlines()) == 1
    assert "cannot verify" in err and "no file table" in err
    load_index(bm25_dir)  # opening still works (with a warning), as for old indexes


def test_a_compressed_record_without_a_table_is_not_verified(tmp_path, capsys) -> None:
    directory, _ = _split_index(tmp_path)
    codes = directory / "lists.codes"
    data = bytearray(codes.read_bytes())
    data[len(data) // 2] ^= 0x01  # a flip it would have passed
    codes.write_bytes(bytes(data))
    _edit(directory / COMPRESSED_NAME, lambda r: r.pop("files"))
    code, err = _verify(directory, capsys)
    assert code == 1 and len(err.splitlines()) == 1 and "no file table" in err


def test_lists_in_index_over_split_lists_is_refused_at_verify_and_open(tmp_path, capsys) -> None:
    directory, _ = _split_index(tmp_path)
    _edit(directory / COMPRESSED_NAME, lambda r: r.update(lists="in-index"))
    code, err = _verify(directory, capsys)
    assert code == 1 and len(err.splitlines()) == 1
    assert '"lists": "in-index"' in err and "lists.codes" in err
    with pytest.raises(IndexFormatError, match="every query would get no hits"):
        CompressedIndex(directory)


def test_an_in_index_record_whose_index_lost_its_lists_is_refused_at_open(tmp_path) -> None:
    directory, _ = _split_index(tmp_path)
    for name in ("lists.codes", "lists.ids", "lists.sizes.npy"):
        (directory / name).unlink()

    def lie(record: dict) -> None:  # a consistent table, but index.faiss's lists are empty
        record["lists"] = "in-index"
        for name in ("lists.codes", "lists.ids", "lists.sizes.npy"):
            del record["files"][name]

    _edit(directory / COMPRESSED_NAME, lie)
    with pytest.raises(IndexFileError, match=r"index\.faiss holds 0 rows in its lists"):
        CompressedIndex(directory)


def test_an_unknown_lists_layout_is_refused(tmp_path, capsys) -> None:
    directory, _ = _split_index(tmp_path)
    _edit(directory / COMPRESSED_NAME, lambda r: r.update(lists="sharded"))
    code, err = _verify(directory, capsys)
    assert code == 1 and "unknown lists layout 'sharded'" in err
    with pytest.raises(IndexFormatError, match="unknown lists layout"):
        CompressedIndex(directory)


def test_a_split_layout_whose_table_misses_a_list_file_is_refused(tmp_path, capsys) -> None:
    directory, _ = _split_index(tmp_path)
    (directory / "lists.ids").unlink()
    _edit(directory / COMPRESSED_NAME, lambda r: r["files"].pop("lists.ids"))
    code, err = _verify(directory, capsys)
    assert code == 1 and "lists.ids is not in compressed.json's file table" in err


def test_a_kind_whose_files_are_not_there_is_refused(bm25_dir, capsys) -> None:
    from retrieval.manifest import make_index_id

    def dense(record: dict) -> None:  # a manifest that says dense over BM25 files
        record["kind"] = "dense"
        record["index_id"] = make_index_id("dense", record["corpus_hash"], record["params"])

    _edit(bm25_dir / MANIFEST_NAME, dense)
    code, err = _verify(bm25_dir, capsys)
    assert code == 1 and "index.faiss is not in the manifest's file table" in err


def test_a_sound_index_verifies_with_exit_code_0(bm25_dir, tmp_path, capsys) -> None:
    code, out = _verify(bm25_dir, capsys)
    assert code == 0 and "every file matches its manifest" in out
    directory, _ = _split_index(tmp_path)
    assert _verify(directory, capsys)[0] == 0


def test_verify_of_a_path_that_is_not_a_directory_says_so(tmp_path, capsys) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, err = _verify(fifo, capsys)
    assert code == 1 and "is not a directory" in err and "does not exist" not in err


def test_an_in_place_write_that_restores_the_mtime_is_noticed(bm25_dir) -> None:
    retriever = load_index(bm25_dir, mmap=True)
    assert retriever.search(["capital of Italy"], 1)[0][0].doc_id == "d1"
    victim = bm25_dir / "bm25s" / "data.csc.index.npy"
    before = victim.stat()
    data = np.load(victim)
    with victim.open("r+b") as handle:  # same size, in place (`cp -p`, `rsync -t --inplace`)
        handle.seek(before.st_size - data.nbytes)
        handle.write(np.zeros_like(data).tobytes())
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))  # the mtime put back
    assert victim.stat().st_mtime_ns == before.st_mtime_ns
    with pytest.raises(IndexChangedError, match=r"data\.csc\.index\.npy was replaced or changed"):
        retriever.search(["capital of Italy"], 1)
