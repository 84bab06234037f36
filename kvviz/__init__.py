"""kvviz: see the key-value cache of a transformer language model while it generates."""

__version__ = "0.1.0"
