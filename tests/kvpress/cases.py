"""Each comparison: a kvviz strategy and the kvpress press it is proved against, at a budget in tokens.

kvviz budgets in tokens; kvpress takes a compression ratio, which the reference turns each budget into for each
prompt's length (`packaging/kvpress/reference.py`: ratio = 1 - budget / length). Where kvviz's default options
differ from kvpress's, the comparison sets one side to the other's (said beside it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str  # the kvviz strategy (and wrapper) compared
    kvviz: str  # its spec, with {budget} where the budget goes
    kvpress: dict  # the press (packaging/kvpress/reference.py's form), without its budget
    note: str = ""  # where the two sides' defaults differ, and which one the comparison takes
    # a documented difference in what is kept: "newest" (kvpress always keeps the newest token), "ties" (a later
    # compression breaks ties between equal scores in the order the cache holds its keys: see sides.explained)
    differs: str = ""
    chat: bool = False  # the prompt in the model's chat template (KVzip: kvpress takes the first tokens for its header)

    def id(self, budget: int) -> str:
        return f"{self.name}@{budget}"

    def spec(self, budget: int) -> str:
        return self.kvviz.format(budget=budget, window=budget - 4, half=budget // 2)

    def prompt(self, needle: str) -> str:
        """The name of the prompt this case reads for the needle prompt `needle`."""
        return f"{needle}/chat" if self.chat else needle

    def press(self, budget: int) -> dict:
        """The press, its budgets (the top press's, or a nested one's where it names "budget") filled in."""
        if not any(f"{{{name}}}" in self.kvviz for name in ("budget", "window", "half")):  # no budget (ThinK)
            return self.kvpress
        if "budget" not in str(self.kvpress):
            return {**self.kvpress, "budget": budget}
        return fill(self.kvpress, budget)


def fill(spec, budget: int):
    """`spec` with every "budget" and "half" placeholder set from `budget`."""
    if isinstance(spec, dict):
        return {key: fill(value, budget) for key, value in spec.items()}
    return {"budget": budget, "half": budget // 2}.get(spec, spec) if isinstance(spec, str) else spec


SNAPKV = {"class": "SnapKVPress", "kwargs": {"window_size": 32, "kernel_size": 5}}  # kvviz's snapkv defaults

CASES = [
    Case("exact", "dynamic", {"class": "KnormPress", "kwargs": {"compression_ratio": 0.0}},
         "the full cache: kvpress with a press that compresses nothing"),
    Case("h2o", "h2o:budget={budget}:recent=0:average=true", {"class": "ObservedAttentionPress", "attention": "eager"},
         "kvpress's ObservedAttention keeps no recent window and averages each token's attention over the queries that "
         "saw it: kvviz's h2o with recent=0 and average=true"),
    Case("tova", "tova:budget={budget}", {"class": "TOVAPress"},
         "kvpress keeps the newest token whatever its attention (its comment: 'a very slight difference from TOVA'); "
         "kvviz ranks it with the rest, as TOVA's code does", differs="newest"),
    Case("snapkv", "snapkv:budget={budget}", SNAPKV,
         "kvpress's SnapKV observes 64 queries by default, the authors' code 32 (kvviz's default): window_size=32"),
    Case("knorm", "knorm:budget={budget}:skip_layers=0:decode_interval=0", {"class": "KnormPress"},
         "kvpress compresses every layer, the authors leave the first two whole (kvviz's default): skip_layers=0; "
         "kvpress compresses the prompt only, the authors' code at every step (kvviz's default): decode_interval=0"),
    Case("sink", "sink:sink_tokens=4:window={window}", {"class": "StreamingLLMPress", "kwargs": {"n_sink": 4}},
         "kvpress keeps the kept keys' rotation, kvviz re-rotates them as StreamingLLM does: the same positions kept"),
    Case("expected_attention", "expected_attention:budget={budget}", {"class": "ExpectedAttentionPress"}),
    Case("pyramidkv", "pyramidkv:budget={budget}", {"class": "PyramidKVPress"}),
    Case("keydiff", "keydiff:budget={budget}", {"class": "KeyDiffPress"}),
    Case("lagkv", "lagkv:budget={budget}", {"class": "LagKVPress"}),
    Case("think", "think:key_channels=0.5",
         {"class": "ThinKPress", "kwargs": {"key_channel_compression_ratio": 0.5, "window_size": 32}},
         "kvpress's default share is 0 (nothing pruned): 0.5 on both sides; no budget (every token kept)"),
    Case("kvzip", "kvzip:budget={budget}", {"class": "KVzipPress"},
         "kvpress takes the first tokens of any prompt for the chat template's header: the prompts are in the template",
         chat=True),
    Case("random", "random:budget={budget}:seed=0", {"class": "RandomPress", "kwargs": {"seed": 0}},
         "kvpress's RandomPress draws unseeded by default: seed=0 on both sides"),
    Case("chunk", "snapkv:budget={budget}:chunk=20",
         {"class": "ChunkKVPress", "kwargs": {"chunk_length": 20}, "press": SNAPKV}),
    Case("critical", "snapkv:budget={budget}:critical=true", {"class": "CriticalKVPress", "press": SNAPKV}),
    Case("adaptive", "snapkv:budget={budget}:adaptive=true", {"class": "AdaKVPress", "press": SNAPKV}),
    Case("adaptive_critical", "snapkv:budget={budget}:adaptive=true:critical=true",
         {"class": "CriticalAdaKVPress", "press": SNAPKV}),
    Case("decoding", "knorm:budget={budget}:skip_layers=0:decode_interval=4:decode_target={half}",
         {"class": "PrefillDecodingPress", "prefilling_press": {"class": "KnormPress", "budget": "budget"},
          "decoding_press": {"class": "DecodingPress", "base_press": {"class": "KnormPress"},
                             "kwargs": {"compression_interval": 4, "target_size": "half",
                                        "hidden_states_buffer_size": 0}}},
         "kvpress's DecodingPress buffers 256 recent inputs by default, key norm reads none: 0. Differences: equal key "
         "norms (the same token twice in the first layer) ranked in another order at a compression while decoding, "
         "and what the tokens decoded after it then keep", differs="ties"),
    Case("decoding_fraction", "keydiff:budget={budget}:decode_interval=4:decode_fraction=0.5",
         {"class": "PrefillDecodingPress", "prefilling_press": {"class": "KeyDiffPress", "budget": "budget"},
          "decoding_press": {"class": "CompressionRatioDecodingPress", "base_press": {"class": "KeyDiffPress"},
                             "kwargs": {"compression_interval": 4, "target_compression_ratio": 0.5,
                                        "hidden_states_buffer_size": 0}}}),
    Case("adaptive_expected", "expected_attention:budget={budget}:adaptive=true",
         {"class": "AdaKVPress", "press": {"class": "ExpectedAttentionPress"}}),
]
