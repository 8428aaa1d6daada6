from __future__ import annotations

from envs import NaiveAgent, OracleAgent, SearchQAEnv, run_agent, run_episode


def _em(results) -> float:
    return sum(r.em for r in results) / len(results)


def test_oracle_beats_naive_by_a_wide_margin(small_world, small_env):
    ids = small_world.tasks.ids
    oracle = run_agent(small_env, OracleAgent(small_world), ids)
    naive = run_agent(small_env, NaiveAgent(), ids)
    assert _em(oracle) >= 0.95
    assert _em(naive) <= 0.15
    assert _em(oracle) - _em(naive) >= 0.8
    # the oracle reads: it searches once per hop at least
    for result, task in zip(oracle, small_world.tasks, strict=True):
        assert result.n_tool_calls >= len(small_world.decomposition(task.task_id).steps)


def test_oracle_sees_every_supporting_doc(small_world, small_env):
    for task in small_world.tasks:
        run_episode(small_env, OracleAgent(small_world), task.task_id)
        shown = set(
            small_env.snapshot().turns and [h.doc_id for t in small_env.history for h in t.hits]
        )
        assert set(task.supporting_doc_ids) <= shown, task.task_id


def test_noise_lowers_em_and_adds_wrong_queries(small_world, small_env):
    ids = small_world.tasks.ids
    clean = run_agent(small_env, OracleAgent(small_world), ids)
    noisy = run_agent(small_env, OracleAgent(small_world, epsilon=0.3, seed=1), ids)
    assert 0.4 < _em(noisy) < _em(clean)
    assert sum(r.n_tool_calls for r in noisy) > sum(r.n_tool_calls for r in clean)
    again = run_agent(small_env, OracleAgent(small_world, epsilon=0.3, seed=1), list(reversed(ids)))
    assert [r.actions for r in noisy] == [r.actions for r in reversed(again)]  # order-independent


def test_oracle_answers_before_the_turn_limit(small_world, small_retriever):
    env = SearchQAEnv(small_world.tasks, small_retriever, max_turns=3)
    results = run_agent(env, OracleAgent(small_world, epsilon=0.5), small_world.tasks.ids)
    assert all(r.answered for r in results)
