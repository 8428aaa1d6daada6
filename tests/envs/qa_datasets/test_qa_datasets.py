"""Dataset loaders: every real shared file, tiny in-test files of each format, and the hub path."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envs.qa_datasets.errors import (
    DatasetFormatError,
    DatasetUnavailable,
    UnknownBenchmarkNameError,
)
from envs.qa_datasets.loaders import (
    combine,
    detect_format,
    load_file,
    load_hub,
    load_named,
)

# --- the real dev samples (docs/benchmarks.md, "The real dev samples") ------------------------

REAL = {
    "hotpotqa/hotpot_dev_distractor.rpt_sample500.hf.jsonl": (
        "hotpotqa-hf",
        500,
        {"bridge": 394, "comparison": 106},
    ),
    "hotpotqa/hotpot_dev_distractor.rpt_sample300.hf.jsonl": (
        "hotpotqa-hf",
        300,
        {"bridge": 230, "comparison": 70},
    ),
    "hotpotqa/hotpot_dev_distractor.migres200.jsonl": (
        "hotpotqa",
        200,
        {"bridge": 134, "comparison": 66},
    ),
    "2wikimultihopqa/2wiki_dev.migres164.jsonl": (
        "2wikimultihopqa",
        164,
        {"compositional": 57, "comparison": 54, "bridge_comparison": 43, "inference": 10},
    ),
    "musique/musique_ans_v1.0_dev.migres200.jsonl": (
        "musique",
        200,
        {"2hop": 145, "3hop1": 28, "3hop2": 4, "4hop1": 18, "4hop2": 1, "4hop3": 4},
    ),
    "musique/musique_ans_v1.0_dev.kag100.json": (
        "musique",
        100,
        {"2hop": 53, "3hop1": 29, "3hop2": 5, "4hop1": 10, "4hop2": 1, "4hop3": 2},
    ),
    "bamboogle/bamboogle.csv": ("bamboogle", 125, {"": 125}),
    "nq/NQ-open.dev.first1000.jsonl": ("nq-open", 1000, {"": 1000}),
    "nq/flashrag_quickstart_nq_test.jsonl": ("flashrag", 17, {"": 17}),
    "popqa/popqa.hipporag2_1000.json": ("popqa", 1000, None),
}


@pytest.mark.parametrize("rel", sorted(REAL))
def test_every_shared_file_loads_with_its_counts_and_types(shared_data: Path, rel: str) -> None:
    fmt, n_tasks, types = REAL[rel]
    path = shared_data / rel
    assert detect_format(path) == fmt
    loaded = load_file(path)
    assert len(loaded.tasks) == n_tasks
    if types is not None:
        assert dict(collections.Counter(t.question_type for t in loaded.tasks)) == types
    assert all(t.golden_answers and t.question for t in loaded.tasks)
    assert loaded.sources[0].sha256 is not None and len(loaded.sources[0].sha256) == 64


def test_hotpotqa_paragraph_text_is_byte_exact_and_supporting_marked(shared_data: Path) -> None:
    path = shared_data / "hotpotqa/hotpot_dev_distractor.migres200.jsonl"
    raw = json.loads(path.open(encoding="utf-8").readline())
    task = load_file(path).tasks[raw["_id"]]
    assert [p.title for p in task.paragraphs] == [c[0] for c in raw["context"]]
    assert [p.text for p in task.paragraphs] == ["".join(c[1]) for c in raw["context"]]
    supporting = {title for title, _ in raw["supporting_facts"]}
    assert {p.title for p in task.paragraphs if p.is_supporting} == supporting
    assert task.n_hops == 2 and task.golden_answers == (raw["answer"],)


def test_hf_and_official_hotpotqa_schemas_give_the_same_task(tmp_path: Path) -> None:
    official = {
        "_id": "h1",
        "question": "Q?",
        "answer": "yes",
        "type": "comparison",
        "level": "hard",
        "supporting_facts": [["A", 0], ["B", 1]],
        "context": [["A", ["A one.", " A two."]], ["B", ["B one.", " B two."]], ["C", ["C."]]],
    }
    hf = {
        "id": "h1",
        "question": "Q?",
        "answer": "yes",
        "type": "comparison",
        "level": "hard",
        "supporting_facts": {"title": ["A", "B"], "sent_id": [0, 1]},
        "context": {
            "title": ["A", "B", "C"],
            "sentences": [["A one.", " A two."], ["B one.", " B two."], ["C."]],
        },
    }
    (tmp_path / "off.jsonl").write_text(json.dumps(official) + "\n")
    (tmp_path / "hf.jsonl").write_text(json.dumps(hf) + "\n")
    assert detect_format(tmp_path / "off.jsonl") == "hotpotqa"
    assert detect_format(tmp_path / "hf.jsonl") == "hotpotqa-hf"
    a = load_file(tmp_path / "off.jsonl").tasks[0]
    b = load_file(tmp_path / "hf.jsonl").tasks[0]
    assert a == b
    assert [p.is_supporting for p in a.paragraphs] == [True, True, False]
    assert a.paragraphs[0].text == "A one. A two."


def test_twowiki_hops_count_supporting_articles(shared_data: Path) -> None:
    tasks = load_file(shared_data / "2wikimultihopqa/2wiki_dev.migres164.jsonl").tasks
    by_type = collections.defaultdict(set)
    for task in tasks:
        by_type[task.question_type].add(task.n_hops)
    assert by_type["bridge_comparison"] == {4}
    assert by_type["compositional"] == {2}
    # 2Wiki sentences have no leading space: joined with one
    first = tasks[0].paragraphs[0].text
    assert "director and screenwriter. He directed 20 films" in first


def test_musique_aliases_hops_and_decomposition(shared_data: Path) -> None:
    loaded = load_file(shared_data / "musique/musique_ans_v1.0_dev.kag100.json")
    task = loaded.tasks["2hop__82713_84616"]
    assert task.golden_answers[0].startswith("for Best Performance by a Leading Actress")
    assert set(task.golden_answers[1:]) == {"leading role", "star", "leading actress", "lead"}
    assert task.n_hops == 2 and task.question_type == "2hop"
    assert len(task.paragraphs) == 20
    steps = loaded.decompositions["2hop__82713_84616"]
    assert steps[0].answer == "Audrey Hepburn"
    four = [t for t in loaded.tasks if t.question_type.startswith("4hop")]
    assert four and all(t.n_hops == 4 for t in four)


def test_musique_jsonl_and_json_array_read_the_same(tmp_path: Path, shared_data: Path) -> None:
    records = json.loads((shared_data / "musique/musique_ans_v1.0_dev.kag100.json").read_text())[:5]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "m.json").write_text(json.dumps(records, indent=2))
    assert load_file(tmp_path / "m.jsonl").tasks.ids == load_file(tmp_path / "m.json").tasks.ids
    assert list(load_file(tmp_path / "m.jsonl").tasks) == list(load_file(tmp_path / "m.json").tasks)


def test_bamboogle_second_answer_column_is_an_alias(shared_data: Path) -> None:
    tasks = load_file(shared_data / "bamboogle/bamboogle.csv").tasks
    washington = [t for t in tasks if "mother of the father of George Washington" in t.question]
    assert len(washington) == 1
    assert washington[0].golden_answers == ("Mildred Warner", "Mildred Gale")
    assert sum(len(t.golden_answers) == 2 for t in tasks) == 1
    assert all(not t.paragraphs for t in tasks)


def test_bamboogle_with_a_header_row(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    path.write_text('Question,Answer\n"Who, exactly?",Ann\n')
    task = load_file(path).tasks[0]
    assert task.question == "Who, exactly?" and task.golden_answers == ("Ann",)


def test_popqa_json_string_fields_are_decoded(shared_data: Path) -> None:
    task = load_file(shared_data / "popqa/popqa.hipporag2_1000.json").tasks["0"]
    assert task.golden_answers == (
        "politician",
        "political leader",
        "political figure",
        "polit.",
        "pol",
    )
    assert task.question_type == "occupation" and task.n_hops == 1
    assert [p.is_supporting for p in task.paragraphs] == [True, True]


def test_popqa_tsv(tmp_path: Path) -> None:
    path = tmp_path / "popQA.tsv"
    path.write_text(
        "id\tsubj\tprop\tquestion\tpossible_answers\n"
        '7\tX\tcountry\tIn what country is X?\t["France", "French Republic"]\n'
    )
    task = load_file(path).tasks[0]
    assert task.task_id == "7" and task.golden_answers == ("France", "French Republic")


def test_nq_open_and_flashrag(shared_data: Path) -> None:
    nq = load_file(shared_data / "nq/NQ-open.dev.first1000.jsonl")
    assert nq.tasks[0].golden_answers == ("14 December 1972 UTC", "December 1972")
    assert nq.tasks[0].task_id == "nq-0" and nq.name == "nq"
    fr = load_file(shared_data / "nq/flashrag_quickstart_nq_test.jsonl", name="nq")
    assert fr.tasks["test_0"].golden_answers == ("Wilhelm Conrad Röntgen",)
    assert {t.dataset for t in fr.tasks} == {"nq"}


def test_a_string_gold_loads_as_one_answer_in_every_format(tmp_path: Path) -> None:
    rows = {
        "flashrag": {"id": "q1", "question": "Capital?", "golden_answers": "Paris"},
        "nq-open": {"question": "Capital?", "answer": "Paris"},
        "hotpotqa": {"_id": "q1", "question": "Capital?", "answer": "Paris", "context": []},
    }
    for fmt, row in rows.items():
        path = tmp_path / f"{fmt}.jsonl"
        path.write_text(json.dumps(row) + "\n")
        assert load_file(path, format=fmt).tasks[0].golden_answers == ("Paris",), fmt


def test_tracerl_export_roundtrips_through_the_flashrag_loader(tmp_path: Path) -> None:
    # `QATask.to_json` lines (the synthetic world's export) load back unchanged
    from envs.tasks import Paragraph, QATask

    task = QATask(
        task_id="w-1",
        question="Where was Ann born?",
        golden_answers=("Velmora",),
        question_type="bridge",
        n_hops=2,
        supporting_doc_ids=("d1", "d2"),
        paragraphs=(Paragraph(title="Ann", text="Ann was born in Velmora.", is_supporting=True),),
        dataset="synthetic",
    )
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task.to_json()) + "\n")
    assert detect_format(path) == "flashrag"
    loaded = load_file(path)
    assert loaded.tasks[0] == task and loaded.name == "flashrag"


def test_format_override_and_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"id": "1", "question": "Q", "answer": ["a"]}) + "\n")
    assert load_file(path, format="nq-open").tasks[0].task_id == "1"
    with pytest.raises(UnknownBenchmarkNameError, match="Did you mean 'nq-open'"):
        load_file(path, format="nq_open")
    with pytest.raises(DatasetFormatError, match="missing field 'golden_answers'"):
        load_file(path, format="flashrag")


def test_undetectable_and_malformed_files_name_the_place(tmp_path: Path) -> None:
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"foo": 1}) + "\n")
    with pytest.raises(DatasetFormatError, match=r"odd.jsonl:1: cannot tell the format"):
        load_file(odd)
    broken = tmp_path / "broken.jsonl"
    good = {"id": "1", "question": "Q", "golden_answers": ["a"]}
    broken.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(DatasetFormatError, match=r"broken.jsonl:2"):
        load_file(broken)
    no_answer = tmp_path / "noanswer.jsonl"
    no_answer.write_text(json.dumps({**good, "golden_answers": [" "]}) + "\n")
    with pytest.raises(DatasetFormatError, match=r"noanswer.jsonl:1.*no golden answers"):
        load_file(no_answer)
    dup = tmp_path / "dup.jsonl"
    dup.write_text((json.dumps(good) + "\n") * 2)
    with pytest.raises(DatasetFormatError, match=r"dup.jsonl:2: duplicate id '1'"):
        load_file(dup)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DatasetFormatError, match="no records"):
        load_file(empty)
    with pytest.raises(DatasetFormatError, match="does not exist"):
        load_file(tmp_path / "missing.jsonl")


def test_limit_keeps_the_first_records(shared_data: Path) -> None:
    loaded = load_file(shared_data / "nq/NQ-open.dev.first1000.jsonl", limit=7)
    assert loaded.tasks.ids == tuple(f"nq-{i}" for i in range(7))


def test_combining_overlapping_hotpotqa_samples_keeps_975_unique(shared_data: Path) -> None:
    parts = [
        load_file(shared_data / "hotpotqa" / name)
        for name in (
            "hotpot_dev_distractor.rpt_sample500.hf.jsonl",
            "hotpot_dev_distractor.rpt_sample300.hf.jsonl",
            "hotpot_dev_distractor.migres200.jsonl",
        )
    ]
    combined = combine(parts)
    assert len(combined.tasks) == 975  # docs/benchmarks.md, "The real dev samples"
    assert len(combined.sources) == 3


def test_tasks_hash_changes_with_content(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps({"id": "1", "question": "Q", "golden_answers": ["a"]}) + "\n")
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"id": "1", "question": "Q", "golden_answers": ["b"]}) + "\n")
    assert load_file(a).tasks_sha256 != load_file(b).tasks_sha256
    assert load_file(a).tasks_sha256 == load_file(a).tasks_sha256


# --- hub path: a local folder laid out like a hub repo (no download) --------------------------


def _local_hub(root: Path) -> Path:
    (root / "hotpotqa").mkdir(parents=True)
    (root / "musique").mkdir()
    (root / "README.md").write_text(
        textwrap.dedent(
            """\
            ---
            configs:
              - config_name: hotpotqa
                data_files:
                  - split: dev
                    path: hotpotqa/dev.jsonl
              - config_name: musique
                data_files:
                  - split: dev
                    path: musique/dev.jsonl
            ---
            A local mirror of two FlashRAG configs.
            """
        )
    )
    hotpot = {
        "id": "5a8",
        "question": "Which is older, A or B?",
        "golden_answers": ["A"],
        "metadata": {
            "type": "comparison",
            "supporting_facts": {"title": ["A", "B"], "sent_id": [0, 0]},
            "context": {"title": ["A", "B", "C"], "sentences": [["A is."], ["B is."], ["C."]]},
        },
    }
    (root / "hotpotqa" / "dev.jsonl").write_text(json.dumps(hotpot) + "\n")
    musique = {"id": "3hop1__1_2_3", "question": "Q?", "golden_answers": ["x", "y"]}
    (root / "musique" / "dev.jsonl").write_text(json.dumps(musique) + "\n")
    return root


def test_hub_loading_from_a_local_repo_folder(tmp_path: Path) -> None:
    hub = _local_hub(tmp_path / "hub")
    cache = tmp_path / "cache"
    loaded = load_hub(str(hub), config="hotpotqa", split="dev", cache_dir=cache)
    task = loaded.tasks[0]
    assert (task.question_type, task.n_hops, task.golden_answers) == ("comparison", 2, ("A",))
    assert [p.is_supporting for p in task.paragraphs] == [True, True, False]
    assert loaded.sources[0].kind == "hub" and loaded.sources[0].location.endswith(":hotpotqa@dev")
    # the registry name resolves to the same config in a local snapshot
    named = load_named("musique", hub_path=hub, cache_dir=cache)
    assert named.name == "musique"
    assert (named.tasks[0].question_type, named.tasks[0].n_hops) == ("3hop1", 3)
    with pytest.raises(UnknownBenchmarkNameError, match="nope"):
        load_hub(str(hub), config="nope", split="dev", cache_dir=cache)
    with pytest.raises(UnknownBenchmarkNameError, match="train"):
        load_hub(str(hub), config="musique", split="train", cache_dir=cache)


def test_unknown_dataset_name_suggests_the_closest() -> None:
    with pytest.raises(UnknownBenchmarkNameError, match="Did you mean 'hotpotqa'"):
        load_named("hotpot_qa")


def test_offline_hub_loading_says_how_to_use_local_files(tmp_path: Path) -> None:
    # HF_HUB_OFFLINE is read when huggingface_hub is imported, so this runs in a fresh process
    code = (
        "from envs.qa_datasets.loaders import load_named\n"
        "from envs.qa_datasets.errors import DatasetUnavailable\n"
        "try:\n"
        "    load_named('hotpotqa')\n"
        "except DatasetUnavailable as err:\n"
        "    print('UNAVAILABLE', err)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "UNAVAILABLE" in out.stdout
    assert "--data-file" in out.stdout and "--hub-path" in out.stdout
    assert "RUC-NLPIR/FlashRAG_datasets" in out.stdout
    assert issubclass(DatasetUnavailable, ConnectionError)
