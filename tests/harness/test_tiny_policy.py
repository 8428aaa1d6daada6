"""Tiny policy pieces: tokenizer, model directory, demonstrations, warm start, episode runner."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from envs import World, WorldConfig
from harness.evaluation import PolicyEval, evaluate_backend
from harness.policies import Completion, SamplingParams, TransformersBackend
from harness.rollout.episodes import EpisodeCodec, run_episodes, start_episodes
from harness.tiny_policy import ModelConfig, SFTConfig, tiny_env_config
from harness.tiny_policy.demos import collect_demos, encode_demo
from harness.tiny_policy.model import build_model, count_parameters, save_policy
from harness.tiny_policy.sft import Checkpoint, select_checkpoint, train_sft
from harness.tiny_policy.tokenizer import BOS, EOS, PAD, TAGS, train_tokenizer
from retrieval.bm25 import BM25Retriever

SMALL_WORLD = WorldConfig(
    n_countries=3,
    n_cities=8,
    n_people=60,
    n_films=8,
    n_books=6,
    n_companies=4,
    n_universities=3,
    n_distractors=5,
    sentences_per_doc=2,
    questions_per_kind=3,
)
SETTINGS = tiny_env_config()
TINY = ModelConfig(hidden_size=64, n_layers=2, head_dim=32, n_kv_heads=1, intermediate_size=128)


@pytest.fixture(scope="module")
def world():
    return World.generate(0, SMALL_WORLD)


@pytest.fixture(scope="module")
def retriever(world):
    return BM25Retriever.build(world.documents)


@pytest.fixture(scope="module")
def demos(world, retriever):
    return collect_demos(world, list(world.tasks), SETTINGS, epsilon=0.5, retriever=retriever)


@pytest.fixture(scope="module")
def tokenizer(demos):
    return train_tokenizer([d.text for d in demos], vocab_size=600)


@pytest.fixture(scope="module")
def codec(tokenizer):
    return EpisodeCodec(tokenizer)


class ReplayBackend:
    """A fake policy that replays recorded actions: prefix tokens -> the next action's tokens."""

    def __init__(self, script: dict[tuple[int, ...], tuple[int, ...]], tokenizer) -> None:
        self.script, self.tokenizer = script, tokenizer

    def generate(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        out = []
        for prefix in prefixes:
            ids = self.script[tuple(prefix)]
            text = self.tokenizer.decode(ids)
            out.append(
                Completion(
                    token_ids=ids, text=text, logprobs=(-0.5,) * len(ids), finish_reason="stop"
                )
            )
        return out


def replay_script(demos, codec) -> dict[tuple[int, ...], tuple[int, ...]]:
    script = {}
    for demo in demos:
        enc = encode_demo(demo, codec)
        i = 0
        while i < len(enc.token_ids):
            if enc.action_mask[i]:
                j = i
                while j < len(enc.token_ids) and enc.action_mask[j]:
                    j += 1
                script[enc.token_ids[:i]] = enc.token_ids[i:j]
                i = j
            else:
                i += 1
    return script


# -- tokenizer -----------------------------------------------------------------------------


def test_tags_and_specials_are_single_ids(tokenizer):
    for token in (*TAGS, BOS, EOS, PAD):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
        assert tokenizer.decode(ids) == token
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (BOS, EOS, PAD)
    assert (
        len({tokenizer.convert_tokens_to_ids(t) for t in (*TAGS, BOS, EOS, PAD)}) == len(TAGS) + 3
    )


def test_tokenizer_round_trips_text_with_tags_and_unseen_names(tokenizer, demos):
    unseen = "<search> Zyxqöw Brakthel born </search>\n<information>Doc 1(Title: Ü) 1904 …"
    for text in (demos[0].text, demos[-1].text, unseen):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    # The tags are not "special": clients that skip special tokens still see them.
    ids = tokenizer.encode("<answer> Ann </answer>" + EOS, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<answer> Ann </answer>"


def test_tokenizer_directory_loads_with_auto_tokenizer(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "Question: Who?\n<search> Ann born </search>"
    assert loaded.encode(text, add_special_tokens=False) == tokenizer.encode(
        text, add_special_tokens=False
    )
    assert loaded.pad_token_id == tokenizer.pad_token_id


def test_tiny_vocab_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=100)


# -- model ---------------------------------------------------------------------------------


def test_policy_directory_loads_with_auto_model(tmp_path, tokenizer):
    model = build_model(TINY, tokenizer)
    assert count_parameters(model) < 200_000
    save_policy(model, tokenizer, tmp_path / "policy")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    assert loaded.config.model_type == "qwen3"
    for (name, a), (_, b) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    out = TransformersBackend(tmp_path / "policy").generate(
        [[tokenizer.bos_token_id]], SamplingParams(max_new_tokens=3, seed=0)
    )
    assert out[0].n_tokens >= 1


def test_model_init_is_seeded(tokenizer):
    a, b = build_model(TINY, tokenizer), build_model(TINY, tokenizer)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_model_config_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of head_dim"):
        ModelConfig(hidden_size=100, head_dim=32)


# -- demonstrations ------------------------------------------------------------------------


def test_demo_text_is_exactly_what_the_env_emits(world, retriever, demos):
    env = SETTINGS.make_env(list(world.tasks), retriever)
    for demo in demos[:10]:
        prompt, _ = env.reset(options={"task_id": demo.task_id})
        assert demo.pieces[0].text == prompt
        for action, observation in zip(demo.pieces[1::2], demo.pieces[2::2], strict=False):
            obs, *_ = env.step(action.text)
            assert observation.text == obs


@pytest.mark.parametrize("lm_weight", [0.0, 0.1])
def test_observation_and_prompt_tokens_carry_only_the_lm_weight(demos, codec, lm_weight):
    for demo in demos:
        enc = encode_demo(demo, codec, lm_weight=lm_weight)
        assert len(enc.token_ids) == len(enc.weights) == len(enc.action_mask)
        for weight, is_action in zip(enc.weights, enc.action_mask, strict=True):
            if not is_action:
                assert weight == lm_weight
            else:
                assert weight in (0.0, 1.0)
    enc = encode_demo(demos[0], codec, lm_weight=0.0)
    assert sum(w for w, a in zip(enc.weights, enc.action_mask, strict=True) if not a) == 0.0


def test_wrong_queries_and_wrong_answers_are_masked(world, retriever, codec):
    noisy = collect_demos(world, list(world.tasks), SETTINGS, epsilon=1.0, retriever=retriever)
    n_masked = 0
    for demo in noisy:
        plan = world.decomposition(demo.task_id)
        good = {s.query for s in plan.steps} | {s.subject for s in plan.steps}
        for piece in demo.pieces:
            if piece.role != "action":
                continue
            query = piece.text.removeprefix("<search> ").removesuffix(" </search>")
            if piece.text.startswith("<search>"):
                assert piece.learn == (query in good), piece.text
            else:
                assert piece.learn == bool(demo.em)
            n_masked += not piece.learn
        enc = encode_demo(demo, codec)
        learned = [t for t, w in zip(enc.token_ids, enc.weights, strict=True) if w == 1.0]
        masked = [
            t
            for t, w, a in zip(enc.token_ids, enc.weights, enc.action_mask, strict=True)
            if a and w == 0
        ]
        assert learned or masked
    assert n_masked > len(noisy)  # with epsilon=1 every demo has mistakes


def test_demo_token_layout_equals_the_episode_runner_layout(
    world, retriever, demos, codec, tokenizer
):
    """Replaying the oracle's action tokens through the runner rebuilds the demos' ids exactly."""
    subset = demos[:12]
    backend = ReplayBackend(replay_script(subset, codec), tokenizer)
    env = SETTINGS.make_env(list(world.tasks), retriever)
    episodes = run_episodes(
        backend, env, [d.task_id for d in subset], codec, sampling=SamplingParams()
    )
    for demo, episode in zip(subset, episodes, strict=True):
        enc = encode_demo(demo, codec)
        assert episode.token_ids == enc.token_ids
        assert episode.action_mask == enc.action_mask
        assert episode.em == demo.em
        assert all(
            lp == -0.5 for lp, a in zip(episode.logprobs, episode.action_mask, strict=True) if a
        )


# -- episode runner ------------------------------------------------------------------------


def test_evaluate_backend_scores_the_replayed_oracle(world, retriever, demos, codec, tokenizer):
    subset = demos[:20]
    backend = ReplayBackend(replay_script(subset, codec), tokenizer)
    report = evaluate_backend(
        backend,
        tokenizer,
        lambda: SETTINGS.make_env(list(world.tasks), retriever),
        [world.tasks[d.task_id] for d in subset],
        name="replay",
        max_context_tokens=4096,
        temperature=0.0,
    )
    result = PolicyEval.of_report(report, temperature=0.0, wall_s=1.0)
    assert result.em == pytest.approx(sum(d.em for d in subset) / len(subset))
    assert result.n_episodes == 20 and sum(result.n_by_kind.values()) == 20
    assert result.answered == 1.0
    assert result.searches_per_episode >= 2


def test_live_episodes_fork_independently(world, retriever, demos, codec, tokenizer):
    backend = ReplayBackend(replay_script(demos[:1], codec), tokenizer)
    env = SETTINGS.make_env(list(world.tasks), retriever)
    [live] = start_episodes(env, [demos[0].task_id], codec)
    a, b = live.fork(2)
    from harness.rollout.episodes import advance

    advance(backend, [a], codec, SamplingParams())
    assert len(a.token_ids) > len(b.token_ids) == len(live.token_ids)
    assert a.turn_starts == [len(live.token_ids)] and b.turn_starts == []
    advance(backend, [b], codec, SamplingParams())
    assert a.token_ids == b.token_ids


def test_an_episode_that_would_overflow_the_context_ends_unanswered(
    world, retriever, codec, tokenizer
):
    model = build_model(TINY, tokenizer).eval()
    env = SETTINGS.make_env(list(world.tasks), retriever)
    episodes = run_episodes(
        TransformersBackend(model, tokenizer),
        env,
        [world.tasks[0].task_id],
        codec,
        sampling=SamplingParams(max_new_tokens=16),
        max_total_tokens=40,
    )
    assert len(episodes[0].token_ids) <= 40 and not episodes[0].answered


# -- warm start ----------------------------------------------------------------------------


def test_sft_lowers_the_masked_loss(demos, codec, tokenizer):
    model = build_model(TINY, tokenizer)
    encoded = [encode_demo(d, codec) for d in demos]
    config = SFTConfig(max_steps=50, batch_size=8, lr=3e-3, warmup_steps=5, eval_from=10**6)
    result = train_sft(model, encoded, config, pad_id=tokenizer.pad_token_id)
    first, last = result.log[0], result.log[-1]
    assert result.n_steps == 50
    assert last["action_loss"] < 0.8 * first["action_loss"]
    assert last["loss"] < first["loss"]
    assert not model.training


def test_sft_keeps_checkpoints_and_stops_once_past_the_band(demos, codec, tokenizer):
    model = build_model(TINY, tokenizer)
    encoded = [encode_demo(d, codec) for d in demos]
    scores = iter([0.1, 0.45, 0.7, 0.9])
    config = SFTConfig(
        max_steps=40, batch_size=4, eval_from=5, eval_every=5, band=(0.3, 0.6), stop_above=0.65
    )
    result = train_sft(
        model, encoded, config, pad_id=tokenizer.pad_token_id, evaluate=lambda m: next(scores)
    )
    assert [c.step for c in result.checkpoints] == [5, 10, 15]
    assert result.stopped_early and result.n_steps == 15
    chosen = select_checkpoint(result.checkpoints, config.band)
    assert chosen.step == 10
    assert not torch.equal(
        chosen.state["model.embed_tokens.weight"], model.state_dict()["model.embed_tokens.weight"]
    )


def test_select_checkpoint_prefers_the_band_middle_and_the_latest_on_ties():
    cps = [
        Checkpoint(step=s, dev_em=e, state={})
        for s, e in [(1, 0.05), (2, 0.3), (3, 0.47), (4, 0.95)]
    ]
    assert select_checkpoint(cps, (0.3, 0.6)).step == 3
    tied = [Checkpoint(step=s, dev_em=0.5, state={}) for s in (1, 2)]
    assert select_checkpoint(tied, (0.3, 0.6)).step == 2
    assert select_checkpoint(cps[:1], (0.3, 0.6)).step == 1  # nothing in the band: the closest
    with pytest.raises(ValueError):
        select_checkpoint([], (0.3, 0.6))


def test_select_checkpoint_keeps_the_best_reader_inside_the_band():
    cps = [
        Checkpoint(step=s, dev_em=e, state={}, reading_em=r)
        for s, e, r in [(1, 0.2, 0.0), (2, 0.45, 0.05), (3, 0.58, 0.3), (4, 0.7, 0.5)]
    ]
    # step 4 reads best but is above the band; step 2 is nearest the middle but barely reads
    assert select_checkpoint(cps, (0.3, 0.6)).step == 3
    assert select_checkpoint(cps[:1], (0.3, 0.6)).step == 1  # none in the band: the closest


def test_sft_scores_reading_at_each_checkpoint(demos, codec, tokenizer):
    model = build_model(TINY, tokenizer)
    encoded = [encode_demo(d, codec) for d in demos]
    config = SFTConfig(max_steps=10, batch_size=4, eval_from=5, eval_every=5)
    result = train_sft(
        model,
        encoded,
        config,
        pad_id=tokenizer.pad_token_id,
        evaluate=lambda m: 0.5,
        evaluate_reading=lambda m: 0.25,
    )
    assert [(c.step, c.reading_em) for c in result.checkpoints] == [(5, 0.25), (10, 0.25)]


def test_sft_config_validates():
    with pytest.raises(ValueError, match="band"):
        SFTConfig(band=(0.7, 0.3))
    with pytest.raises(ValueError, match="stop_above"):
        SFTConfig(band=(0.3, 0.6), stop_above=0.5)


def test_scoring_only_weighted_positions_equals_the_full_loss(tokenizer):
    from harness.tiny_policy.sft import _weighted_loss

    model = build_model(TINY, tokenizer)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tokenizer), (3, 20), generator=g)
    action = torch.rand(3, 20, generator=g) < 0.3
    weights = torch.where(action, 1.0, 0.1)
    weights[0, 10:] = 0.0  # padding
    loss, action_loss = _weighted_loss(
        model, ids, weights, action, SFTConfig(lm_sample_rate=1.0), g
    )
    nll = torch.nn.functional.cross_entropy(
        model(input_ids=ids).logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none"
    )
    w = weights[:, 1:]
    assert loss.item() == pytest.approx(((nll * w).sum() / w.sum()).item(), rel=1e-5)
    learned = (w == 1.0) & action[:, 1:]
    assert action_loss == pytest.approx(nll[learned].mean().item(), rel=1e-5)
    # Sampling the LM positions changes which are scored, never the action tokens' loss.
    _, sampled_action_loss = _weighted_loss(
        model, ids, weights, action, SFTConfig(lm_sample_rate=0.25), g
    )
    assert sampled_action_loss == pytest.approx(action_loss, rel=1e-5)
