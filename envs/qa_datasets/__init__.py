"""Multi-hop QA datasets as task sets: loaders, task-file formats, corpora of their paragraphs.

The face of the room; what the trainers (`--task.source file`) and `tracerl bench` read:

    from envs.qa_datasets import load_file, load_named

    hotpot = load_named("hotpotqa", split="dev", limit=100)  # a registry name (the Hub)
    mine = load_file("questions.jsonl")  # FlashRAG, Search-R1 parquet, the datasets' own JSON

- **loaders** (`loaders.py`): `DATASETS` (the registry), `FORMATS`, `detect_format`,
  `load_file`, `load_named`, `load_hub`, `combine`; each returns a `LoadedDataset` of
  `envs.tasks.QATask`s with where they came from and a content hash;
- **corpus** (`corpus.py`): `build_corpus` pools the datasets' own paragraphs into a retrieval
  corpus, `build_index` indexes it, `attach_doc_ids` marks supporting paragraphs;
- **errors** (`errors.py`): `BenchmarkError` and its kinds, each also the nearest builtin.

The package is not called `datasets`: see `loaders.py`.
"""

from envs.qa_datasets.corpus import (
    CorpusBuild,
    attach_doc_ids,
    build_corpus,
    build_index,
    paragraph_doc_id,
    write_corpus_dir,
)
from envs.qa_datasets.errors import (
    BenchmarkError,
    DatasetFormatError,
    DatasetUnavailable,
    NoParagraphsError,
    UnknownBenchmarkNameError,
)
from envs.qa_datasets.loaders import (
    DATASETS,
    FORMATS,
    DatasetSource,
    DecompositionStep,
    FormatName,
    HubDataset,
    LoadedDataset,
    combine,
    detect_format,
    load_file,
    load_hub,
    load_named,
)

__all__ = [
    "DATASETS",
    "FORMATS",
    "BenchmarkError",
    "CorpusBuild",
    "DatasetFormatError",
    "DatasetSource",
    "DatasetUnavailable",
    "DecompositionStep",
    "FormatName",
    "HubDataset",
    "LoadedDataset",
    "NoParagraphsError",
    "UnknownBenchmarkNameError",
    "attach_doc_ids",
    "build_corpus",
    "build_index",
    "combine",
    "detect_format",
    "load_file",
    "load_hub",
    "load_named",
    "paragraph_doc_id",
    "write_corpus_dir",
]
