"""Every causal-LM family of the installed transformers, on a tiny random model of each (`every_family.tiny_config`):
kvviz decodes a few steps past a window of 8 tokens with the exact cache, and at every step the prediction from the
config equals the measured cache, or the prediction says unknown (None) for the whole run, never a wrong number.

A family is skipped, with the reason, where transformers builds no model of its tiny config (or of its own default
config), where that model is not tiny, or where kvviz refuses to run it (an encoder, a cache kvviz cannot read): no
prediction is made there. A few minutes: `make test-families` runs it (KVVIZ_TEST_FAMILIES=1), outside `make test`.
"""

from __future__ import annotations

import json
import os

import pytest

from kvviz.engine import decode, strategies
from kvviz.engine.geometry import Geometry
from kvviz.engine.model_files import check_keeps_kv_cache, check_runnable
from kvviz.engine.models import LoadedModel, build_random_model, model_card
from kvviz.errors import ModelError, OptionError
from kvviz.files.trace_schema import MODEL_CARD

from .every_family import FAMILIES, MOST_PARAMETERS, parameters, tiny_config
from .test_equality import generate_reference

if os.environ.get("KVVIZ_TEST_FAMILIES") != "1":
    pytest.skip("every family of transformers takes minutes: run `make test-families` (KVVIZ_TEST_FAMILIES=1)",
                allow_module_level=True)

PROMPT = "The history of the printing press begins in the fifteenth century with"  # 14 tokens: past the window
NEW_TOKENS = 6


def tiny_model_of(family: str, tokenizer) -> LoadedModel:
    try:
        config = tiny_config(family)
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises: no config of it builds
        pytest.skip(f"{family}: no tiny config of it builds ({type(exc).__name__}: {str(exc)[:160]})")
    try:
        check_runnable(config, family)
    except ModelError as exc:
        pytest.skip(f"{family}: kvviz refuses it: {exc}")
    try:
        count = parameters(config)
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises: its config builds no model
        pytest.skip(f"{family}: its tiny config builds no model ({type(exc).__name__}: {str(exc)[:160]})")
    if count > MOST_PARAMETERS:
        pytest.skip(f"{family}: its tiny config still has {count / 1e6:,.0f} M parameters")
    try:
        model = build_random_model(config).eval()
        check_keeps_kv_cache(model, family)
    except ModelError as exc:
        cause = f" ({type(exc.__cause__).__name__}: {str(exc.__cause__)[:120]})" if exc.__cause__ else ""
        pytest.skip(f"{family}: kvviz refuses it: {exc}{cause}")
    return LoadedModel(model=model, tokenizer=tokenizer, card=model_card(model, f"tiny-{family}"), spec=family)


def decoded(loaded: LoadedModel) -> list:
    """The steps of a greedy run through the exact cache; where kvviz cannot run it, the family is skipped if
    transformers' own generate cannot either (its tiny config is not one it runs), else the test fails."""
    settings = decode.GenerationSettings(max_new_tokens=NEW_TOKENS, raw=True, stop_at_eos=False)
    try:
        return list(decode.Decoder(loaded, strategies.choose("dynamic"), settings, PROMPT))
    except OptionError as exc:  # kvviz's own refusal, in words
        pytest.skip(f"{loaded.spec}: kvviz refuses it: {exc}")
    except Exception:
        ids = decode.encode_prompt(loaded.tokenizer, PROMPT, raw=True)
        try:
            generate_reference(loaded, ids, NEW_TOKENS)
        except Exception as exc:  # noqa: BLE001 - whatever the family's own code raises
            pytest.skip(f"{loaded.spec}: transformers' own generate fails on its tiny config too "
                        f"({type(exc).__name__}: {str(exc)[:120]})")
        raise


@pytest.mark.parametrize("family", FAMILIES)
def test_the_prediction_equals_the_measurement_or_says_unknown(tiny_model, family):
    loaded = tiny_model_of(family, tiny_model.tokenizer)
    MODEL_CARD.check(json.loads(json.dumps(loaded.card)), None)  # what kvviz writes of it, a kept file reads
    steps = decoded(loaded)
    predicted = [step.predicted_cache_bytes for step in steps]
    measured = [step.cache_bytes for step in steps]
    assert measured[-1] > 0
    if all(bytes_ is None for bytes_ in predicted):  # said unknown, with the reason
        geometry = Geometry.of(loaded.model.config, loaded.model.dtype)
        if geometry.unknown:
            assert loaded.card["size_rule_unknown"] == geometry.unknown and loaded.card["kv_bytes_per_token"] is None
        else:  # a state layer kvviz has no formula for
            assert None in geometry.layer_state_bytes and loaded.card["fixed_state_bytes"] is None, family
        return
    assert predicted == measured, f"{family}: predicted {predicted}, measured {measured}"
