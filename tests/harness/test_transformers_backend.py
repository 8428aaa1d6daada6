"""TransformersBackend: stops, batching, log-probs, seeding and finish reasons on tiny models."""

from __future__ import annotations

import pytest
import torch

from harness.policies import Completion, PolicyBackend, SamplingParams, TransformersBackend
from harness.tiny_policy.config import ModelConfig
from harness.tiny_policy.model import build_model
from harness.tiny_policy.tokenizer import train_tokenizer

EPISODE = (
    "Question: where was the director of Sky of Ash born?"
    "<search> Sky of Ash director </search>"
    "<information> Doc 1(Title: Sky of Ash) Sky of Ash is a film by Ann Boharkstad. </information>"
    "<answer> Tedailbeirk </answer>"
)
PROMPT = "Question: where was the director of Sky of Ash born?"


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(
        [EPISODE] * 20 + ["Question: who wrote Canyon of Copper?"] * 5, vocab_size=320
    )


@pytest.fixture(scope="module")
def random_model(tokenizer):
    config = ModelConfig(
        hidden_size=64, n_layers=2, head_dim=32, n_kv_heads=1, intermediate_size=128
    )
    return build_model(config, tokenizer).eval()


@pytest.fixture(scope="module")
def parrot(tokenizer):
    """A tiny model overfitted on one episode, so its greedy continuation is known."""
    config = ModelConfig(
        hidden_size=64, n_layers=2, head_dim=32, n_kv_heads=1, intermediate_size=128
    )
    model = build_model(config, tokenizer)
    ids = torch.tensor(
        [[tokenizer.bos_token_id, *tokenizer.encode(EPISODE), tokenizer.eos_token_id]]
    )
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(150):
        loss = model(input_ids=ids, labels=ids).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    assert loss.item() < 0.05, "the parrot did not memorise its episode"
    return model.eval()


def prompt_ids(tokenizer) -> list[int]:
    return [tokenizer.bos_token_id, *tokenizer.encode(PROMPT)]


def varied_prefixes(tokenizer, n: int = 7) -> list[list[int]]:
    words = [
        "Question:",
        "where",
        "was",
        "the",
        "director",
        "of",
        "Sky",
        "of",
        "Ash",
        "born?",
        "Canyon",
        "of",
        "Copper",
    ]
    return [
        [tokenizer.bos_token_id, *tokenizer.encode(" ".join(words[: 1 + (3 * i) % 12]))]
        for i in range(n)
    ]


GREEDY = SamplingParams(temperature=0, max_new_tokens=40)


def test_backend_meets_the_protocol(parrot, tokenizer):
    assert isinstance(TransformersBackend(parrot, tokenizer), PolicyBackend)


def test_generation_stops_right_after_the_first_stop_tag(parrot, tokenizer):
    backend = TransformersBackend(parrot, tokenizer)
    [out] = backend.generate([prompt_ids(tokenizer)], GREEDY)
    assert out.text == "<search> Sky of Ash director </search>"
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] == tokenizer.convert_tokens_to_ids("</search>")
    assert len(out.logprobs) == len(out.token_ids)


def test_a_stop_string_spanning_several_tokens_cuts_the_text(parrot, tokenizer):
    backend = TransformersBackend(parrot, tokenizer)
    assert len(tokenizer.encode("of Ash")) > 1  # exercises the decoded-tail path
    [out] = backend.generate(
        [prompt_ids(tokenizer)], SamplingParams(temperature=0, stop=("of Ash",))
    )
    assert out.finish_reason == "stop"
    assert out.text == "<search> Sky of Ash"
    assert tokenizer.decode(out.token_ids).startswith(out.text)


def test_continuing_after_an_observation_reaches_the_answer_and_eos(parrot, tokenizer):
    backend = TransformersBackend(parrot, tokenizer)
    upto_obs = EPISODE[: EPISODE.index("<answer>")]
    prefix = [tokenizer.bos_token_id, *tokenizer.encode(upto_obs)]
    [answer] = backend.generate([prefix], GREEDY)
    assert (answer.text, answer.finish_reason) == ("<answer> Tedailbeirk </answer>", "stop")
    [end] = backend.generate([prefix], SamplingParams(temperature=0, stop=()))
    assert end.finish_reason == "eos"
    assert end.token_ids[-1] == tokenizer.eos_token_id  # kept in the ids ...
    assert end.text == "<answer> Tedailbeirk </answer>"  # ... but not shown


def test_max_new_tokens_ends_with_length(random_model, tokenizer):
    backend = TransformersBackend(random_model, tokenizer)
    outs = backend.generate(
        varied_prefixes(tokenizer, 3), SamplingParams(max_new_tokens=5, stop=(), seed=0)
    )
    for out in outs:
        if out.finish_reason != "eos":
            assert (out.finish_reason, out.n_tokens, len(out.logprobs)) == ("length", 5, 5)
    assert any(out.finish_reason == "length" for out in outs)


def test_batched_greedy_equals_one_by_one(random_model, tokenizer):
    prefixes = varied_prefixes(tokenizer)
    sampling = SamplingParams(temperature=0, max_new_tokens=12, stop=("</search>",))
    batched = TransformersBackend(random_model, tokenizer, batch_size=64).generate(
        prefixes, sampling
    )
    single = TransformersBackend(random_model, tokenizer, batch_size=1)
    one_by_one = [single.generate([p], sampling)[0] for p in prefixes]
    assert [c.token_ids for c in batched] == [c.token_ids for c in one_by_one]
    for a, b in zip(batched, one_by_one, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_greedy_matches_hf_generate(random_model, tokenizer):
    prefixes = varied_prefixes(tokenizer, 4)
    ours = TransformersBackend(random_model, tokenizer).generate(
        prefixes, SamplingParams(temperature=0, max_new_tokens=10, stop=())
    )
    for prefix, out in zip(prefixes, ours, strict=True):
        ref = random_model.generate(
            torch.tensor([prefix]),
            max_new_tokens=10,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        assert out.token_ids == tuple(ref[0, len(prefix) :].tolist())


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=1.0, max_new_tokens=10, stop=(), seed=1),
        SamplingParams(temperature=0.7, top_k=20, max_new_tokens=10, stop=(), seed=2),
        SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=10, stop=(), seed=3),
        SamplingParams(temperature=0, max_new_tokens=10, stop=()),
    ],
    ids=["t1", "t0.7-topk", "t1.3-topp", "greedy"],
)
def test_logprobs_match_a_forward_pass_recomputation(random_model, tokenizer, sampling):
    prefixes = varied_prefixes(tokenizer, 5)
    outs = TransformersBackend(random_model, tokenizer).generate(prefixes, sampling)
    for prefix, out in zip(prefixes, outs, strict=True):
        ids = torch.tensor([prefix + list(out.token_ids)])
        with torch.no_grad():
            logits = random_model(input_ids=ids).logits[0, len(prefix) - 1 : -1]  # (n, V)
        expected = reference_logprobs(logits, torch.tensor(out.token_ids), sampling)
        assert list(out.logprobs) == pytest.approx(expected.tolist(), abs=1e-4)


def reference_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, sampling: SamplingParams
) -> torch.Tensor:
    """The sampling distribution written out directly, one row at a time."""
    rows = []
    for row, token in zip(logits, tokens, strict=True):
        if sampling.temperature == 0:
            rows.append(row.log_softmax(-1)[token])
            continue
        scores = row / sampling.temperature
        allowed = torch.ones_like(scores, dtype=torch.bool)
        if sampling.top_k:
            allowed &= scores >= scores.topk(sampling.top_k).values[-1]
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        if sampling.top_p < 1:
            order = probs.argsort(descending=True)
            before = probs[order].cumsum(0) - probs[order]
            allowed[order[before >= sampling.top_p]] = False
        logp = scores.masked_fill(~allowed, float("-inf")).log_softmax(-1)
        assert torch.isfinite(logp[token]), "sampled a token outside the allowed set"
        rows.append(logp[token])
    return torch.stack(rows)


def test_greedy_is_deterministic(random_model, tokenizer):
    backend = TransformersBackend(random_model, tokenizer)
    prefixes = varied_prefixes(tokenizer)
    assert backend.generate(prefixes, GREEDY) == backend.generate(prefixes, GREEDY)


def test_seeded_sampling_is_reproducible_and_the_seed_matters(random_model, tokenizer):
    backend = TransformersBackend(random_model, tokenizer)
    prefixes = varied_prefixes(tokenizer)
    first = backend.generate(prefixes, SamplingParams(max_new_tokens=15, stop=(), seed=7))
    again = TransformersBackend(random_model, tokenizer).generate(
        prefixes, SamplingParams(max_new_tokens=15, stop=(), seed=7)
    )
    other = backend.generate(prefixes, SamplingParams(max_new_tokens=15, stop=(), seed=8))
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert [c.token_ids for c in first] != [c.token_ids for c in other]


def test_a_prefix_sample_does_not_depend_on_the_batch_split(random_model, tokenizer):
    prefixes = varied_prefixes(tokenizer)
    sampling = SamplingParams(max_new_tokens=15, stop=(), seed=11)
    big = TransformersBackend(random_model, tokenizer, batch_size=64).generate(prefixes, sampling)
    small = TransformersBackend(random_model, tokenizer, batch_size=2).generate(prefixes, sampling)
    assert [c.token_ids for c in big] == [c.token_ids for c in small]


def test_identical_prefixes_in_one_call_get_different_samples(random_model, tokenizer):
    prefix = varied_prefixes(tokenizer, 1)[0]
    outs = TransformersBackend(random_model, tokenizer).generate(
        [prefix] * 4, SamplingParams(max_new_tokens=15, stop=(), seed=3)
    )
    assert len({c.token_ids for c in outs}) > 1


def test_unseeded_calls_advance_the_backend_generator(random_model, tokenizer):
    prefixes = varied_prefixes(tokenizer, 3)
    sampling = SamplingParams(max_new_tokens=15, stop=())
    a = TransformersBackend(random_model, tokenizer, seed=5)
    b = TransformersBackend(random_model, tokenizer, seed=5)
    first, second = a.generate(prefixes, sampling), a.generate(prefixes, sampling)
    assert [c.token_ids for c in first] != [c.token_ids for c in second]
    assert b.generate(prefixes, sampling) == first


def test_tiny_top_p_is_greedy(random_model, tokenizer):
    backend = TransformersBackend(random_model, tokenizer)
    prefixes = varied_prefixes(tokenizer)
    nucleus = backend.generate(
        prefixes, SamplingParams(top_p=1e-6, max_new_tokens=10, stop=(), seed=0)
    )
    greedy = backend.generate(prefixes, SamplingParams(temperature=0, max_new_tokens=10, stop=()))
    assert [c.token_ids for c in nucleus] == [c.token_ids for c in greedy]
    assert all(lp == pytest.approx(0.0, abs=1e-5) for c in nucleus for lp in c.logprobs)


def test_loads_any_causal_lm_directory(tmp_path, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            eos_token_id=tokenizer.eos_token_id,
        )
    )
    llama.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    backend = TransformersBackend(tmp_path)
    outs = backend.generate(
        varied_prefixes(tokenizer, 3), SamplingParams(temperature=0, max_new_tokens=6, stop=())
    )
    ref = TransformersBackend(llama.eval(), tokenizer).generate(
        varied_prefixes(tokenizer, 3), SamplingParams(temperature=0, max_new_tokens=6, stop=())
    )
    assert all(isinstance(c, Completion) for c in outs)
    assert [c.token_ids for c in outs] == [c.token_ids for c in ref]


def test_bad_prefixes_raise_clear_errors(random_model, tokenizer):
    backend = TransformersBackend(random_model, tokenizer)
    with pytest.raises(ValueError, match="prefix 1 is empty"):
        backend.generate([[1, 2], []], GREEDY)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        backend.generate([[1, 10**6]], GREEDY)
    assert backend.generate([], GREEDY) == []
    with pytest.raises(ValueError, match="batch_size"):
        TransformersBackend(random_model, tokenizer, batch_size=0)
