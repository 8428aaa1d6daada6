"""Write HotpotQA as the prompt dataset that `tracerl train --backend openrlhf` reads.

Each output line is one question:

    {"prompt": "<question>", "task": "<QATask JSON>", "datasource": "hotpotqa"}

`prompt` and `task` are the launcher's default `--data.input_key` and `--data.label_key`;
`task` holds `envs.QATask.to_json()` as a string (question, gold answers with aliases, type),
from which the environment builds its own Search-R1 prompt and scores answers; `datasource`
names the group in OpenRLHF's evaluation metrics (`eval_hotpotqa_pass1`).

Sources, through `envs.qa_datasets.loaders`:

- the Hugging Face Hub (default): FlashRAG's HotpotQA (`RUC-NLPIR/FlashRAG_datasets`, config
  `hotpotqa`), `train` for training and `dev` for evaluation, as Search-R1 trains;
- `--hub-path DIR`: a downloaded snapshot of that repo, for machines without hub access;
- `--train-file` / `--eval-file`: any local file in a format `tracerl bench` reads (official
  HotpotQA JSON, the HF distractor schema, FlashRAG JSONL, ...).

Usage:

    python scripts/prepare_hotpotqa.py --out data/hotpotqa
    python scripts/prepare_hotpotqa.py --out data/hotpotqa --hub-path ~/FlashRAG_datasets
    python scripts/prepare_hotpotqa.py --out /tmp/hq --train-file hotpot_train_v1.1.json \\
        --eval-file hotpot_dev_distractor_v1.json --eval-limit 512
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

from envs.qa_datasets import LoadedDataset, load_file, load_named

log = logging.getLogger("prepare_hotpotqa")


@dataclass(frozen=True, kw_only=True)
class Args:
    """Where to read HotpotQA from and where to write the prompt files."""

    out: Path
    """Output folder: `train.jsonl` and `eval.jsonl` go there."""
    hub_path: Path | None = None
    """A local copy of the FlashRAG datasets repo (instead of the hub)."""
    train_file: Path | None = None
    """A local training file (instead of FlashRAG's `train` split)."""
    eval_file: Path | None = None
    """A local evaluation file (instead of FlashRAG's `dev` split)."""
    train_limit: int | None = None
    """Keep the first N training questions."""
    eval_limit: int | None = 512
    """Keep the first N evaluation questions (evaluation plays every one, n times)."""
    paragraphs: bool = False
    """Keep each question's own paragraphs (the distractor context) in its task. The search
    environment never reads them; they only make every label kilobytes longer."""
    json: bool = False
    """Print one JSON object with the counts as the last line of stdout."""


def _load(file: Path | None, split: str, limit: int | None, hub_path: Path | None) -> LoadedDataset:
    if file is not None:
        return load_file(file, limit=limit, name="hotpotqa")
    return load_named("hotpotqa", split=split, limit=limit, hub_path=hub_path)


def write_prompts(dataset: LoadedDataset, path: Path, *, paragraphs: bool = False) -> int:
    """Write one prompt line per task; returns the number of lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for task in dataset.tasks:
            if not paragraphs:
                task = dataclasses.replace(task, paragraphs=())
            row = {
                "prompt": task.question,
                "task": json.dumps(task.to_json(), ensure_ascii=False),
                "datasource": "hotpotqa",
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(dataset.tasks)


def main(args: Args) -> dict[str, object]:
    """Write `train.jsonl` and `eval.jsonl`; returns the counts and the sources."""
    train = _load(args.train_file, "train", args.train_limit, args.hub_path)
    evaluation = _load(args.eval_file, "dev", args.eval_limit, args.hub_path)
    overlap = set(train.tasks.ids) & set(evaluation.tasks.ids)
    if overlap:
        log.warning("%d questions are in both files (e.g. %s)", len(overlap), sorted(overlap)[0])
    return {
        "train": write_prompts(train, args.out / "train.jsonl", paragraphs=args.paragraphs),
        "eval": write_prompts(evaluation, args.out / "eval.jsonl", paragraphs=args.paragraphs),
        "overlap": len(overlap),
        "train_sha256": train.tasks_sha256,
        "eval_sha256": evaluation.tasks_sha256,
        "out": str(args.out),
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    cli_args = tyro.cli(Args)
    result = main(cli_args)
    print(
        f"wrote {result['train']} training and {result['eval']} evaluation questions to "
        f"{result['out']}",
        file=sys.stderr,
    )
    if cli_args.json:
        print(json.dumps(result, sort_keys=True), flush=True)
