"""The plots say how many questions each bar rests on, and steps are whole numbers."""

from __future__ import annotations

import itertools
import json
import random
import warnings

import matplotlib.figure
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.transforms import Bbox

from envs.synthetic.questions import QUESTION_KINDS
from harness.evaluation.report import plot_reports
from harness.rollout.evaluation import EpisodeRecord, Report
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


def _episode(
    task_id: str, question_type: str, em: float = 1.0, searches: int = 1, dataset: str = "d"
) -> EpisodeRecord:
    return EpisodeRecord(
        task_id=task_id, dataset=dataset, question="?", golden_answers=("a",),
        question_type=question_type, n_hops=2, answer="a", em=em, sub_em=em, f1=em,
        end="answer", n_tool_calls=searches, n_tokens=0, retrieved_doc_ids=(),
        supporting_doc_ids=(), turns=(),
    )  # fmt: skip


def _reports(agents: list[str], kinds: list[str], per_kind: int) -> list[Report]:
    rng = random.Random(0)
    return [
        Report(
            agent=agent,
            episodes=tuple(
                _episode(
                    f"q{i}",
                    kinds[i % len(kinds)],
                    float(rng.random() < 0.5),
                    rng.randint(0, 4),
                    dataset="synthetic",
                )
                for i in range(per_kind * len(kinds))
            ),
        )
        for agent in agents
    ]


def _overlap(a: Bbox, b: Bbox) -> bool:
    """Boxes that share area (touching edges do not count)."""
    return a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5 and b.y0 < a.y1 - 0.5


DEMO = [f"{policy} ({test_set})" for policy in ("warm start", "after TRACE")
        for test_set in ("unseen", "fact_disjoint", "decoy")]  # fmt: skip


@pytest.mark.parametrize(
    ("agents", "kinds"),
    [
        (["oracle", "naive"], ["bridge"]),  # `tracerl bench`'s default run
        (["oracle", "naive", "openai:Qwen3-8B"], ["bridge", "comparison", "compose"]),
        (DEMO, list(QUESTION_KINDS)),  # `tracerl demo`: six reports, eighteen kinds
    ],
)
def test_the_report_picture_is_laid_out_without_overlap(tmp_path, figures, agents, kinds):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied ... collapsed" included
        plot_reports(_reports(agents, kinds, per_kind=11), tmp_path / "report.png")
    fig = figures[-1]
    canvas = FigureCanvasAgg(fig)  # the saved figure is closed: draw it again, as saved
    canvas.draw()
    renderer = canvas.get_renderer()
    width, height = fig.get_size_inches()
    assert width <= 20 and height <= 12, (width, height)  # readable at its default size
    plots = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(plots) == 2
    areas = [ax.get_window_extent(renderer) for ax in fig.axes]
    for ax, area in zip(fig.axes, areas, strict=True):  # no collapsed axes (the colour bar: thin)
        assert area.width > (5 if ax not in plots else 150) and area.height > 150, area
    for a, b in itertools.combinations(areas, 2):
        assert not _overlap(a, b)
    legends = [ax.get_legend() for ax in plots if ax.get_legend() is not None]
    assert legends, "the agents must be named"
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert all(not _overlap(box, area) for area in areas), "a legend covers data"
    heatmap = plots[0]
    cells = [t.get_window_extent(renderer) for t in heatmap.texts]
    assert len(cells) == len(agents) * len(kinds)
    assert not any(_overlap(a, b) for a, b in itertools.combinations(cells, 2))
    for axis in (heatmap.xaxis, heatmap.yaxis):
        labels = [t.get_window_extent(renderer) for t in axis.get_ticklabels() if t.get_text()]
        assert not any(_overlap(a, b) for a, b in itertools.combinations(labels, 2))


def test_the_report_plot_shows_n_per_bar(tmp_path, figures):
    episodes = (_episode("q1", "bridge"), _episode("q2", "bridge"), _episode("q3", "comparison"))
    plot_reports([Report(agent="x", episodes=episodes)], tmp_path / "report.png")
    left = figures[-1].axes[0]
    labels = {t.get_text().split()[-1] for t in left.texts}
    assert {"n=2", "n=1"} <= labels, labels


def test_the_curves_use_whole_step_ticks(tmp_path, figures):
    records = [{"step": s, "rollout/reward": 0.5 + s / 10} for s in (1, 2)]  # a 2-step run
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    plot_run(tmp_path)
    ax = figures[-1].axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
