"""Corpus JSONL reading/writing and the corpus hash."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrieval import Document, IndexFormatError, read_corpus, write_corpus
from retrieval.corpus import corpus_hash

titles = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"))
texts = st.text(st.characters(blacklist_categories=("Cs",)))
doc_lists = st.lists(
    st.builds(Document, doc_id=st.text(min_size=1), title=titles, text=texts),
    max_size=8,
    unique_by=lambda d: d.doc_id,
)


@given(docs=doc_lists)
def test_write_then_read_returns_the_same_documents(tmp_path_factory, docs):
    path = tmp_path_factory.mktemp("c") / "corpus.jsonl"
    write_corpus(docs, path)
    assert read_corpus(path) == docs
    assert corpus_hash(read_corpus(path)) == corpus_hash(docs)


def test_reads_search_r1_contents_and_title_text_lines(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        json.dumps({"id": "1", "contents": '"Paris"\nCapital of France.'})
        + "\n\n"  # blank lines are skipped
        + json.dumps({"id": "2", "title": "Rome", "text": "Capital of Italy."})
        + "\n"
    )
    assert read_corpus(path) == [
        Document(doc_id="1", title="Paris", text="Capital of France."),
        Document(doc_id="2", title="Rome", text="Capital of Italy."),
    ]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"contents": "x"}', '"id"'),
        ('{"id": 7, "contents": "x"}', '"id"'),
        ('{"id": "x"}', '"contents"'),
        ('{"id": "x", "contents": 3}', '"contents"'),
        ('{"id": "x", "text": "t", "title": 5}', '"title"'),
    ],
)
def test_a_bad_line_raises_with_its_line_number(tmp_path: Path, line: str, needle: str):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "ok", "contents": "fine"}\n' + line + "\n")
    with pytest.raises(IndexFormatError, match=r":2: ") as info:
        read_corpus(path)
    assert needle in str(info.value)


def test_a_duplicate_id_names_both_lines(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "contents": "x"}\n{"id": "b", "contents": "y"}\n')
    path.write_text(path.read_text() + '{"id": "a", "contents": "z"}\n')
    with pytest.raises(IndexFormatError, match=r":3: duplicate document id 'a'.*line 1"):
        read_corpus(path)


def test_missing_and_non_utf8_files_raise_format_errors(tmp_path: Path):
    with pytest.raises(IndexFormatError, match="cannot read corpus"):
        read_corpus(tmp_path / "absent.jsonl")
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"id": "a", "contents": "caf\xe9"}\n')
    with pytest.raises(IndexFormatError, match="not valid UTF-8"):
        read_corpus(bad)


def test_corpus_hash_sees_every_field_and_the_order():
    a = Document(doc_id="1", title="A", text="x")
    b = Document(doc_id="2", title="B", text="y")
    base = corpus_hash([a, b])
    assert corpus_hash([a, b]) == base
    assert corpus_hash([b, a]) != base
    assert corpus_hash([a]) != base
    for changed in (
        Document(doc_id="9", title="A", text="x"),
        Document(doc_id="1", title="A2", text="x"),
        Document(doc_id="1", title="A", text="x2"),
    ):
        assert corpus_hash([changed, b]) != base
    # field boundaries are unambiguous: moving text between title and text changes the hash
    assert corpus_hash([Document(doc_id="1", title="ab", text="c")]) != corpus_hash(
        [Document(doc_id="1", title="a", text="bc")]
    )


def _finishes(call, timeout_s: float = 10.0) -> BaseException | None:
    """Run `call` in a thread; fail if it blocks (on a FIFO, open() waits for a writer)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert outcome, f"still blocked after {timeout_s} s"
    return outcome[0]


def test_a_fifo_or_a_device_as_corpus_is_refused_without_blocking(tmp_path: Path):
    fifo = tmp_path / "corpus.jsonl"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        err = _finishes(lambda p=path: read_corpus(p))
        assert isinstance(err, IndexFormatError) and "not a regular file" in str(err)


def test_a_tree_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path):
    from harness.evaluation.tree_view import load_trees
    from trace_alloc import TreeFormatError

    fifo = tmp_path / "trees.jsonl"
    os.mkfifo(fifo)
    err = _finishes(lambda: load_trees(fifo))
    assert isinstance(err, TreeFormatError) and "not a regular file" in str(err)
