"""Reliability: bad bodies, a hung server, hostile servers and clients, property-test counts.

Four measurements, each against the real code paths:

- **bad bodies**: `tracerl serve-retriever` (a subprocess over a small BM25 index) is sent a
  fixed corpus of bad `POST /retrieve` bodies (`BAD_BODIES`: malformed and deeply nested JSON,
  wrong types, lone surrogates, oversized bodies and queries, ...). Every answer must be a 4xx
  and the server must answer a good request afterwards.
- **hung server**: a socket that listens but never accepts (connections succeed, no answer
  ever comes) stands in for a hung server. A `SearchQAEnv` on an `HTTPRetriever` with its
  default retry budget (4 attempts x 30 s) and the env's default `retrieval_deadline_s`
  (10 s) takes `--n-steps` searches; each raises `RetrievalFailedError`. Reported: the worst
  and median wall time per step, against the 120 s retry budget that bounded a step before.
- **properties**: the suite's property tests (local/HTTP parity, snapshot fuzzing, server
  fuzzing, the fork law) run under a Hypothesis profile (`--profile`, default `ci`, as CI
  runs them) with `--hypothesis-show-statistics`; reported per test: passing cases and the
  outcome events the tests record (e.g. restored vs refused snapshots, HTTP statuses).

- **attacks** (issue 25; `benchmarks.perf.attacks` says how each is made): steps against
  servers that trickle headers, body or a chunked body; a turn of 64 episodes on a hung server
  through the engine's batched prefetch; an endless body; 1,100 idle sockets against a server
  under `ulimit -n 1024`; a 500 MB header; every bad command line of every `tracerl`
  subcommand; `--n-snapshots` randomly mutated snapshots. The last line's top-level keys
  (`worst_step_s_trickle`, `worst_turn_s_hung_64_episodes`, `peak_rss_mb_endless_body`,
  `idle_connections_refused_cleanly`, `header_500mb_status`, `cli_bad_inputs_with_traceback`,
  `snapshot_mutations_untyped_errors`, ...) are the issue's figures.

- **integrity and starvation** (issue 32; `--integrity`, on by default): a compressed and a
  BM25 index opened with each file missing, short, or an extra one; 20 `kill -9` at random
  moments of `tracerl index compress --overwrite`; files truncated, overwritten or replaced
  under a process searching the index (each in a child process, so a SIGBUS shows); 64
  clients that never read their answers, then SIGTERM with them connected; 3 clients looping
  maximal requests beside normal clients; 600 reconnecting slowloris sockets beside normal
  clients; forged bit-generator states restored and drawn from; one 128 KB action parsed.
  Keys: `missing_or_short_file_opens`, `kill_during_overwrite_mixed_dirs`,
  `kill_during_overwrite_wrong_answers`, `truncate_after_open_crashes`,
  `unread_clients_rss_growth_mb`, `sigterm_exit_s`, `p50_ms_normal_under_heavy` (with
  `p50_ms_normal_alone`), `normal_success_under_slowloris`, `forged_rng_state_crashes`,
  `parser_s_128kb`.

- **races and lies** (issue 42; `--races`, on by default; `benchmarks.perf.races` says how each is
  made): builds racing into one `--out` (at once, and one launched while the other saves; CLI
  and API), degenerate generator states restored and drawn from in children with a timeout,
  `tracerl index verify` over directories it must refuse, and BM25 indexes with flipped bits
  served (read and `--mmap`). Keys: `concurrent_build_broken_indexes`, `forged_rng_hangs`,
  `verify_false_passes`, `damaged_bm25_500s` (each with its count of cases).

Run: `python -m benchmarks.perf.reliability --json` (`--quick`: one hung step, no properties,
500 snapshot mutations and no other attack; `--only-integrity`: the issue-32 group alone;
`--only-races`: the issue-42 group alone).
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import tyro

from benchmarks.meta import run_meta
from benchmarks.perf import attacks, races
from benchmarks.perf.retrieval_server import start_server
from envs import QATask, RetrievalFailedError, SearchQAEnv, TaskSet
from retrieval import BM25Retriever, Document, HTTPRetriever

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Args:
    """Reliability benchmark options."""

    n_steps: int = 5
    """searches against the hung server"""
    profile: str = "ci"
    """the Hypothesis profile of the property run (tests/conftest.py: ci, thorough)"""
    properties: bool = True
    """run the property tests and count their cases"""
    attacks: bool = True
    """run the hostile servers and clients (its run time: benchmarks/RESULTS.md, "Hostile servers
    and clients")"""
    n_snapshots: int = 20_000
    """mutated snapshots to restore"""
    integrity: bool = True
    """run the index-file and starvation attacks (issue 32; its run time: benchmarks/RESULTS.md,
    "Index files that cannot lie, a server one client cannot starve")"""
    only_integrity: bool = False
    """run only those (no bad bodies, hung server, other attacks or properties)"""
    n_kills: int = 20
    """kill -9 during `tracerl index compress --overwrite`"""
    races: bool = True
    """run the racing builds, forged generator states, lying manifests and damaged BM25 indexes
    (issue 42)"""
    only_races: bool = False
    """run only those"""
    quick: bool = False
    """a smoke test: one hung step, no property run, 500 snapshots, no other attack"""
    json: bool = False
    """print one JSON object as the last line of stdout"""

    def __post_init__(self) -> None:
        if self.quick:
            self.n_steps, self.properties = 1, False
            self.attacks, self.n_snapshots, self.integrity = False, 500, False
            self.races = False


def _docs() -> list[Document]:
    return [
        Document(doc_id=f"d{i}", title=f"City {i}", text=f"City {i} is a capital of land {i}.")
        for i in range(200)
    ]


def _body(payload: Any) -> bytes:
    return json.dumps(payload).encode()


BAD_BODIES: dict[str, bytes] = {
    "empty body": b"",
    "not JSON": b"queries=a",
    "truncated JSON": b'{"queries": ["a"',
    "not UTF-8": b'{"queries": ["\xff\xfe"]}',
    "JSON array": _body(["a"]),
    "JSON string": _body("a"),
    "no queries": _body({"topk": 3}),
    "queries is a string": _body({"queries": "a"}),
    "queries is empty": _body({"queries": []}),
    "a blank query": _body({"queries": ["a", "  "]}),
    "a number query": _body({"queries": [3]}),
    "a null query": _body({"queries": [None]}),
    "a list query": _body({"queries": [["a"]]}),
    "a lone surrogate": b'{"queries": ["\\ud800"]}',
    "a 5,000-character query": _body({"queries": ["x" * 5_000]}),
    "513 queries": _body({"queries": ["a"] * 513}),
    "topk a string": _body({"queries": ["a"], "topk": "3"}),
    "topk a float": _body({"queries": ["a"], "topk": 2.5}),
    "topk a boolean": _body({"queries": ["a"], "topk": True}),
    "topk 0": _body({"queries": ["a"], "topk": 0}),
    "topk 101": _body({"queries": ["a"], "topk": 101}),
    "topk NaN": b'{"queries": ["a"], "topk": NaN}',
    "topk of 5,000 digits": b'{"queries": ["a"], "topk": ' + b"1" * 5_000 + b"}",
    "return_scores a string": _body({"queries": ["a"], "return_scores": "yes"}),
    "500 nested arrays": b"[" * 500 + b"]" * 500,
    "2 KB of '['": b"[" * 2_048,
    "100,000 nested arrays": b"[" * 100_000 + b"]" * 100_000,
    "deep nesting inside queries": b'{"queries": ' + b"[" * 5_000 + b"]" * 5_000 + b"}",
    "a 2 MB body": _body({"queries": ["x" * 1_000] * 2_000}),
    # GEM's dialect: msgpack, told apart by a first byte that opens a msgpack map
    "msgpack map, then garbage": b"\x81\xc1\xc1",
    "msgpack map nested 5,000 deep": b"\x81\xa1q" * 5_000 + b"\xc0",
    "msgpack query a number": b"\x81\xa5query\x05",
}
"""A fixed corpus of bad `POST /retrieve` bodies (each must get a 4xx)."""


def bad_bodies(url: str) -> dict[str, Any]:
    """Send every body of `BAD_BODIES`, then a good request; return the statuses."""
    statuses: dict[str, int] = {}
    with httpx.Client(base_url=url, timeout=60) as http:
        for name, body in BAD_BODIES.items():
            response = http.post(
                "/retrieve", content=body, headers={"content-type": "application/json"}
            )
            statuses[name] = response.status_code
        good = http.post("/retrieve", json={"queries": ["capital"], "topk": 2}).status_code
    return {
        "statuses": statuses,
        "n_bodies": len(statuses),
        "n_4xx": sum(400 <= s < 500 for s in statuses.values()),
        "all_4xx": all(400 <= s < 500 for s in statuses.values()),
        "good_request_after": good,
    }


def hung_server(n_steps: int) -> dict[str, Any]:
    """Time env steps whose searches go to a server that never answers."""
    tasks = TaskSet([QATask(task_id="q", question="Who?", golden_answers=("x",))])
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(1024)  # the kernel completes handshakes; nobody ever reads
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        remote = HTTPRetriever(url, index_id="hung")  # the defaults: 4 attempts x 30 s
        env = SearchQAEnv(tasks, remote)  # the default retrieval_deadline_s
        env.reset(seed=0)
        times, causes = [], set()
        for i in range(n_steps):
            start = time.perf_counter()
            try:
                env.step(f"<search> query {i} </search>")
            except RetrievalFailedError as err:
                causes.add(type(err.__cause__).__name__)
            else:
                raise RuntimeError("a step against a hung server succeeded")
            times.append(time.perf_counter() - start)
        remote.close()
    return {
        "n_steps": n_steps,
        "deadline_s": env.config.retrieval_deadline_s,
        "retry_budget_s": 4 * 30.0,
        "worst_step_s": max(times),
        "median_step_s": statistics.median(times),
        "causes": sorted(causes),
    }


PROPERTY_TESTS = (
    "tests/retrieval/test_local_http_parity.py::"
    "test_local_and_http_give_identical_observations_on_any_query",
    "tests/envs/test_snapshot_validation.py::"
    "test_a_mutated_snapshot_restores_to_an_identical_replay_or_is_refused",
    "tests/retrieval/test_server_hardening.py::test_any_json_body_gets_a_2xx_or_a_4xx",
    "tests/envs/test_fork_law.py",
    "tests/envs/test_snapshots_cannot_hang.py::"
    "test_any_forged_state_is_refused_naming_a_field_or_draws",
)


def properties(profile: str) -> dict[str, Any]:
    """Run the property tests under a Hypothesis profile and read their statistics."""
    env = {**os.environ, "HYPOTHESIS_PROFILE": profile}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*cmd, "--hypothesis-show-statistics", *PROPERTY_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the property tests failed:\n{done.stdout[-3000:]}")
    return {"profile": profile, "tests": parse_statistics(done.stdout)}


def parse_statistics(text: str) -> dict[str, Any]:
    """Per test: passing cases and outcome events, from `--hypothesis-show-statistics`."""
    tests: dict[str, Any] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        header = re.match(r"^(tests/\S+::\S+):$", line)
        if header:
            current = tests.setdefault(header.group(1).split("::")[-1], {"events": {}})
            continue
        if current is None:
            continue
        cases = re.search(r"(\d+) passing, (\d+) failing", line)
        if cases:
            current["passing"] = current.get("passing", 0) + int(cases.group(1))
            current["failing"] = current.get("failing", 0) + int(cases.group(2))
        event = re.match(r"^\s+\* ([\d.]+)%, (.+)$", line)
        # Hypothesis's own notes on its data generation ("Retried draw ...") are not outcomes
        if event and not event.group(2).startswith(("Retried", "Draw", "Aborted")):
            current["events"][event.group(2)] = float(event.group(1))
    return tests


def run_attacks(args: Args, index_dir: Path) -> dict[str, Any]:
    """The issue-25 attacks; `figures` holds the headline keys of the last line."""
    out: dict[str, Any] = {
        "snapshots": attacks.snapshot_mutations(args.n_snapshots),
    }
    figures: dict[str, Any] = {
        "snapshot_mutations_untyped_errors": out["snapshots"]["outcomes"].get("untyped", 0),
        "snapshot_mutations_total": args.n_snapshots,
    }
    print(f"snapshots: {out['snapshots']['outcomes']}", file=sys.stderr)
    if not args.attacks:
        return {**out, "figures": figures}
    steps: list[tuple[str, Any]] = [
        ("trickle", attacks.trickle_steps),
        ("hung_turn", attacks.hung_turn),
        ("endless_body", attacks.endless_body),
        ("server", lambda: attacks.server_attacks(index_dir)),
        ("cli", attacks.cli_bad_inputs),
    ]
    out |= _run_steps(steps)
    figures |= {
        "worst_step_s_trickle": out["trickle"]["worst_step_s"],
        "deadline_s": out["trickle"]["deadline_s"],
        "worst_turn_s_hung_64_episodes": out["hung_turn"]["turn_s"],
        "peak_rss_mb_endless_body": out["endless_body"]["growth_mb"],
        "idle_connections_refused_cleanly": out["server"]["idle_connections_refused_cleanly"],
        "header_500mb_status": out["server"]["header_500mb_status"],
        "header_500mb_server_growth_mb": out["server"]["header_500mb_server_growth_mb"],
        "cli_bad_inputs_with_traceback": len(out["cli"]["with_traceback"]),
        "cli_bad_inputs_total": out["cli"]["n_cases"],
    }
    return {**out, "figures": figures}


def _run_steps(steps: list[tuple[str, Any]]) -> dict[str, Any]:
    """Run each named attack in order; each result is echoed to stderr as it lands."""
    out: dict[str, Any] = {}
    for name, run in steps:
        out[name] = run()
        print(f"{name}: {json.dumps(out[name])[:400]}", file=sys.stderr)
    return out


def integrity(args: Args, work: Path, bm25_dir: Path) -> dict[str, Any]:
    """The issue-32 attacks; `figures` holds the headline keys of the last line."""
    steps: list[tuple[str, Any]] = [
        ("index_files", lambda: attacks.index_file_opens(work / "opens", bm25_dir)),
        ("kills", lambda: attacks.kill_during_overwrite(work / "kills", args.n_kills)),
        ("changed", lambda: attacks.files_changed_after_open(work / "changed")),
        ("starvation", lambda: attacks.starvation(work / "starve")),
        ("forged_rng", attacks.forged_rng_states),
    ]
    out: dict[str, Any] = {}
    for sub in ("opens", "kills", "changed", "starve"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    out |= _run_steps(steps)
    starve = out["starvation"]
    figures = {
        "missing_or_short_file_opens": len(out["index_files"]["opened"]),
        "index_file_cases": out["index_files"]["n_cases"],
        "kill_during_overwrite_mixed_dirs": out["kills"]["mixed_dirs"],
        "kill_during_overwrite_wrong_answers": out["kills"]["wrong_answers"],
        "kill_during_overwrite_n": out["kills"]["n_kills"],
        "truncate_after_open_crashes": out["changed"]["crashes"],
        "changed_files_silent_wrong_answers": out["changed"]["silent_wrong_answers"],
        "unread_clients_rss_growth_mb": starve["unread"]["peak_growth_mb"],
        "sigterm_exit_s": starve["sigterm_exit_s"],
        "p50_ms_normal_alone": starve["heavy"]["p50_ms_alone"],
        "p50_ms_normal_under_heavy": starve["heavy"]["p50_ms_beside_heavy"],
        "normal_success_under_slowloris": starve["slowloris"]["share_ok"],
        "forged_rng_state_crashes": out["forged_rng"]["crashes"],
        "parser_s_128kb": attacks.parser_seconds(),
    }
    return {**out, "figures": figures}


def races_and_lies(work: Path, bm25_dir: Path) -> dict[str, Any]:
    """The issue-42 attacks; `figures` holds the headline keys of the last line."""
    steps: list[tuple[str, Any]] = [
        ("forged_rng", races.forged_rng_hangs),
        ("verify", lambda: races.verify_false_passes(work / "verify", bm25_dir)),
        ("damaged_bm25", lambda: races.damaged_bm25_statuses(work / "damaged")),
        ("builds", lambda: races.concurrent_builds(work / "builds")),
    ]
    out = _run_steps(steps)
    figures = {
        "concurrent_build_broken_indexes": out["builds"]["broken"],
        "concurrent_build_trials": out["builds"]["n_trials"],
        "forged_rng_hangs": out["forged_rng"]["hangs"],
        "forged_rng_states": out["forged_rng"]["n_states"],
        "verify_false_passes": len(out["verify"]["false_passes"]),
        "verify_cases": out["verify"]["n_cases"],
        "damaged_bm25_500s": out["damaged_bm25"]["n_5xx"],
        "damaged_bm25_answers": sum(out["damaged_bm25"]["statuses"].values()),
    }
    return {**out, "figures": figures}


def main(args: Args) -> dict[str, Any]:
    """Run the measurements."""
    if args.only_races:
        with tempfile.TemporaryDirectory() as tmp:
            bm25_dir = Path(tmp) / "bm25"
            BM25Retriever.build(_docs()).save(bm25_dir)
            found = races_and_lies(Path(tmp), bm25_dir)
        return {
            **found.pop("figures"),
            "races": found,
            "args": {k: str(v) for k, v in asdict(args).items()},
            "meta": run_meta(),
        }
    if args.only_integrity:
        with tempfile.TemporaryDirectory() as tmp:
            bm25_dir = Path(tmp) / "bm25"
            BM25Retriever.build(_docs()).save(bm25_dir)
            found = integrity(args, Path(tmp), bm25_dir)
        return {
            **found.pop("figures"),
            "integrity": found,
            "args": {k: str(v) for k, v in asdict(args).items()},
            "meta": run_meta(),
        }
    with tempfile.TemporaryDirectory() as tmp:
        index_dir = Path(tmp) / "bm25"
        BM25Retriever.build(_docs()).save(index_dir)
        proc, url = start_server(index_dir)
        try:
            bodies = bad_bodies(url)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        print(f"bad bodies: {bodies['n_4xx']}/{bodies['n_bodies']} got a 4xx", file=sys.stderr)
        hung = hung_server(args.n_steps)
        print(f"hung server: worst step {hung['worst_step_s']:.2f} s", file=sys.stderr)
        attack_results = run_attacks(args, index_dir)
        if args.integrity:
            found = integrity(args, Path(tmp), index_dir)
            attack_results["figures"] |= found.pop("figures")
            attack_results["integrity"] = found
        if args.races:
            found = races_and_lies(Path(tmp) / "races", index_dir)
            attack_results["figures"] |= found.pop("figures")
            attack_results["races"] = found
    props = properties(args.profile) if args.properties else None
    return {
        **attack_results.pop("figures"),
        "attacks": attack_results,
        "bad_bodies": bodies,
        "hung_server": hung,
        "properties": props,
        "args": {k: str(v) for k, v in asdict(args).items()},
        "meta": run_meta(),
    }


def print_table(result: dict[str, Any]) -> None:
    """The figures, human-readable, on stderr."""
    if "bad_bodies" not in result:  # --only-integrity or --only-races: its figures only
        for key in sorted(k for k, v in result.items() if not isinstance(v, dict)):
            print(f"{key}: {result[key]}", file=sys.stderr)
        return
    for name, status in result["bad_bodies"]["statuses"].items():
        print(f"{status}  {name}", file=sys.stderr)
    hung = result["hung_server"]
    print(
        f"hung server: {hung['n_steps']} steps, worst {hung['worst_step_s']:.2f} s, median "
        f"{hung['median_step_s']:.2f} s (deadline {hung['deadline_s']} s; retry budget "
        f"{hung['retry_budget_s']:.0f} s)",
        file=sys.stderr,
    )
    if result["properties"]:
        for name, stats in result["properties"]["tests"].items():
            print(f"{stats.get('passing', 0):>6} cases  {name}  {stats['events']}", file=sys.stderr)


if __name__ == "__main__":
    args = tyro.cli(Args)
    result = main(args)
    print_table(result)
    if args.json:
        print(json.dumps(result, sort_keys=True), flush=True)
