"""The options kept files may hold (`kvviz.files.strategy_options`) are the options the engine's strategies take,
of the same types and ranges: a new option or a changed range fails here until both say the same."""

from kvviz.engine import strategies
from kvviz.files.schema import MAX_INT, Flag, Int, Number, Text
from kvviz.files.strategy_options import OPTIONS


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
