"""The options kept files may hold (`kvviz.files.strategy_options`) are the options the engine's strategies take,
of the same types and ranges: a new option or a changed range fails here until both say the same."""

import re

from kvviz.engine import strategies
from kvviz.files.schema import MAX_INT, Flag, Int, Number, Text
from kvviz.files.strategy_options import OPTIONS
from kvviz.present import WRAPPERS_OFF, strategy_label


def declared(option: strategies.Option):
    """The spec a kept file's value of `option` must meet."""
    if option.kind == "bool":
        return Flag()
    if option.kind == "choice":
        return Text(tuple(option.choices))
    if option.kind == "float":
        return Number(option.minimum, option.maximum)
    high = MAX_INT if option.maximum is None else int(option.maximum)
    return Int(None if option.minimum is None else int(option.minimum), high)


def test_every_option_of_every_strategy_is_declared_alike():
    engine = {s.name: {o.name: declared(o) for o in s.options} for s in strategies.all_strategies()}
    assert OPTIONS == engine


def test_a_label_names_a_policys_wrappers_and_schedule_only_where_set():
    """present.strategy_label's table of the values that leave a scoring policy as its paper has it is the
    engine's defaults: every policy at its defaults is named with its own options only, and a wrapper or schedule
    set otherwise is named."""
    wrappers = [*WRAPPERS_OFF, "decode_interval"]
    for strategy in strategies.all_strategies():
        defaults = {o.name: o.default for o in strategy.options}
        label = strategy_label({"name": strategy.name, "options": defaults})
        assert not any(re.search(rf"\b{w}=", label) for w in wrappers), label
        if "decode_interval" in defaults:
            changed = {**defaults, "decode_interval": 1 - defaults["decode_interval"], "chunk": 8}
            label = strategy_label({"name": strategy.name, "options": changed})
            assert f"decode_interval={changed['decode_interval']}" in label and "chunk=8" in label, label
