"""Conversations: the cache kept across chat turns is exact where the cache is, crops only what changed, and stays
bounded with a bounded strategy (kvviz.engine.conversation), on the tiny model."""

import copy
import dataclasses

import pytest
import torch
from transformers import DynamicCache

from kvviz.engine.conversation import PLAIN_FORMAT, Conversation
from kvviz.engine.decode import GenerationSettings
from kvviz.engine.strategies import parse_spec
from kvviz.errors import OptionError

USER = ["Hello there, who are you?", "Tell me about caches.", "And then what happens?"]
NEW = 12


def chat(loaded, spec: str, new: int = NEW, system: str = "") -> Conversation:
    return Conversation(loaded, parse_spec(spec), GenerationSettings(max_new_tokens=new), system=system)


def say(conversation: Conversation, text: str, reprefill: bool = False):
    turn = conversation.send(text)
    ids = [step.token_id for step in turn]
    if reprefill:
        conversation.reprefill(turn)
    return ids, turn.record


@pytest.fixture(scope="module")
def transformers_replies(tiny_model):
    """transformers' documented iterative generation: one DynamicCache passed to generate with the whole templated
    history at every turn, the reply decoded and added to the history."""
    model, tokenizer = tiny_model.model, tiny_model.tokenizer
    cache, messages, replies = DynamicCache(config=model.config), [], []
    for text in USER:
        messages.append({"role": "user", "content": text})
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)
        n = inputs["input_ids"].shape[1]
        out = model.generate(**inputs, do_sample=False, max_new_tokens=NEW, cache=cache)
        replies.append(out[0, n:].tolist())
        messages.append({"role": "assistant", "content": tokenizer.decode(replies[-1], skip_special_tokens=True)})
    return replies


@pytest.mark.parametrize("spec", ["dynamic", "static:max_cache_len=160"])
def test_kept_cache_equals_transformers_and_a_full_reprefill(tiny_model, transformers_replies, spec):
    conversation = chat(tiny_model, spec)
    replies, records = zip(*(say(conversation, text, reprefill=True) for text in USER), strict=True)
    assert list(replies) == transformers_replies
    for record in records:
        assert record.note is None  # every turn fed only the new tokens: the cache matched the rendered history
        assert record.reprefill_logit_diff < 1e-4
        assert record.reprefill_ms > 0
    assert records[2].kept == records[1].end - 1  # the last reply's last token was never fed
    assert records[2].recomputed == records[2].prompt_end - records[2].kept


def test_regenerate_crops_to_the_users_message_and_edit_to_the_first_changed_token(tiny_model):
    conversation = chat(tiny_model, "dynamic")
    first, _ = say(conversation, USER[0])
    second, asked = say(conversation, USER[1])
    turn = conversation.regenerate()
    again = [step.token_id for step in turn]
    assert again == second  # greedy, from a cache cropped back exactly
    assert (turn.record.kept, turn.record.recomputed) == (asked.prompt_end - 1, 1)
    assert turn.record.kind == "regenerate" and "kept" in turn.record.note

    turn = conversation.edit(0, USER[0] + " Be brief.")
    list(turn)
    assert 0 < turn.record.kept < asked.start  # the cache up to the first changed token of the first message
    assert turn.record.kept + turn.record.recomputed == turn.record.prompt_end
    assert [m.role for m in conversation.messages] == ["user", "assistant"]
    with pytest.raises(OptionError, match="not a user message"):
        conversation.edit(1, "no")


def test_a_template_that_rewrites_earlier_turns_is_cropped_at_the_first_changed_token(tiny_model):
    """A template that drops earlier answers (as thinking templates drop thinking blocks) changes tokens the cache
    holds: the turn crops there and recomputes the rest, and its logits are a full re-prefill's."""
    tokenizer = copy.deepcopy(tiny_model.tokenizer)
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}(earlier answer){% else %}{{ m.content }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    loaded = dataclasses.replace(tiny_model, tokenizer=tokenizer)
    conversation = chat(loaded, "dynamic")
    say(conversation, USER[0])
    say(conversation, USER[1])
    _, record = say(conversation, USER[2], reprefill=True)
    assert "re-encoding the history changed tokens" in record.note
    assert record.kept < conversation.trace.turns[1].end - 1  # less than the cache held: cropped inside a reply
    assert record.reprefill_logit_diff < 1e-4


@pytest.mark.parametrize("spec", ["sink:sink_tokens=4:window=28", "h2o:budget=32"])
def test_bounded_strategies_keep_the_cache_flat_across_many_turns(tiny_model, spec):
    conversation = chat(tiny_model, spec, new=6)
    budget_bytes = 32 * conversation.run.geometry.kv_bytes_per_token
    for i in range(5):
        say(conversation, f"Message number {i}, with a few more words about what a cache keeps and drops.")
    turns = conversation.trace.turns
    assert turns[-1].end > 5 * 32  # the chat is far longer than the cache
    late = [step.cache_bytes for step in conversation.trace.steps if step.turn >= 3]
    assert max(late) <= budget_bytes and min(late) >= 0.99 * budget_bytes
    assert all(turn.tokens_held <= 32 for turn in turns)
    assert all(0 < turn.evicted <= turn.recomputed + turn.new_tokens for turn in turns[1:])
    assert "evicting" in turns[-1].note


def test_a_new_chat_starts_from_a_copy_of_the_cached_prefix(tiny_model):
    conversation = chat(tiny_model, "dynamic", system="You answer in one line.")
    first, _ = say(conversation, USER[0])
    conversation.new_chat()
    prefix = conversation.trace.prefix
    assert prefix.tokens > 0 and prefix.cache_bytes > 0
    again, record = say(conversation, USER[0])
    assert again == first  # the same first turn, from the copied prefix
    assert record.kept == prefix.tokens and record.chat == 1
    assert record.prefix_copy_bytes == prefix.cache_bytes  # the copy is as large again as the kept prefix


def test_a_turn_past_the_context_is_refused_by_an_unbounded_cache_and_goes_on_with_sink(short_context_model):
    from kvviz.engine import models

    loaded = models.load_model(str(short_context_model))
    conversation = chat(loaded, "dynamic", new=8)
    say(conversation, USER[0])
    with pytest.raises(OptionError, match="tokens left.*new chat.*sink"):
        conversation.send(USER[1] + " " + "word " * 240)
    assert [m.role for m in conversation.messages] == ["user", "assistant"]  # the refused message is not kept

    bounded = chat(loaded, "sink:sink_tokens=4:window=60", new=8)
    for text in USER:
        say(bounded, text + " " + "word " * 90)
    assert bounded.trace.turns[-1].end > 256


def test_empty_messages_and_compile_are_refused(tiny_model):
    conversation = chat(tiny_model, "dynamic")
    with pytest.raises(OptionError, match="empty"):
        conversation.send("  \n")
    with pytest.raises(OptionError, match="regenerate"):
        conversation.regenerate()
    with pytest.raises(OptionError, match="torch.compile"):
        chat(tiny_model, "static:compile=true")


def test_a_tokenizer_without_a_chat_template_gets_plain_lines(tiny_model):
    tokenizer = copy.deepcopy(tiny_model.tokenizer)
    tokenizer.chat_template = None
    conversation = chat(dataclasses.replace(tiny_model, tokenizer=tokenizer), "dynamic", new=4)
    say(conversation, USER[0])
    _, record = say(conversation, USER[1], reprefill=True)
    assert conversation.trace.template == PLAIN_FORMAT
    assert tokenizer.decode(torch.tensor(conversation.cached[: record.start])).startswith("User: " + USER[0])
