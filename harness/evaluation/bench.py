"""`tracerl bench` and `tracerl corpus`.

`tracerl bench` with no arguments evaluates the scripted oracle and naive agents on the embedded
synthetic world, in seconds; with `--dataset`/`--data-file` it evaluates any agent on real
questions, against an index (`--index`), a corpus file (`--corpus`), a retrieval server
(`--retriever-url`) or, by default, the datasets' own paragraphs.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import random
import re
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from envs import NaiveAgent, OracleAgent, SearchQAConfig, SearchQAEnv, World
from envs.errors import EnvError
from envs.protocol import Protocol
from envs.qa_datasets import (
    BenchmarkError,
    DatasetSource,
    DecompositionStep,
    FormatName,
    LoadedDataset,
    UnknownBenchmarkNameError,
    attach_doc_ids,
    build_corpus,
    build_index,
    combine,
    load_file,
    load_named,
    write_corpus_dir,
)
from envs.rewards import RewardKind
from envs.synthetic.config import WorldConfig
from envs.tasks import TaskSet
from envs.tools import SearchTool, Tool
from harness.errors import EndpointError, EndpointRejected, HarnessError
from harness.evaluation.agents import DecompositionOracle, HTTPAgent, ScriptedAgent, oracle_plans
from harness.evaluation.report import (
    ACC_NOTE,
    COLUMNS,
    metric_cells,
    retrieval_setting,
    write_reports,
)
from harness.evaluation.runs import (
    VOLATILE,
    EpisodeStream,
    RunState,
    check_fresh_out,
    read_finished,
)
from harness.policies.base import PolicyBackend, SamplingParams
from harness.policies.policy_protocol import (
    ENV_FIELDS,
    PolicyProtocol,
    PolicyProtocolError,
    read_policy_protocol,
)
from harness.rollout.agent import Agent, PolicyAgent
from harness.rollout.evaluation import EpisodeRecord, Report, evaluate
from retrieval import (
    BM25Retriever,
    CachedRetriever,
    HTTPRetriever,
    IndexManifest,
    RetrievalError,
    Retriever,
    make_retriever,
    read_corpus,
)

__all__ = [
    "AgentArgs",
    "BenchConfig",
    "BenchResult",
    "CorpusConfig",
    "DataArgs",
    "LoadedData",
    "bench",
    "corpus",
    "load_data",
    "make_agent",
    "run_bench",
    "with_policy_protocol",
]

log = logging.getLogger(__name__)

SYNTHETIC_SPLITS = ("all", "train", "dev", "test", "test_entities", "fact_disjoint")


@dataclass(frozen=True, kw_only=True)
class DataArgs:
    """Which questions: registry names, local files, or both."""

    dataset: tuple[str, ...] = ()
    """Registry names (`hotpotqa`, `musique`, `2wikimultihopqa`, `nq`, ..., `synthetic`);
    loaded from the Hugging Face Hub through `datasets`, or from `--hub-path`."""
    data_file: tuple[Path, ...] = ()
    """Local dataset files in any supported format (detected from the content)."""
    format: FormatName | None = None
    """Force a file format instead of detecting it from the content."""
    name: tuple[str, ...] = ()
    """Dataset names to report, one per `--data-file`, in order; unset: a FlashRAG folder
    layout's folder name (`DIR/<name>/<split>.jsonl`), else the format's name."""
    split: str | None = None
    """Hub split to load instead of the registry's (test, else dev); for `synthetic`: all,
    train, dev, test, test_entities, or fact_disjoint (questions none of whose hop facts a
    train question chains: `harness.training.task_sources.fact_disjoint_questions`)."""
    hub_path: Path | None = None
    """A local copy of the hub repo (e.g. from `hf download`) to load `--dataset` from."""
    limit: int | None = None
    """Keep the first N questions of each dataset (files of one dataset count together)."""
    sample: int | None = None
    """Keep N questions drawn at random (`--sample-seed`), stratified by dataset, question
    type and hop count: each group keeps its share of N (largest remainders round)."""
    sample_seed: int = 0
    """Seeds `--sample`'s draw (apart from `--seed`, so samples at several seeds share the
    questions)."""
    world_seed: int = 0
    """Seed of the synthetic world (`--dataset synthetic`, the default)."""
    world: WorldConfig = field(default_factory=WorldConfig)
    """Size and shape of the synthetic world (`--world.sentences-per-doc 1`, ...); a field left
    at its default takes the value of the policy's `policy_protocol.json`, if it records a world."""

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit {self.limit}: must be >= 1")
        if self.sample is not None and (self.sample < 1 or self.limit is not None):
            raise ValueError(f"--sample {self.sample}: must be >= 1, and not with --limit")
        if self.name and len(self.name) != len(self.data_file):
            raise ValueError(
                f"--name: {len(self.name)} names for {len(self.data_file)} --data-file paths; "
                "give one name per file, in the same order"
            )


@dataclass(frozen=True, slots=True)
class LoadedData:
    """Questions (each source, and all combined), plus the synthetic world if they are its."""

    parts: tuple[LoadedDataset, ...]
    world: World | None

    @property
    def dataset(self) -> LoadedDataset:
        """Every part combined (a task id shared by two parts counts once)."""
        return combine(self.parts)


def _load_synthetic(args: DataArgs) -> LoadedData:
    split = args.split or "all"
    if split not in SYNTHETIC_SPLITS:
        raise UnknownBenchmarkNameError(
            f"synthetic split {split!r}: choose one of {SYNTHETIC_SPLITS}"
        )
    world = World.generate(args.world_seed, args.world)
    if split == "fact_disjoint":  # questions of a larger draw of the same world (same corpus)
        # the training room's split, imported only for this set (bench otherwise loads none)
        from harness.training.task_sources import fact_disjoint_questions

        world, tasks = fact_disjoint_questions(world, world.split().train)
    else:
        tasks = world.tasks if split == "all" else getattr(world.split(), split)
    if args.limit is not None:
        tasks = tasks[: args.limit]
    decompositions = {
        t.task_id: tuple(
            DecompositionStep(question=s.query, answer=s.answer)
            for s in world.decomposition(t.task_id).steps
        )
        for t in tasks
    }
    source = DatasetSource(
        kind="synthetic",
        location=f"World.generate({args.world_seed}), split {split}, fingerprint "
        f"{world.fingerprint[:16]}",
        format="synthetic",
    )
    dataset = LoadedDataset(
        name="synthetic", tasks=tasks, sources=(source,), decompositions=decompositions
    )
    return LoadedData(parts=(dataset,), world=world)


def load_data(args: DataArgs, *, allow_synthetic: bool = True) -> LoadedData:
    """Load what `args` names (files, then registry names); nothing named means `synthetic`.

    Raises:
        BenchmarkError: nothing could be loaded, or the synthetic world is mixed with others.
    """
    if not allow_synthetic and not args.dataset and not args.data_file:
        raise BenchmarkError(
            "no questions: pass --dataset NAME or --data-file PATH (the synthetic world "
            "carries its own corpus: `tracerl world --out DIR --index`)"
        )
    names = args.dataset or (() if args.data_file else ("synthetic",))
    if "synthetic" in names:
        if not allow_synthetic:
            raise BenchmarkError(
                "the synthetic world carries its own corpus: `tracerl world --out DIR --index`"
            )
        if len(names) > 1 or args.data_file:
            raise BenchmarkError("evaluate the synthetic world on its own, not mixed with others")
        return _sampled(_load_synthetic(args), args)
    file_names = args.name or (None,) * len(args.data_file)
    parts = [
        load_file(path, format=args.format, name=name)
        for path, name in zip(args.data_file, file_names, strict=True)
    ]
    parts += [
        load_named(name, split=args.split, limit=args.limit, hub_path=args.hub_path)
        for name in names
    ]
    if args.limit is not None:
        parts = [_first_per_dataset(combine(parts), args.limit)]
    return _sampled(LoadedData(parts=tuple(parts), world=None), args)


def _sampled(data: LoadedData, args: DataArgs) -> LoadedData:
    """`data` cut to `--sample N` questions, stratified by (dataset, question type, hops).

    Raises:
        BenchmarkError: N is more than there are questions.
    """
    if args.sample is None:
        return data
    dataset = data.dataset
    if args.sample > len(dataset.tasks):
        raise BenchmarkError(
            f"--sample {args.sample}: there are only {len(dataset.tasks)} questions"
        )
    groups: dict[tuple[str, str, int | None], list[int]] = {}
    for i, task in enumerate(dataset.tasks):
        groups.setdefault((task.dataset, task.question_type, task.n_hops), []).append(i)
    total = len(dataset.tasks)
    shares = {k: args.sample * len(v) / total for k, v in groups.items()}
    counts = {k: int(share) for k, share in shares.items()}
    by_remainder = sorted(groups, key=lambda k: (counts[k] - shares[k], str(k)))
    for key in by_remainder[: args.sample - sum(counts.values())]:
        counts[key] += 1
    rng = random.Random(args.sample_seed)
    kept = sorted(i for k, v in groups.items() for i in rng.sample(v, counts[k]))
    tasks = TaskSet(dataset.tasks[i] for i in kept)
    ids = {t.task_id for t in tasks}
    sample = replace(
        dataset,
        tasks=tasks,
        decompositions={k: v for k, v in dataset.decompositions.items() if k in ids},
    )
    return LoadedData(parts=(sample,), world=data.world)


def _first_per_dataset(dataset: LoadedDataset, limit: int) -> LoadedDataset:
    """The first `limit` questions of each dataset name.

    Several files of one dataset count together, so `--limit` means the same whatever the
    files are split into.
    """
    seen: dict[str, int] = {}
    kept = []
    for task in dataset.tasks:
        seen[task.dataset] = seen.get(task.dataset, 0) + 1
        if seen[task.dataset] <= limit:
            kept.append(task)
    ids = {t.task_id for t in kept}
    return replace(
        dataset,
        tasks=TaskSet(kept),
        decompositions={k: v for k, v in dataset.decompositions.items() if k in ids},
    )


# --- tracerl corpus ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CorpusConfig(DataArgs):
    """Pool the paragraphs of QA datasets into a deduplicated corpus and index it.

    Writes OUT/corpus.jsonl ({"id", "contents"}), OUT/tasks.jsonl (the questions with the corpus
    ids of their supporting paragraphs, for `tracerl bench --data-file`), OUT/corpus_manifest.json
    and, unless --index none, a BM25 index in OUT/bm25 (for `tracerl bench --index`).
    """

    out: Path = Path("runs/corpus")
    """Output folder."""
    index: Literal["bm25", "none"] = "bm25"
    """Index to build over the corpus."""
    overwrite: bool = False
    """Replace a corpus (and index) already in --out."""


def corpus(argv: list[str]) -> int:
    """`tracerl corpus`: build a corpus (and a BM25 index) from datasets' paragraphs."""
    config = tyro.cli(CorpusConfig, args=argv, prog="tracerl corpus")
    try:
        existing = [p for p in (config.out / "corpus.jsonl", config.out / "bm25") if p.exists()]
        if existing and not config.overwrite:
            raise BenchmarkError(
                f"{existing[0]} already exists; pass --overwrite to replace it, or choose "
                "another --out"
            )
        data = load_data(config, allow_synthetic=False)
        build = build_corpus(data.parts)
    except BenchmarkError as err:
        log.error("%s", err)
        return 2
    paths = write_corpus_dir(build, config.out)
    print(
        f"corpus: {build.stats['n_documents']:,} unique documents from "
        f"{build.stats['n_paragraphs']:,} paragraphs of {build.stats['n_tasks']:,} questions "
        f"-> {paths['corpus']}"
    )
    print(f"tasks with supporting doc ids -> {paths['tasks']}")
    if config.index == "bm25":
        index_dir = config.out / "bm25"
        index_id = build_index(build.documents, index_dir, progress=True)
        print(f"BM25 index {index_id} -> {index_dir}")
        print(f"next: tracerl bench --data-file {paths['tasks']} --index {index_dir}")
    return 0


# --- tracerl bench -----------------------------------------------------------------------------

AgentKind = Literal["oracle", "naive", "transformers", "vllm", "openai"]
BenchProtocol = Literal["trace-rl", "search-r1", "tools", "react"]
"""How an agent talks to the env: the two text protocols of `envs.protocol`, native tool calls
(`tools`) or ReAct's format (`react`); the last two play the trace-rl env through structured
actions (`harness.evaluation.tool_agents`)."""


@dataclass(frozen=True, kw_only=True)
class AgentArgs:
    """Which agents, and how they generate."""

    agent: tuple[AgentKind, ...] = ("oracle", "naive")
    """Agents to evaluate, each on the same questions: `oracle` and `naive` are scripted;
    `transformers` and `vllm` run `--model DIR` locally; `openai` calls `--base-url`."""
    model: str | None = None
    """transformers / vllm: a model directory; openai: the served model name."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """openai: the endpoint (`vllm serve MODEL` listens on port 8000)."""
    api: Literal["completions", "chat"] = "completions"
    """openai: `completions` (the transcript as one text, Search-R1's protocol) or `chat`."""
    api_key: str | None = None
    """openai: the API key; unset reads $OPENAI_API_KEY."""
    extensions: Literal["vllm", "none"] = "vllm"
    """openai: send vLLM's extra fields (`none` for hosted APIs that reject unknown fields)."""
    temperature: float = 0.0
    """0 is greedy."""
    top_p: float = 1.0
    max_new_tokens: int = 512
    """Per action."""
    max_context_tokens: int = 4096
    """transformers / vllm: stop an episode whose transcript would outgrow this."""
    chat_template: bool | None = None
    """`--chat-template` / `--no-chat-template`: wrap the prompt as a user message in the
    model's chat template, or not. Unset: on with `--protocol search-r1` when the tokenizer has
    a template (as Search-R1 does), else off. openai needs `--tokenizer` for it."""
    tokenizer: Path | None = None
    """openai: a local tokenizer folder whose chat template wraps the prompt (the served
    model's, for `--protocol search-r1`)."""
    concurrency: int = 16
    """Episodes in flight: the batch of a local model; for openai, requests always in flight
    (each episode sends its next turn as soon as its reply is back)."""
    timeout_s: float = 120.0
    """openai: the wall-clock limit of one attempt of a request, however slowly the server
    sends."""
    max_reply_bytes: int = 4_000_000
    """openai: a reply body over this many bytes is refused; it ends only its episode."""
    max_retries: int = 3
    """openai: retries on connection errors, 429 and 5xx."""
    device: str = "cpu"
    """transformers: torch device."""
    epsilon: float = 0.0
    """oracle on the synthetic world: noise rate (wrong queries and answers)."""
    prompt_template: str | None = None
    """The prompt, with a literal `{question}`; unset: the policy's (`policy_protocol.json`),
    else Search-R1's instruction prompt."""
    prompt_template_file: Path | None = None
    """A file holding the prompt template (instead of `--prompt-template`)."""

    def __post_init__(self) -> None:
        # checked at parse time: a bad value must fail before any episode, not mid-run
        if not 0.0 <= self.epsilon <= 1.0:  # NaN fails both comparisons
            raise ValueError(f"--epsilon {self.epsilon}: must be in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class BenchConfig(AgentArgs, DataArgs):
    """Evaluate agents on multi-hop QA: EM / sub-EM / F1 per dataset, question type and hops.

    With no arguments: the scripted oracle and naive agents on the embedded synthetic world.
    Writes OUT/report.json, OUT/report.md, OUT/trajectories.jsonl and OUT/report.png.
    """

    index: Path | None = None
    """An index directory (`tracerl corpus`, `tracerl index build`, `tracerl world --index`)."""
    corpus: Path | None = None
    """A corpus JSONL ({"id", "contents"}) to index with BM25 in memory."""
    retriever_url: str | None = None
    """A Search-R1-protocol retrieval server (`tracerl serve-retriever`, wiki-18 servers)."""
    corpus_world_seed: int | None = None
    """Synthetic questions only: search this world's documents instead of their own (the
    decoy check: no document holds an answer, so EM measures answering from memory)."""
    protocol: BenchProtocol | None = None
    """`search-r1` reproduces Search-R1's prompt, observation text and action parsing byte for
    byte (to evaluate its checkpoints); `trace-rl` is ours (docs/benchmarks.md, "Where we
    differ"); `tools` offers the env's tools as native function calls (chat API) and `react`
    plays ReAct's Thought / Search[...] / Finish[...] format, both `--agent openai` only.
    Unset: the policy's (`policy_protocol.json`), else trace-rl."""
    tool: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """`--tool MODULE:CLASS` (repeatable): a tool next to search (an `envs.Tool` subclass
    built with no arguments, e.g. `envs.tools:CalculatorTool`)."""
    max_turns: int | None = None
    """Actions per episode. Unset: the policy's, else `SearchQAConfig`'s, or 5 with `--protocol
    search-r1` (its `max_turns=4` is four search rounds plus a final answer-only round)."""
    top_k: Annotated[int | None, tyro.conf.arg(aliases=("--topk",))] = None
    """Documents per search (`--topk`, Search-R1's spelling, too). Unset: the policy's, else
    `SearchQAConfig`'s."""
    max_doc_chars: int | None = None
    """Each document is cut to this many characters (trace-rl protocol). Unset: the policy's,
    else `SearchQAConfig`'s."""
    reward: RewardKind = "em"
    """The env's reward (EM / sub-EM / F1 are reported whatever it is)."""
    seed: int = 0
    """Seeds env resets and sampling."""
    out: Path = Path("runs/bench")
    """Output folder."""
    progress: bool = True
    """Draw a progress bar with the running EM (stderr)."""
    json: bool = False
    """Print one JSON object (overall metrics per agent) as the last line of stdout."""
    resume: bool = False
    """Continue the run in --out: keep its finished episodes (trajectories.jsonl) and play only
    the rest; the report is the one an uninterrupted run writes."""
    overwrite: bool = False
    """Replace the run already in --out (without it, a run there is refused, never lost)."""

    def __post_init__(self) -> None:
        AgentArgs.__post_init__(self)
        DataArgs.__post_init__(self)
        if self.seed < 0:  # numpy's seeding refuses it only after start-up, as an internal error
            raise ValueError(f"--seed {self.seed}: must be >= 0")

    @property
    def env_protocol(self) -> Protocol:
        """The env's text protocol: `--protocol` search-r1, else trace-rl."""
        return "search-r1" if self.protocol == "search-r1" else "trace-rl"

    @property
    def agent_protocol(self) -> BenchProtocol:
        """`--protocol`, or trace-rl."""
        return self.protocol or "trace-rl"

    def env_settings(self) -> SearchQAConfig:
        """The env these flags describe: the one env-settings type, `tracerl train`'s too.

        Each flag that is set replaces its field; an unset one keeps `SearchQAConfig`'s
        default, except `max_turns` under `--protocol search-r1`: 5, Search-R1's four search
        rounds and its final answer-only round.

        Raises:
            EnvConfigError: a value the env refuses (checked before any question is loaded).
        """
        given: dict[str, Any] = {
            "max_turns": self.max_turns,
            "top_k": self.top_k,
            "max_doc_chars": self.max_doc_chars,
            "prompt_template": self.prompt_template,
        }
        if self.max_turns is None and self.env_protocol == "search-r1":
            given["max_turns"] = 5
        return SearchQAConfig(
            reward=self.reward,
            protocol=self.env_protocol,
            tools=self.tool,
            **{k: v for k, v in given.items() if v is not None},
        )


def _retriever(config: BenchConfig, data: LoadedData) -> tuple[Retriever, dict[str, Any]]:
    """The retriever the run uses, and how the report describes it."""
    sources = (config.index, config.corpus, config.retriever_url, config.corpus_world_seed)
    given = [x for x in sources if x is not None]
    if len(given) > 1:
        raise BenchmarkError(
            "pass at most one of --index, --corpus, --retriever-url, --corpus-world-seed"
        )
    if config.corpus_world_seed is not None and data.world is None:
        raise BenchmarkError("--corpus-world-seed searches a synthetic world: for its questions")
    if config.retriever_url is not None or config.index is not None:
        spec = str(config.retriever_url or config.index)
        retriever = make_retriever(spec)
        source = {"spec": spec}
    elif config.corpus is not None:
        retriever = CachedRetriever(BM25Retriever.build(read_corpus(config.corpus)))
        source = {"corpus": str(config.corpus)}
    elif config.corpus_world_seed is not None:
        decoy = World.generate(config.corpus_world_seed, config.world)
        retriever = CachedRetriever(BM25Retriever.build(decoy.documents))
        source = {"corpus": f"world {decoy.seed}'s documents (a decoy: not the questions' own)"}
    elif data.world is not None:
        retriever = CachedRetriever(BM25Retriever.build(data.world.documents))
        source = {"corpus": "the synthetic world's documents"}
    else:
        build = build_corpus(data.parts)  # NoParagraphsError says what to pass instead
        log.info(
            "no --index/--corpus/--retriever-url: indexing the datasets' own %d paragraphs "
            "with BM25",
            len(build.documents),
        )
        retriever = CachedRetriever(BM25Retriever.build(build.documents))
        source = {"corpus": "the datasets' own paragraphs (tracerl corpus)"}
    inner = retriever.inner if isinstance(retriever, CachedRetriever) else retriever
    manifest = getattr(inner, "manifest", None)
    url = isinstance(inner, HTTPRetriever)
    if manifest is None and isinstance(inner, HTTPRetriever):
        manifest = _server_manifest(inner)
    documents = getattr(inner, "documents", None)
    meta = {
        **source,
        "kind": type(inner).__name__,
        "index_id": retriever.index_id,
        "manifest": _manifest_json(manifest, built_now=config.index is None and not url),
        "n_documents": len(documents) if documents is not None else _n_documents(manifest),
        "top_k": config.env_settings().top_k,
        # `tracerl corpus` ids: the pooled paragraphs shipped with the questions themselves
        "distractor_pool": documents is not None
        and all(_PARAGRAPH_ID.fullmatch(d.doc_id) for d in documents),
    }
    return retriever, meta


_PARAGRAPH_ID = re.compile(r"p-[0-9a-f]{16}")


def _manifest_json(manifest: IndexManifest | None, *, built_now: bool) -> dict[str, Any] | None:
    """The manifest for the report.

    An index built in memory by this run drops its build time: it says nothing about the
    index and would make a resumed run's report differ.
    """
    if manifest is None:
        return None
    record = manifest.to_json()
    if built_now:
        record.pop("created_at", None)
    return record


def _server_manifest(retriever: HTTPRetriever) -> IndexManifest | None:
    """The manifest a trace-rl server shows on `/health` (a Search-R1 server has none)."""
    try:
        health = retriever.health()
        return IndexManifest.from_json(health.get("manifest"), source="/health")
    except (RetrievalError, AttributeError, TypeError, ValueError):
        return None


def _n_documents(manifest: IndexManifest | None) -> int | None:
    return manifest.n_documents if manifest is not None else None


def _recall_tasks(tasks: TaskSet, retriever: Retriever) -> TaskSet:
    """Tasks with the corpus ids of their supporting paragraphs, where the index holds them."""
    tasks = attach_doc_ids(tasks)
    inner = retriever.inner if isinstance(retriever, CachedRetriever) else retriever
    documents = getattr(inner, "documents", None)
    if documents is None:
        log.info("retrieval recall assumes the server's corpus uses `tracerl corpus` ids")
        return tasks
    indexed = {d.doc_id for d in documents}
    wanted = {d for t in tasks for d in t.supporting_doc_ids}
    if wanted and not wanted & indexed:
        log.warning(
            "the index holds none of the supporting paragraphs' ids, so retrieval recall "
            "cannot be measured (build the index with `tracerl corpus` for it)"
        )
        return TaskSet(replace(t, supporting_doc_ids=()) for t in tasks)
    return tasks


def _sampling(args: AgentArgs, seed: int) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=seed,
        logprobs=False,
    )


def _use_chat_template(args: AgentArgs, protocol: str, tokenizer: Any) -> bool:
    """`--chat-template` if given, else Search-R1's rule under its protocol.

    Search-R1 wraps the prompt whenever the tokenizer has a chat template.
    """
    if args.chat_template is not None:
        return args.chat_template
    return protocol == "search-r1" and bool(getattr(tokenizer, "chat_template", None))


def _chat_wrapper(args: AgentArgs, protocol: str) -> Callable[[str], str] | None:
    """openai: the chat-template wrapper of `--tokenizer`, if the prompt is to be wrapped."""
    if args.tokenizer is None:
        if args.chat_template:
            raise BenchmarkError("--agent openai --chat-template needs --tokenizer DIR")
        if protocol == "search-r1" and args.api == "completions":
            log.warning(
                "--protocol search-r1: the prompt is sent without the model's chat template "
                "(Search-R1 applies it when the tokenizer has one); pass --tokenizer DIR"
            )
        return None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer), local_files_only=True)
    except (OSError, ValueError) as err:
        raise BenchmarkError(f"--tokenizer {args.tokenizer}: cannot load a tokenizer") from err
    if not _use_chat_template(args, protocol, tokenizer):
        return None

    def wrap(prompt: str) -> str:
        return str(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
        )

    return wrap


def make_agent(
    kind: AgentKind,
    args: AgentArgs,
    data: LoadedData,
    *,
    seed: int = 0,
    protocol: BenchProtocol = "trace-rl",
    tools: Sequence[Tool] = (SearchTool(),),
) -> Agent:
    """Build one agent of `kind` from the command-line settings.

    Raises:
        BenchmarkError: a model agent without `--model`, or a local one under `--protocol
            tools` or `react` (both need `--agent openai`).
        BackendUnavailable: vLLM is not installed (`vllm`).
    """
    if kind == "naive":
        return ScriptedAgent("naive", NaiveAgent, {"policy": "envs.NaiveAgent"})
    if kind == "oracle":
        world = data.world
        if world is not None:
            return ScriptedAgent(
                "oracle",
                lambda: OracleAgent(world, epsilon=args.epsilon, seed=seed),
                {"policy": "envs.OracleAgent", "epsilon": args.epsilon, "seed": seed},
            )
        plans = oracle_plans(data.dataset)
        return ScriptedAgent(
            "oracle",
            lambda: DecompositionOracle(plans),
            {"policy": "benchmarks.DecompositionOracle (decomposition, else supporting titles)"},
        )
    if args.model is None:
        raise BenchmarkError(f"--agent {kind} needs --model")
    name = f"{kind}:{Path(args.model).name or args.model}"
    sampling = _sampling(args, seed)
    if kind != "openai" and protocol in ("tools", "react"):
        raise BenchmarkError(
            f"--protocol {protocol} talks to an OpenAI-compatible endpoint: use --agent openai "
            f"(serve a local model with `vllm serve MODEL`), not --agent {kind}"
        )
    if kind == "openai":
        from harness.evaluation.tool_agents import ReActAgent, ToolCallAgent
        from harness.policies.openai_compat import EndpointConfig, OpenAICompatClient

        try:
            endpoint = EndpointConfig(
                base_url=args.base_url,
                model=args.model,
                api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
                timeout_s=args.timeout_s,
                max_retries=args.max_retries,
                max_concurrency=args.concurrency,
                extensions=args.extensions,
                max_reply_bytes=args.max_reply_bytes,
            )
        except ValueError as err:
            raise BenchmarkError(as_flags(str(err))) from None
        if protocol == "tools":
            return ToolCallAgent(name, OpenAICompatClient(endpoint), sampling, tools=tools)
        if protocol == "react":
            client = OpenAICompatClient(endpoint)
            return ReActAgent(name, client, sampling, api=args.api, tools=tools)
        return HTTPAgent(
            name,
            OpenAICompatClient(endpoint),
            sampling,
            api=args.api,
            prompt_wrapper=_chat_wrapper(args, protocol),
        )
    if not Path(args.model).is_dir():
        raise BenchmarkError(
            f"--model {args.model}: no such model folder; --agent {kind} loads a local folder "
            "(for a model behind a server, use --agent openai --model NAME --base-url URL)"
        )
    settings = {"backend": kind, "model": args.model}
    if kind == "transformers":
        from harness.policies.transformers_backend import TransformersBackend

        local = TransformersBackend(
            args.model, device=args.device, batch_size=args.concurrency, seed=seed
        )
        backend: PolicyBackend = local
        tokenizer = local.tokenizer
    else:
        from transformers import AutoTokenizer

        from harness.policies.vllm_backend import VLLMBackend

        backend = VLLMBackend(args.model, max_model_len=args.max_context_tokens, seed=seed)
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    return PolicyAgent(
        name,
        backend,
        tokenizer,
        sampling,
        chat_template=_use_chat_template(args, protocol, tokenizer),
        max_context_tokens=args.max_context_tokens,
        settings=settings,
    )


def _meta(
    config: BenchConfig,
    argv: list[str],
    data: LoadedData,
    retriever: dict[str, Any],
    env: SearchQAConfig,
) -> dict[str, Any]:
    config_json = {k: v for k, v in _config_json(config).items() if k not in VOLATILE}
    command = [a for a in argv if a != "--resume"]  # a resumed run reports the run's command
    return {
        "command": shlex.join(["tracerl", "bench", *command]),
        "trace_rl_version": importlib.metadata.version("trace-rl"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "dataset": data.dataset.to_json(),
        "retriever": retriever,
        "env": {
            "max_turns": env.max_turns,
            "top_k": env.top_k,
            "reward": env.reward,
            "max_doc_chars": None if env.protocol == "search-r1" else env.max_doc_chars,
            "protocol": env.protocol,
            "agent_protocol": config.agent_protocol,
            "tools": list(env.tools),  # the --tool specs (search is always there)
            "prompt_sha256": env.prompt_sha256,
        },
        "seed": config.seed,
        "config": config_json,
    }


def _print_summary(reports: list[Report], meta: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.width = max(console.width, 132)  # a pipe reports 80 columns; keep rows whole
    for title, groups in (
        ("overall", [(r.agent, "all", r.overall) for r in reports]),
        ("per dataset", [(r.agent, k, m) for r in reports for k, m in r.by_dataset.items()]),
        ("per question type", [(r.agent, k, m) for r in reports for k, m in r.by_type.items()]),
        ("per hop count", [(r.agent, k, m) for r in reports for k, m in r.by_hops.items()]),
    ):
        table = Table(title=f"tracerl bench: {title}")
        table.add_column("agent")
        table.add_column("group")
        for header, _, _ in COLUMNS:
            table.add_column(header, justify="right")
        for agent, group, m in groups:
            table.add_row(agent, group, *metric_cells(m))
        console.print(table)
    line, warning = retrieval_setting(meta.get("retriever", {}))
    print(line)
    print(ACC_NOTE)
    for name, why in meta.get("skipped", {}).items():
        print(f"{name}: {why['n']} questions skipped: {why['reason']}")
    if warning:
        print(warning)


def _planless(data: LoadedData) -> set[str]:
    """Task ids the real-data oracle has no plan for (no decomposition, no supporting titles)."""
    if data.world is not None:
        return set()
    return {task_id for task_id, plan in oracle_plans(data.dataset).items() if not plan.queries}


def _mark_unknown_recall(reports: list[Report], retriever: Retriever) -> bool:
    """For a server, recall is unknown when no search of the run returned a supporting id.

    A local index is checked before the run (`_recall_tasks`); a server's ids can only be seen
    in its answers. Zero overlap over a whole run means its ids are not the corpus ids (a
    wiki-18 server), so recall reads as unknown ("–"), not 0.

    Returns:
        True if recall was marked unknown (the records' supporting ids are dropped).
    """
    inner = retriever.inner if isinstance(retriever, CachedRetriever) else retriever
    if getattr(inner, "documents", None) is not None:
        return False
    episodes = [e for r in reports for e in r.episodes]
    supporting = {d for e in episodes for d in e.supporting_doc_ids}
    if not supporting or supporting & {d for e in episodes for d in e.retrieved_doc_ids}:
        return False
    for i, report in enumerate(reports):
        reports[i] = replace(
            report, episodes=tuple(replace(e, supporting_doc_ids=()) for e in report.episodes)
        )
    log.warning(
        "no search returned a supporting paragraph's id: the server's ids are not `tracerl "
        "corpus` ids, so retrieval recall is unknown (shown as –)"
    )
    return True


def _stable_config(config: BenchConfig) -> dict[str, Any]:
    """The settings that fix a run's results (what `--resume` must agree with)."""
    return {k: v for k, v in _config_json(config).items() if k not in VOLATILE}


def _config_json(config: BenchConfig) -> dict[str, Any]:
    record = {
        k: (str(v) if isinstance(v, Path) else list(map(str, v)) if isinstance(v, tuple) else v)
        for k, v in asdict(config).items()
        if k != "api_key"
    }
    return dict(json.loads(json.dumps(record)))  # as `run.json` reads back (tuples as lists)


def _episodes_report(
    agent: Agent, episodes: Sequence[EpisodeRecord], tasks: TaskSet, config: BenchConfig
) -> Report:
    """An agent's report from its records, in task order (fresh and resumed runs agree)."""
    position = {task_id: i for i, task_id in enumerate(tasks.ids)}
    return Report(
        agent=agent.name,
        episodes=tuple(sorted(episodes, key=lambda r: position[r.task_id])),
        meta={"agent": agent.settings(), "seed": config.seed, "batch_size": config.concurrency},
    )


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    """What one `run_bench` call did; the files are written either way."""

    reports: tuple[Report, ...]
    """One per agent, in `--agent` order (a stopped run's hold the episodes it finished)."""
    meta: dict[str, Any]
    """The report's metadata: command, versions, dataset, retriever, env, seed, config."""
    paths: dict[str, Path]
    """The files written: json, markdown, trajectories, plot."""
    failure: str | None
    """Why the run stopped part-way (`--resume` finishes it); None when it finished."""
    loop_s: float
    """Seconds spent in the episode loop (`evaluate`), over every agent."""

    @property
    def finished(self) -> bool:
        """Whether every episode was played."""
        return self.failure is None


@dataclass(frozen=True, slots=True)
class _Setup:
    """A bench run's parts, checked before any episode runs."""

    state: RunState
    data: LoadedData
    retriever: Retriever
    tasks: TaskSet
    env_config: SearchQAConfig
    meta: dict[str, Any]
    agents: list[Agent]
    planless: set[str]

    def env(self) -> SearchQAEnv:
        return self.env_config.make_env(self.tasks, self.retriever)


def run_bench(
    config: BenchConfig,
    *,
    command: Sequence[str] | None = None,
    on_episode: Callable[[str, EpisodeRecord], None] | None = None,
) -> BenchResult:
    """Evaluate `config`'s agents on its questions and write the report into `config.out`.

    What `tracerl bench` runs, from Python. Bad input fails before any episode; a run that
    stops part-way (a retriever or endpoint that fails, an interrupt) writes a partial report
    and returns its reason in `failure`, and the same config with `resume=True` finishes it.

    Args:
        config: Questions, retriever, env, agents, seed, output folder.
        command: The `tracerl bench` arguments to record in the report; unset: the flags that
            give `config`.
        on_episode: Called with the agent's name and each finished episode, after it is on disk.

    Raises:
        BenchmarkError, RetrievalError, EnvError, HarnessError: bad input (nothing is run);
            `EndpointError`/`EndpointRejected` when a model endpoint is unreachable or does not
            serve the model.
    """
    command = _flags(config) if command is None else list(command)
    config = _with_prompt_file(config)
    config, policy_record = with_policy_protocol(config)
    setup = _set_up(config, command)
    if policy_record is not None:
        setup.meta["policy_protocol"] = policy_record
    for agent in setup.agents:
        check = getattr(agent, "check_endpoint", None)
        if check is not None:
            check()
    reports, skipped, failure, loop_s = _play(config, setup, on_episode)
    meta = setup.meta
    if failure is not None:
        n_done = sum(len(r.episodes) for r in reports)
        n_total = sum(len(setup.tasks) - skipped.get(a.name, 0) for a in setup.agents)
        failure = f"stopped after {n_done} of {n_total} episodes: {failure}"
        meta["partial"] = {"n_done": n_done, "n_total": n_total, "error": failure}
    recall_unknown = _mark_unknown_recall(reports, setup.retriever)
    meta["retriever"]["recall"] = "unknown" if recall_unknown else "measured"
    meta["skipped"] = {
        name: {"n": n, "reason": "no plan (no decomposition, no supporting paragraphs)"}
        for name, n in skipped.items()
    }
    paths = write_reports(reports, config.out, meta=meta)
    return BenchResult(
        reports=tuple(reports), meta=meta, paths=paths, failure=failure, loop_s=loop_s
    )


_MAX_TEMPLATE_BYTES = 1 << 20  # a prompt template is a few hundred bytes


def _with_prompt_file(config: BenchConfig) -> BenchConfig:
    """`config` with `--prompt-template-file`'s text as its prompt template.

    Raises:
        BenchmarkError: both prompt flags, or an unreadable file (named).
    """
    path = config.prompt_template_file
    if path is None:
        return config
    if config.prompt_template is not None:
        raise BenchmarkError("pass --prompt-template or --prompt-template-file, not both")
    from retrieval.corpus import check_regular_file
    from retrieval.errors import IndexFormatError

    try:  # a FIFO would block the read until a writer came: forever, for a typo
        check_regular_file(path, what="--prompt-template-file", max_bytes=_MAX_TEMPLATE_BYTES)
    except IndexFormatError as err:
        raise BenchmarkError(str(err)) from None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise BenchmarkError(f"--prompt-template-file {path}: cannot read it ({err})") from None
    if "{question}" not in text:
        raise BenchmarkError(f"--prompt-template-file {path}: holds no literal {{question}}")
    return replace(config, prompt_template=text)


def _policy_protocol(config: BenchConfig) -> tuple[Path, PolicyProtocol] | None:
    """The protocol the local model folder carries (`policy_protocol.json`), if any.

    Raises:
        BenchmarkError: the file is there but unreadable.
    """
    local = {"transformers", "vllm"} & set(config.agent)
    if not local or config.model is None or not Path(config.model).is_dir():
        return None
    try:
        protocol = read_policy_protocol(config.model)
    except PolicyProtocolError as err:
        raise BenchmarkError(f"--model: {err}") from None
    return None if protocol is None else (Path(config.model), protocol)


def with_policy_protocol(config: BenchConfig) -> tuple[BenchConfig, dict[str, Any] | None]:
    """`config` with every env setting it leaves unset taken from the policy's protocol.

    A flag that is set overrides that one field. Returns the config and, for a policy that
    carries a protocol, the record the report keeps: the file, the overrides, and the
    differences between the policy's protocol and the one played (logged: each override, then
    one warning listing every difference).

    Raises:
        BenchmarkError: the policy's protocol file is unreadable.
    """
    found = _policy_protocol(config)
    if found is None:
        return config, None
    folder, policy = found
    given = {name: getattr(config, name) for name in ENV_FIELDS}
    overrides = [f"--{k.replace('_', '-')} {v!r}" for k, v in given.items() if v is not None]
    filled = {k: getattr(policy, k) if v is None else v for k, v in given.items()}
    world = config.world
    synthetic = not config.data_file and set(config.dataset) <= {"synthetic"}
    if synthetic and policy.world is not None:
        default = WorldConfig()
        changed = {
            f.name: getattr(world, f.name)
            for f in fields(WorldConfig)
            if getattr(world, f.name) != getattr(default, f.name)
        }
        overrides += [f"--world.{k.replace('_', '-')} {v!r}" for k, v in changed.items()]
        world = replace(policy.world, **changed)
    resolved = replace(config, **filled, world=world)
    played: dict[str, Any] = {**filled, "world": world if synthetic else None}  # None: not compared
    differences = policy.differences(played)
    log.info("playing the protocol of %s (%s)", folder, PROTOCOL_FILE_NOTE)
    for flag in overrides:
        log.info("override: %s", flag)
    if differences:
        log.warning(
            "%s is played under a protocol that differs from its own: %s",
            folder,
            "; ".join(differences),
        )
    record = {"source": str(folder), "overrides": overrides, "differences": differences}
    return resolved, record


PROTOCOL_FILE_NOTE = "its policy_protocol.json; a flag overrides one field"


def _set_up(config: BenchConfig, command: list[str]) -> _Setup:
    """Load, index and build everything a run needs, checking the input on the way."""
    state = RunState(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        config=_stable_config(config),
    )
    if config.resume:
        previous = RunState.read(config.out)
        previous.check_same(state.config, config.out)
        state = previous
    else:
        check_fresh_out(config.out, overwrite=config.overwrite)
    data = load_data(config)
    retriever, retriever_meta = _retriever(config, data)
    tasks = _recall_tasks(data.dataset.tasks, retriever)
    probe = config.env_settings().make_env(tasks, retriever)  # builds and checks the tools
    env_config = probe.config
    meta = _meta(config, command, data, retriever_meta, env_config)
    meta["created_at"] = state.created_at
    agents = [
        make_agent(
            kind,
            config,
            data,
            seed=config.seed,
            protocol=config.agent_protocol,
            tools=probe.tools,
        )
        for kind in dict.fromkeys(config.agent)
    ]
    planless = _planless(data) if "oracle" in config.agent else set()
    if planless and len(planless) == len(tasks):
        raise BenchmarkError(
            "--agent oracle: no question has a plan (no decomposition and no supporting "
            "paragraphs, as in Bamboogle or NQ), so it could only copy the gold answer; "
            "drop it for these datasets"
        )
    return _Setup(state, data, retriever, tasks, env_config, meta, agents, planless)


def _play(
    config: BenchConfig,
    setup: _Setup,
    on_episode: Callable[[str, EpisodeRecord], None] | None,
) -> tuple[list[Report], dict[str, int], str | None, float]:
    """Every agent's episodes, streamed to disk: (reports, skipped, failure, loop seconds)."""
    finished = read_finished(config.out / "trajectories.jsonl") if config.resume else {}
    setup.state.write(config.out)
    stream = EpisodeStream(config.out / "trajectories.jsonl", append=config.resume)
    reports: list[Report] = []
    skipped: dict[str, int] = {}
    failure: str | None = None
    loop_s = 0.0
    try:
        for agent in setup.agents:
            agent_tasks = setup.tasks
            if agent.name == "oracle" and setup.planless:
                agent_tasks = TaskSet(t for t in setup.tasks if t.task_id not in setup.planless)
                skipped[agent.name] = len(setup.planless)
                log.warning(
                    "oracle: %d questions have no plan (no decomposition, no supporting "
                    "paragraphs); it is not evaluated on them",
                    len(setup.planless),
                )
            done = dict(finished.get(agent.name, {}))
            todo = [t for t in agent_tasks if t.task_id not in done]
            if done:
                log.info("%s: %d of %d already done", agent.name, len(done), len(agent_tasks))

            def keep(record: EpisodeRecord, name: str = agent.name, done: dict = done) -> None:
                done[record.task_id] = record
                stream.write(name, record)
                if on_episode is not None:
                    on_episode(name, record)

            start = time.perf_counter()
            try:
                if todo:
                    evaluate(
                        agent,
                        setup.env,
                        todo,
                        batch_size=config.concurrency,
                        seed=config.seed,
                        progress=config.progress,
                        on_episode=keep,
                    )
            finally:
                loop_s += time.perf_counter() - start
                if done:
                    records = list(done.values())
                    reports.append(_episodes_report(agent, records, agent_tasks, config))
            if len(done) < len(agent_tasks):  # pragma: no cover - evaluate plays every task
                raise RuntimeError(f"{agent.name}: {len(agent_tasks) - len(done)} tasks not played")
    except (RetrievalError, EnvError, HarnessError, ConnectionError, KeyboardInterrupt) as err:
        failure = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    finally:
        stream.close()
    return reports, skipped, failure, loop_s


def _flags(config: BenchConfig) -> list[str]:
    """The `tracerl bench` flags that give `config`: those that differ from the defaults."""
    default = BenchConfig()
    flags: list[str] = []
    for f in fields(config):
        value = getattr(config, f.name)
        if f.name in ("resume", "api_key") or value == getattr(default, f.name):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, WorldConfig):
            for sub in fields(WorldConfig):
                sub_value = getattr(value, sub.name)
                if sub_value != getattr(default.world, sub.name):
                    flags += [f"--world.{sub.name.replace('_', '-')}", str(sub_value)]
        elif isinstance(value, bool):
            flags.append(flag if value else f"--no-{f.name.replace('_', '-')}")
        elif f.name == "tool":  # a repeated flag, one value each
            flags += [part for spec in value for part in (flag, spec)]
        elif isinstance(value, tuple):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


def bench(argv: list[str]) -> int:
    """`tracerl bench`: evaluate agents and write the report.

    Returns 0 on success, 2 on bad input (nothing run), 1 when the run stopped part-way (a
    partial report is written; `--resume` finishes it). `tracerl bench compare RUN ...`
    compares finished runs instead (`harness.evaluation.compare`).
    """
    if argv[:1] == ["compare"]:
        from harness.evaluation.compare import bench_compare

        return bench_compare(argv[1:])
    config = tyro.cli(BenchConfig, args=flag_pairs(argv, ("chat_template",)), prog="tracerl bench")
    try:
        result = run_bench(config, command=argv)
    except (EndpointError, EndpointRejected) as err:  # the endpoint check, before any episode
        print(f"tracerl bench: {as_flags(str(err))}", file=sys.stderr)
        return 2
    except (BenchmarkError, RetrievalError, EnvError, HarnessError) as err:
        log.error("%s", err)
        return 2
    if result.failure is not None:
        print(
            f"tracerl bench: {as_flags(result.failure)}. Partial report in {config.out}; run "
            "the same command with --resume to finish it",
            file=sys.stderr,
        )
        if config.json:
            _print_json(result, config.out)
        return 1
    paths = result.paths
    _print_summary(list(result.reports), result.meta)
    print(f"wrote {paths['json']}, {paths['markdown']}, {paths['trajectories']}, {paths['plot']}")
    if config.json:
        _print_json(result, config.out)
    return 0


_FLAG_OF_FIELD = {
    "timeout_s": "--timeout-s",
    "max_retries": "--max-retries",
    "max_concurrency": "--concurrency",
    "max_reply_bytes": "--max-reply-bytes",
    "base_url": "--base-url",
}
"""`EndpointConfig` fields whose errors reach a `tracerl bench` user, and their flags."""


def as_flags(message: str) -> str:
    """`message` with the endpoint's Python field names spelled as `tracerl bench` flags.

    >>> as_flags("raise the timeout (timeout_s) or the retries (max_retries)")
    'raise the timeout (--timeout-s) or the retries (--max-retries)'
    """
    pattern = r"(?<![\w-])(" + "|".join(_FLAG_OF_FIELD) + r")\b"
    return re.sub(pattern, lambda m: _FLAG_OF_FIELD[m.group(1)], message)


def flag_pairs(argv: Sequence[str], names: Sequence[str]) -> list[str]:
    """`argv` with `--NAME` / `--no-NAME` spelled as tyro reads an unset-able boolean.

    A `bool | None` field (unset: decided later) takes a value in tyro (`--chat-template True`);
    the documented spelling is the flag pair, so a bare `--chat-template` (followed by another
    flag or nothing) becomes `--chat-template True` and `--no-chat-template` becomes
    `--chat-template False`. An explicit value is left as it is.
    """
    flags = {"--" + n.replace("_", "-") for n in names}
    out: list[str] = []
    for i, arg in enumerate(argv):
        following = argv[i + 1] if i + 1 < len(argv) else None
        if arg in flags and (following is None or following.startswith("--")):
            out += [arg, "True"]
        elif arg.startswith("--no-") and "--" + arg[5:] in flags:
            out += ["--" + arg[5:], "False"]
        else:
            out.append(arg)
    return out


def _print_json(result: BenchResult, out: Path) -> None:
    """`--json`'s last line: the overall figures per agent (`partial` on a stopped run)."""
    payload: dict[str, Any] = {
        "out": str(out),
        "overall": {r.agent: r.overall.to_json() for r in result.reports},
    }
    if result.failure is not None:
        payload["partial"] = result.meta["partial"]
    print(json.dumps(payload, sort_keys=True), flush=True)
