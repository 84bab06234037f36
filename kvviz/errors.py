"""The errors kvviz reports to its users; every message says what is wrong and what is accepted.

A leaf module (stdlib only), so that the CLI, the engine and the window can all raise and catch these
without importing each other or torch.
"""


class UsageError(Exception):
    """A mistake in how kvviz was called (exit status 2)."""


class OptionError(ValueError):
    """A strategy, option or setting the user asked for that cannot be accepted (exit status 2)."""


class ModelError(RuntimeError):
    """A model spec that cannot be loaded or used (exit status 1)."""
