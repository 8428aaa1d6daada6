"""Builds that cannot race (issue 42): a lock beside `--out`, strays of dead builds only, and a
file table that must list every file the index kind needs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from retrieval import BM25Retriever, IndexBusyError, load_index
from retrieval.cli import index as index_command
from retrieval.errors import IndexFileError, IndexFormatError
from retrieval.index_files import atomic_directory, build_lock, lock_path
from retrieval.manifest import CORPUS_NAME, MANIFEST_NAME, IndexManifest, read_manifest

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "benchmarks.cli", "-q"]
_ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}


def _corpus(path: Path, n: int) -> Path:
    with path.open("w") as out:
        for i in range(n):
            words = " ".join(f"w{(i * 7 + j * 13) % 997}" for j in range(40))
            out.write(json.dumps({"id": f"d{i}", "contents": f'"T{i}"\n{words}'}) + "\n")
    return path


def _build_cmd(corpus: Path, out: Path) -> list[str]:
    return [*CLI, "index", "build", "--corpus", str(corpus), "--out", str(out), "--overwrite"]


def _strays(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.glob(f".{out.name}.tmp-*"))


def _holder(out: Path) -> subprocess.Popen[str]:
    """A process that holds the build lock of `out` until its stdin closes."""
    code = (
        "import sys\nfrom retrieval.index_files import build_lock\n"
        f"with build_lock({str(out)!r}):\n    print('held', flush=True)\n    sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=_ENV,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_build_started_during_the_first_is_refused_naming_its_pid(tmp_path: Path):
    corpus = _corpus(tmp_path / "c.jsonl", 50)
    out = tmp_path / "idx"
    first = _holder(out)  # a build in progress: it holds the lock
    try:
        second = subprocess.run(
            _build_cmd(corpus, out), capture_output=True, text=True, cwd=ROOT, env=_ENV
        )
    finally:
        assert first.stdin is not None
        first.stdin.close()
        first.wait(timeout=30)
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and f"is being built by PID {first.pid}" in lines[0]
    assert not out.exists() and _strays(out) == []  # refused before any work
    # once the first is gone (even killed: the kernel drops its lock) a build goes through
    done = subprocess.run(_build_cmd(corpus, out), capture_output=True, text=True, env=_ENV)
    assert done.returncode == 0, done.stderr
    assert load_index(out).manifest.n_documents == 50


def test_two_builds_started_at_once_leave_one_whole_index(tmp_path: Path):
    corpus = _corpus(tmp_path / "c.jsonl", 3_000)
    out = tmp_path / "idx"
    procs = [
        subprocess.Popen(
            _build_cmd(corpus, out),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=_ENV,
        )
        for _ in range(3)
    ]
    results = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    for code, err in results:
        # each one built whole, or was refused at once in one line naming a builder's PID
        assert code == 0 or (code == 2 and "is being built by PID" in err), err
        if code == 2:
            assert len(err.strip().splitlines()) == 1
    assert any(code == 0 for code, _ in results)
    assert index_command(["verify", str(out)]) == 0
    assert CORPUS_NAME in (read_manifest(out).files or {})
    assert load_index(out).manifest.n_documents == 3_000
    assert _strays(out) == []


def test_another_thread_of_the_process_is_refused_too(tmp_path: Path, toy_bm25):
    out = tmp_path / "idx"
    entered, release = threading.Event(), threading.Event()
    caught: list[BaseException] = []

    def first() -> None:
        with atomic_directory(out, marker=MANIFEST_NAME) as work:
            entered.set()
            release.wait(30)
            toy_bm25._model.save(str(work / "bm25s"), show_progress=False)

    thread = threading.Thread(target=first)
    thread.start()
    assert entered.wait(30)
    try:
        toy_bm25.save(out)
    except IndexBusyError as err:
        caught.append(err)
    release.set()
    thread.join(30)
    assert caught and f"PID {os.getpid()}" in str(caught[0])
    assert caught[0].pid == os.getpid()


def test_the_same_thread_may_take_the_lock_again(tmp_path: Path, toy_bm25):
    out = tmp_path / "idx"
    with build_lock(out), build_lock(out):
        toy_bm25.save(out)  # atomic_directory inside a command that holds the lock
    assert load_index(out).index_id == toy_bm25.index_id
    assert not lock_path(out).exists()  # removed by the build that held it


def test_strays_are_removed_only_when_their_owner_is_dead(tmp_path: Path, toy_bm25):
    out = tmp_path / "idx"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = tmp_path / f".idx.tmp-{sleeper.pid}"
        alive.mkdir()
        (alive / "half.npy").write_bytes(b"x")
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        gone = tmp_path / f".idx.tmp-{int(dead.stdout)}"
        gone.mkdir()
        link = tmp_path / f".idx.tmp-{int(dead.stdout)}-1-abc"
        link.symlink_to(tmp_path / "nowhere")  # a stray symlink is removed too
        toy_bm25.save(out)
        assert alive.is_dir() and not gone.exists() and not link.is_symlink()
    finally:
        sleeper.kill()
        sleeper.wait()
    toy_bm25.save(out)  # now its owner is dead
    assert _strays(out) == []


def test_a_work_directory_removed_during_the_build_fails_it_and_keeps_the_old_index(
    tmp_path: Path, toy_bm25, toy_docs
):
    out = tmp_path / "idx"
    BM25Retriever.build(toy_docs[:3]).save(out)
    before = read_manifest(out)
    # what an unlocked second build did: delete the first's work directory, which bm25s then
    # recreated for its own arrays, leaving no corpus.jsonl
    changed = "removed or replaced while the index was written"
    with (
        pytest.raises(IndexFormatError, match=changed),
        atomic_directory(out, marker=MANIFEST_NAME) as work,
    ):
        (work / CORPUS_NAME).write_text("{}\n")
        shutil.rmtree(work)
        work.mkdir()
        toy_bm25._model.save(str(work / "bm25s"), show_progress=False)
    assert read_manifest(out) == before
    assert _strays(out) == []


def test_a_manifest_is_not_written_without_the_files_its_kind_needs(tmp_path: Path, toy_bm25):
    work = tmp_path / "w"
    work.mkdir()
    toy_bm25._model.save(str(work / "bm25s"), show_progress=False)
    with pytest.raises(IndexFileError, match=r"corpus\.jsonl was not written"):
        toy_bm25.manifest.write(work)
    assert not (work / MANIFEST_NAME).exists()


def test_a_table_without_the_corpus_fails_open_and_verify(
    tmp_path: Path, toy_bm25, capsys: pytest.CaptureFixture[str]
):
    out = tmp_path / "idx"
    toy_bm25.save(out)
    # what the race left: bm25s/ and a manifest listing only what existed
    (out / CORPUS_NAME).unlink()
    record = json.loads((out / MANIFEST_NAME).read_text())
    del record["files"][CORPUS_NAME]
    (out / MANIFEST_NAME).write_text(json.dumps(record))
    with pytest.raises(IndexFileError, match=r"corpus\.jsonl is not in the manifest's file table"):
        load_index(out)
    capsys.readouterr()
    assert index_command(["verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "corpus.jsonl is not in the manifest" in err
    # the kinds' needs are the manifest's, whichever class wrote it
    assert IndexManifest.from_json(record, source="m").kind == "bm25"


def test_a_symlinked_out_is_refused_before_the_build(tmp_path: Path, toy_bm25):
    target = tmp_path / "real"
    toy_bm25.save(target)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(IndexFormatError, match=r"is a symbolic link .*--out .*real"):
        toy_bm25.save(link)
    assert link.is_symlink() and load_index(target).index_id == toy_bm25.index_id
    assert _strays(link) == []


def test_a_mount_point_out_is_refused_before_the_build(
    tmp_path: Path, toy_bm25, monkeypatch: pytest.MonkeyPatch
):
    mount = tmp_path / "volume"
    mount.mkdir()
    real_ismount = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == mount or real_ismount(p))
    corpus = _corpus(tmp_path / "c.jsonl", 5)
    start = time.monotonic()
    with pytest.raises(SystemExit, match=r"is a mount point.*--out .*volume/index"):
        index_command(["build", "--corpus", str(corpus), "--out", str(mount), "--overwrite"])
    assert time.monotonic() - start < 5 and _strays(mount) == []


def test_a_file_system_without_flock_builds_unguarded_with_a_warning(
    tmp_path: Path, toy_bm25, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    import errno
    import fcntl
    import logging

    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with caplog.at_level(logging.WARNING):
        toy_bm25.save(tmp_path / "idx")
    assert load_index(tmp_path / "idx").index_id == toy_bm25.index_id
    assert any("would not be refused" in r.getMessage() for r in caplog.records)
