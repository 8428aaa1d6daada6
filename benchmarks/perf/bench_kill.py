"""`tracerl bench` killed with SIGKILL at random moments: is every finished episode on disk?

Each trial starts a bench run (scripted agents on the embedded world) in a child process
whose `on_episode` hook prints each episode's id once it is on disk, kills it with SIGKILL at
a random moment (a share of trials aimed at the final report write), and compares the
episodes in `trajectories.jsonl` with those the child reported finished. A trial passes when
every reported episode is on disk, the disk holds at most the one episode written but not
yet reported when the kill came, and `report.json`, if there, parses whole.

    python -m benchmarks.perf.bench_kill --trials 20 --out runs/bench_kill
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

from harness.evaluation import read_finished

CHILD = """
import sys
from pathlib import Path
from harness.evaluation import BenchConfig, run_bench
config = BenchConfig(agent=("naive", "oracle"), out=Path(sys.argv[1]), progress=False,
                     concurrency=4)
print("start", flush=True)
run_bench(config, on_episode=lambda agent, r: print(agent, r.task_id, flush=True))
print("done", flush=True)
"""


@dataclass(frozen=True, kw_only=True)
class Args:
    """The kill test's settings."""

    trials: int = 20
    """Kills."""
    final_share: float = 0.3
    """Share of trials aimed at the final write (after the last episode is reported)."""
    seed: int = 0
    out: Path = Path("runs/bench_kill")
    """Where the summary JSON goes."""


def _run(folder: Path, kill_at: float | None, after_last: bool) -> tuple[set, bool, float]:
    """One child run; kill it `kill_at` s after its start line (or after its last episode)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )
    assert proc.stdout is not None
    reported: set[tuple[str, str]] = set()
    finished = threading.Event()
    started = threading.Event()
    clock = [0.0]

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            words = line.split()
            if words == ["start"]:
                clock[0] = time.perf_counter()
                started.set()
            elif words == ["done"]:
                finished.set()
            elif len(words) == 2:
                reported.add((words[0], words[1]))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started.wait(120)
    if kill_at is not None:
        if after_last:  # wait until the last episode is reported, then kill inside the write
            while len(reported) < _N_EPISODES and proc.poll() is None:
                time.sleep(0.001)
        time.sleep(kill_at)
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join(5)
    return reported, finished.is_set(), time.perf_counter() - clock[0]


_N_EPISODES = 0


def main() -> None:
    """Run the trials and write OUT/summary.json."""
    global _N_EPISODES
    args = tyro.cli(Args)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        reported, done, wall = _run(Path(tmp) / "calibrate", None, False)
        assert done, "the calibration run did not finish"
        _N_EPISODES = len(reported)
        rows = []
        for trial in range(args.trials):
            folder = Path(tmp) / f"trial{trial}"
            final = trial < round(args.trials * args.final_share)
            kill_at = rng.uniform(0, 0.4) if final else rng.uniform(0, wall)
            reported, done, _ = _run(folder, kill_at, final)
            on_disk = {
                (agent, task_id)
                for agent, records in read_finished(folder / "trajectories.jsonl").items()
                for task_id in records
            }
            report_file = folder / "report.json"
            try:  # absent, or whole: never a part
                report_ok = not report_file.exists() or bool(json.loads(report_file.read_text()))
            except ValueError:
                report_ok = False
            # the hook runs after the episode's line is flushed: one may be on disk unreported
            ok = reported <= on_disk and len(on_disk - reported) <= 1 and report_ok
            rows.append(
                {
                    "trial": trial,
                    "aimed_at_final_write": final,
                    "kill_at_s": round(kill_at, 3),
                    "finished_before_kill": len(reported),
                    "on_disk": len(on_disk),
                    "missing": len(reported - on_disk),
                    "run_completed": done,
                    "report_json_whole": report_ok,
                    "final_files_at_kill": sorted(
                        p.name
                        for p in folder.glob("report.*")
                        if p.suffix in (".json", ".md", ".png")
                    ),
                    "ok": ok,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    summary = {
        "n_episodes": _N_EPISODES,
        "calibration_wall_s": round(wall, 2),
        "trials": rows,
        "all_ok": all(r["ok"] for r in rows),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "trials"}))


if __name__ == "__main__":
    main()
