"""The generation engine: torch + transformers, never Qt.

Public surface, used by the CLI and by the window's worker thread:

    from kvviz.engine import models, strategies, decode

    loaded = models.load_model("default" | "tiny" | DIR | FILE.gguf | HUB_ID,
                               dtype="auto", device="auto", progress=callback)   # raises kvviz.errors.ModelError
    loaded.card                                  # dict: see models.model_card
    strategies.all_strategies()                  # list[Strategy]: name, description, options, available()
    choice = strategies.choose(name, {"key": "value"})   # raises kvviz.errors.OptionError
    decoder = decode.Decoder(loaded, choice, decode.GenerationSettings(...), prompt)
    for step in decoder:                         # kvviz.files.trace.StepRecord, prefill first
        ...
    decoder.cancel()                             # thread-safe; iteration ends after the current step
    decoder.trace                                # kvviz.files.trace.Trace, filled as steps come
"""
