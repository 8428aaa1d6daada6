"""`ChatTemplateCodec` (OpenRLHF's `--data.apply_chat_template`): the prompt becomes the user turn
of the tokenizer's chat template, ready for the assistant; observations stay plain text."""

from __future__ import annotations

from harness.openrlhf.samples import ChatTemplateCodec
from harness.rollout.episodes import EpisodeCodec
from harness.tiny_policy.tokenizer import train_tokenizer

TEMPLATE = (
    "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}<|eos|>{% endfor %}"
    "{% if add_generation_prompt %}<|bos|>assistant: {% endif %}"
)


def test_the_prompt_is_the_user_turn_and_observations_are_unchanged():
    tokenizer = train_tokenizer(
        ["user assistant Who founded Acme? <information>"] * 5, vocab_size=300
    )
    tokenizer.chat_template = TEMPLATE
    chat, plain = ChatTemplateCodec(tokenizer), EpisodeCodec(tokenizer)
    ids = chat.encode_prompt("Who founded Acme?")
    expected = "<|bos|>user: Who founded Acme?<|eos|><|bos|>assistant: "
    assert tokenizer.decode(ids) == expected
    assert ids[0] == tokenizer.bos_token_id and tokenizer.eos_token_id in ids  # one id each
    assert ids != plain.encode_prompt("Who founded Acme?")
    assert chat.encode_text("<information>x") == plain.encode_text("<information>x")
