"""The plots say how many questions each bar rests on, and steps are whole numbers."""

from __future__ import annotations

import json

import matplotlib.figure
import pytest

from harness.evaluation.evaluation import EpisodeRecord, Report
from harness.evaluation.report import plot_reports
from harness.training.metrics_log import plot_run


@pytest.fixture
def figures(monkeypatch):
    saved: list[matplotlib.figure.Figure] = []
    real = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        saved.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return saved


def _episode(task_id: str, question_type: str) -> EpisodeRecord:
    return EpisodeRecord(
        task_id=task_id, dataset="d", question="?", golden_answers=("a",),
        question_type=question_type, n_hops=2, answer="a", em=1.0, sub_em=1.0, f1=1.0,
        end="answer", n_tool_calls=1, n_tokens=0, retrieved_doc_ids=(),
        supporting_doc_ids=(), turns=(),
    )  # fmt: skip


def test_the_report_plot_shows_n_per_bar(tmp_path, figures):
    episodes = (_episode("q1", "bridge"), _episode("q2", "bridge"), _episode("q3", "comparison"))
    plot_reports([Report(agent="x", episodes=episodes)], tmp_path / "report.png")
    left = figures[-1].axes[0]
    labels = {t.get_text() for t in left.texts}
    assert {"n=2", "n=1"} <= labels, labels


def test_the_curves_use_whole_step_ticks(tmp_path, figures):
    records = [{"step": s, "rollout/reward": 0.5 + s / 10} for s in (1, 2)]  # a 2-step run
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    plot_run(tmp_path)
    ax = figures[-1].axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
