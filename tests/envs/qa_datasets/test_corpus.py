"""Corpus builder: deduplication, supporting-paragraph ids, index, and `tracerl corpus`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.qa_datasets.corpus import (
    attach_doc_ids,
    build_corpus,
    build_index,
    paragraph_doc_id,
    write_corpus_dir,
)
from envs.qa_datasets.errors import NoParagraphsError
from envs.qa_datasets.loaders import load_file
from harness.evaluation.bench import corpus
from retrieval import BM25Retriever, read_corpus


def _musique_record(task_id: str, paragraphs: list[tuple[str, str, bool]]) -> dict:
    return {
        "id": task_id,
        "question": f"question {task_id}?",
        "answer": "x",
        "answer_aliases": [],
        "answerable": True,
        "question_decomposition": [],
        "paragraphs": [
            {"idx": i, "title": t, "paragraph_text": text, "is_supporting": sup}
            for i, (t, text, sup) in enumerate(paragraphs)
        ],
    }


def test_dedup_keys_on_title_and_text_not_title(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    records = [
        _musique_record("2hop__1_2", [("Paris", "Paris is big.", True), ("Rome", "Rome.", False)]),
        # same title, different text: a second document; identical paragraph: shared
        _musique_record("2hop__3_4", [("Paris", "Paris, Texas.", True), ("Rome", "Rome.", True)]),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    build = build_corpus([load_file(path)])
    assert [(d.title, d.text) for d in build.documents] == [
        ("Paris", "Paris is big."),
        ("Rome", "Rome."),
        ("Paris", "Paris, Texas."),
    ]
    second = build.tasks["2hop__3_4"]
    assert second.supporting_doc_ids == (
        paragraph_doc_id("Paris", "Paris, Texas."),
        paragraph_doc_id("Rome", "Rome."),
    )
    assert build.stats["n_documents"] == 3 and build.stats["n_paragraphs"] == 4


def test_doc_ids_do_not_depend_on_which_datasets_are_pooled(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps(_musique_record("2hop__1_2", [("T", "shared text", True)])) + "\n")
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps(_musique_record("2hop__5_6", [("U", "other", True)])) + "\n")
    alone = build_corpus([load_file(a)])
    pooled = build_corpus([load_file(b), load_file(a)])
    assert (
        alone.tasks["2hop__1_2"].supporting_doc_ids == pooled.tasks["2hop__1_2"].supporting_doc_ids
    )


def test_shared_hotpotqa_and_musique_corpora_have_the_documented_sizes(shared_data: Path) -> None:
    hotpot = [load_file(p) for p in sorted((shared_data / "hotpotqa").iterdir())]
    build = build_corpus(hotpot)
    assert build.stats["n_documents"] == 9_572  # counted once from the files
    assert build.stats["n_tasks"] == 975
    musique = [load_file(p) for p in sorted((shared_data / "musique").iterdir())]
    build = build_corpus(musique)
    assert build.stats["n_documents"] == 4_543
    doc_ids = {d.doc_id for d in build.documents}
    for task in build.tasks:
        n_supporting = sum(p.is_supporting for p in task.paragraphs)
        assert len(task.supporting_doc_ids) == n_supporting == task.n_hops
        assert set(task.supporting_doc_ids) <= doc_ids


@pytest.mark.parametrize("rel", ["bamboogle/bamboogle.csv", "nq/NQ-open.dev.first1000.jsonl"])
def test_datasets_without_paragraphs_say_so(shared_data: Path, rel: str) -> None:
    with pytest.raises(NoParagraphsError, match=r"has no paragraphs.*wiki-18"):
        build_corpus([load_file(shared_data / rel)])


def test_attach_doc_ids_leaves_tasks_with_known_ids_alone(tmp_path: Path) -> None:
    from envs.tasks import Paragraph, QATask, TaskSet

    known = QATask(
        task_id="s1",
        question="Q?",
        golden_answers=("a",),
        supporting_doc_ids=("world-7",),
        paragraphs=(Paragraph(title="T", text="t", is_supporting=True, doc_id="world-7"),),
    )
    bare = QATask(task_id="n1", question="Q?", golden_answers=("a",))
    assert list(attach_doc_ids(TaskSet([known, bare]))) == [known, bare]


def test_written_corpus_reads_back_and_its_index_finds_supporting_paragraphs(
    tmp_path: Path, shared_data: Path
) -> None:
    build = build_corpus(
        [load_file(shared_data / "hotpotqa/hotpot_dev_distractor.migres200.jsonl", limit=20)]
    )
    paths = write_corpus_dir(build, tmp_path / "c")
    assert read_corpus(paths["corpus"]) == list(build.documents)
    manifest = json.loads(paths["manifest"].read_text())
    assert manifest["corpus_hash"] == build.corpus_hash and manifest["schema_version"] == 1
    reread = load_file(paths["tasks"])
    assert list(reread.tasks) == list(build.tasks)
    build_index(build.documents, tmp_path / "c" / "bm25")
    index = BM25Retriever.load(tmp_path / "c" / "bm25")
    task = build.tasks[0]
    supporting = [p for p in task.paragraphs if p.is_supporting]
    hits = index.search([supporting[0].text], k=1)[0]
    assert hits[0].doc_id == task.supporting_doc_ids[0]


def test_tracerl_corpus_command(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str], caplog
) -> None:
    out = tmp_path / "corpus"
    musique = str(shared_data / "musique/musique_ans_v1.0_dev.kag100.json")
    assert corpus(["--data-file", musique, "--limit", "10", "--out", str(out)]) == 0
    assert "unique documents" in capsys.readouterr().out
    assert (out / "bm25" / "manifest.json").is_file()
    assert len(load_file(out / "tasks.jsonl").tasks) == 10
    bamboogle = str(shared_data / "bamboogle/bamboogle.csv")
    assert corpus(["--data-file", bamboogle, "--out", str(tmp_path / "none")]) == 2
    assert "no paragraphs" in caplog.text
    assert corpus(["--out", str(tmp_path / "none")]) == 2
    assert "no questions: pass --dataset NAME or --data-file PATH" in caplog.text
