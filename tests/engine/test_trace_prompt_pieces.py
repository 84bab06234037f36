"""A trace keeps the text of each prompt token (what the window names cache positions by): the decoder writes
them, files keep them, a file whose pieces do not match its prompt is refused, and older files without them
still open."""

import json

import pytest

from kvviz.engine import decode, strategies
from kvviz.files import trace


@pytest.fixture(scope="module")
def sample(tiny_model):
    settings = decode.GenerationSettings(max_new_tokens=2, stop_at_eos=False, raw=True)
    decoder = decode.Decoder(tiny_model, strategies.choose("dynamic", {}), settings, "The cat sat on the mat.")
    list(decoder)
    return decoder


def test_the_decoder_names_every_prompt_token_and_files_keep_them(tmp_path, sample):
    pieces = sample.trace.prompt_pieces
    assert len(pieces) == sample.prompt_tokens
    assert "".join(pieces).endswith("The cat sat on the mat.")  # the tokens' texts, in order
    assert trace.load(sample.trace.save(tmp_path / "run.json")).prompt_pieces == pieces


def test_pieces_that_do_not_match_the_prompt_are_refused_and_none_is_fine(tmp_path, sample):
    data = json.loads(sample.trace.save(tmp_path / "run.json").read_text())
    data["prompt_pieces"] = data["prompt_pieces"][:-1]
    short = tmp_path / "short.json"
    short.write_text(json.dumps(data))
    with pytest.raises(trace.TraceError, match=r"prompt_pieces.*one text per prompt token"):
        trace.load(short)
    del data["prompt_pieces"]  # written before kvviz kept them
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert trace.load(old).prompt_pieces == []
