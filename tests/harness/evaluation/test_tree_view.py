"""`tracerl tree show`: text rendering, pictures, the three file layouts, clear errors."""

from __future__ import annotations

import json

import pytest

from benchmarks.cli import main as tracerl
from harness.evaluation.tree_view import load_trees, render_text, tree
from trace_alloc import Prompt, Rollout, RolloutTree, Turn


def small_tree(pid: str = "q1") -> RolloutTree:
    t = RolloutTree.from_prompt(Prompt(prompt_id=pid, text="Which river is longer?"))
    search = Turn(
        action_text="<search>nile</search>",
        action_token_ids=(1, 2, 3),
        observation_text="<information>Doc 1</information>",
        n_tool_calls=1,
    )
    answer = Turn(action_text="<answer>Nile</answer>", action_token_ids=(4,))
    t.add_rollout(0, Rollout(turns=(search, answer), reward=1.0))
    t.add_rollout(1, Rollout(turns=(answer,), reward=0.0))
    t.add_rollout(0, Rollout(turns=(answer,), reward=0.0))
    return t


def test_text_shows_every_node_with_values_and_rewards():
    text = render_text(small_tree())
    lines = text.splitlines()
    assert lines[0].startswith('q1 "Which river is longer?"  V̂=0.33  leaves=3  mixed')
    assert "tool calls=1" in lines[0]
    assert len(lines) == 1 + 4  # root + four turn nodes
    assert (
        "[1] <search>nile</search><information>Doc 1</information>  V̂=0.50  leaves=2  mixed" in text
    )
    assert "r=1" in text and text.count("r=0") == 2


@pytest.mark.parametrize("layout", ["object", "list", "jsonl"])
def test_the_command_reads_every_layout_and_saves_a_picture(tmp_path, capsys, layout):
    trees = [small_tree("a"), small_tree("b")]
    path = tmp_path / "trees.json"
    if layout == "object":
        path.write_text(trees[0].to_json())
    elif layout == "list":
        path.write_text(json.dumps([t.to_dict() for t in trees]))
    else:
        path.write_text("\n".join(t.to_json() for t in trees) + "\n")
    assert [t.prompt_id for t in load_trees(path)] == (["a"] if layout == "object" else ["a", "b"])
    picture = tmp_path / "tree.png"
    assert tree(["show", str(path), "--picture", str(picture), "--index", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('a "Which river') and 'b "' not in out
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tracerl_dispatches_to_tree_show(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(small_tree().to_json())
    assert tracerl(["tree", "show", str(path)]) == 0
    assert "q1" in capsys.readouterr().out


def test_bad_files_fail_with_a_clear_message(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(SystemExit, match=r"nope\.json"):
        tree(["show", str(missing)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(small_tree().to_json() + "\n{broken\n")
    with pytest.raises(SystemExit, match=r"bad\.jsonl:2"):
        tree(["show", str(bad)])
    good = tmp_path / "good.json"
    good.write_text(small_tree().to_json())
    with pytest.raises(SystemExit, match="holds 1 tree"):
        tree(["show", str(good), "--index", "3"])
