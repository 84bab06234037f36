"""Fidelity against a full-precision reference, on the default model and a prompt of ~300 tokens, and the exact
cache's reading that a sweep compares with."""

import pytest
import torch

from kvviz.engine import decode, evaluate, fidelity, strategies
from kvviz.files import documents

PASSAGE = (
    "The printing press, developed by Johannes Gutenberg around 1440 in Mainz, combined movable metal type, "
    "oil-based ink and a screw press adapted from wine making. Within fifty years presses operated in more than "
    "two hundred European cities and had produced millions of books. Cheaper books spread literacy beyond the "
    "clergy and the nobility, standardised spelling and grammar, and let scholars compare identical copies of a "
    "text for the first time. Pamphlets carried the arguments of the Reformation across borders faster than any "
    "authority could suppress them, and scientific results could be checked and built upon by readers who never "
    "met the authors. Printers became publishers, booksellers and sometimes censors; governments answered with "
    "licensing laws, and authors slowly gained rights over their work. Newspapers followed in the seventeenth "
    "century, and with them a public that argued about politics in coffee houses and salons. Historians still "
    "debate how much the press caused these changes and how much it only sped them up, but few doubt that the "
    "cheap, identical, portable page changed how knowledge was kept and shared. "
)
PROMPT = PASSAGE + "Summarise the passage above in three sentences."
NEW_TOKENS = 18  # past the quantized caches' residual of 16: they quantize again while decoding


@pytest.fixture(scope="module")
def summaries(default_model):
    runs = {
        "dynamic": ("dynamic", {}),
        "int4": ("quantized", {"backend": "hqq", "nbits": 4, "residual_length": 16}),
        "int2": ("quantized", {"backend": "hqq", "nbits": 2, "residual_length": 16}),
        "sliding": ("sliding", {"window": 64}),
        "sink": ("sink", {"sink_tokens": 4, "window": 60}),
    }
    out = {}
    for label, (name, options) in runs.items():
        settings = decode.GenerationSettings(max_new_tokens=NEW_TOKENS, stop_at_eos=False)
        decoder = decode.Decoder(default_model, strategies.choose(name, options), settings, PROMPT, reference=True)
        assert decoder.prompt_tokens > 200
        list(decoder)
        out[label] = decoder.trace.summary()
        out[label]["steps"] = decoder.trace.steps
    return out


def test_dynamic_is_exact(summaries):
    s = summaries["dynamic"]
    assert s["mean_kl"] == 0.0 and s["top1_agreement"] == 1.0 and s["first_divergence"] is None


def test_fewer_bits_cost_more(summaries):
    assert 0 < summaries["int4"]["mean_kl"] < summaries["int2"]["mean_kl"]
    assert summaries["int2"]["top1_agreement"] <= summaries["int4"]["top1_agreement"] <= 1.0


def test_sinks_beat_a_plain_window_of_the_same_budget(summaries):
    assert summaries["sliding"]["first_divergence"] is not None
    assert summaries["sink"]["mean_kl"] < summaries["sliding"]["mean_kl"]


def test_reference_time_kept_apart(summaries):
    for step in summaries["int4"]["steps"]:
        assert step.reference_ms > 0 and step.kl is not None
    assert summaries["int4"]["reference_perplexity"] > 1


def test_the_exact_cache_s_own_reading_is_the_reference_stream_s(tiny_model):
    """In a sweep the exact cache reads the text once: its evaluation offers what it read to the stream, the same
    forwards in the same chunks, so every later comparison reads the same bits the stream would have read itself."""
    ids, record, _ = evaluate.prepare(tiny_model, documents.builtin("alice"), [strategies.choose("dynamic")], 70)
    exact = evaluate.Evaluation(tiny_model, strategies.choose("dynamic"), ids, record, chunk=16)
    offered = fidelity.ReferenceStream(tiny_model.model, exact.ids, 16)
    exact.reference, exact.offers = offered, True
    list(exact)
    assert offered.fed == 69 and offered.offered and exact.kl == [0.0] * 69 and all(exact.top1)
    own = fidelity.ReferenceStream(tiny_model.model, exact.ids, 16)
    assert torch.equal(offered.logprobs(3, 66), own.logprobs(3, 66))
    assert own.fed == 69  # it reads no further than the last prediction, in the same chunks as the evaluation
