"""kvviz.present: the formatting the CLI, the reports and the window share (no Qt, numpy or torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvviz import present


def test_present_imports_neither_numpy_nor_torch_nor_qt():
    code = (
        "import sys, kvviz.present\n"
        "loaded = [m for m in ('numpy', 'torch', 'PySide6', 'pyqtgraph') if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_unknown_stays_unknown():
    assert present.mib(None) == present.UNKNOWN and present.mib(3 * 2**20 // 2) == "1.50 MiB"
    assert present.mib(1536 * 2**20, 0) == "1,536 MiB" and present.mib(2**20, 3, unit=False) == "1.000"
    assert present.number(None) == present.UNKNOWN and present.ms(12.25) == "12.2 ms"
    assert present.in_mib(None) is None and present.in_mib(2**20) == 1.0


def test_model_card_rows_say_what_is_missing():
    card = {"name": "m", "architecture": "LlamaForCausalLM", "parameters": 134_515_008, "num_layers": 30,
            "layer_types": ["full_attention"] * 30, "num_attention_heads": 9, "num_kv_heads": 3, "head_dim": 64,
            "dtype": "float32", "device": "cpu", "kv_bytes_per_token": 46080}
    rows = dict(present.model_card_rows(card))
    assert rows["layers"] == "30 (30 full_attention)" and rows["heads"] == "9 query, 3 KV, dim 64"
    assert rows["KV / token"] == "46,080 bytes (45.0 KiB)"
    partial = dict(present.model_card_rows({"name": "x"}))
    assert partial["parameters"] == present.UNKNOWN and partial["KV / token"] == present.UNKNOWN


def test_run_row_names_switches_pauses_and_the_memory_bound_share(tmp_path):
    from kvviz.files import report
    from kvviz.files.trace import LayerRecord, StepRecord, Switch, Trace

    def step(i, strategy):
        layer = LayerRecord(keys_bytes=100 * (i + 1), values_bytes=100 * (i + 1), seq_len=i + 1, capacity=i + 1)
        return StepRecord(index=i, phase="prefill" if i == 0 else "decode", token_id=i, token="x", wall_ms=2.0,
                          cache_bytes=200 * (i + 1), predicted_cache_bytes=200 * (i + 1), rss_bytes=1,
                          strategy=strategy, layers=[layer])

    trace = Trace(model={"name": "m"}, strategy={"name": "dynamic", "options": {}}, prompt_tokens=5,
                  compile_ms=38_250.0, weight_bytes=10**6, bandwidth_bytes_per_s=10**9,
                  steps=[step(i, "dynamic" if i < 3 else "sliding") for i in range(5)],
                  switches=[Switch(3, "dynamic", "sliding", {"window": 8})])
    row = present.run_row("#1", trace)
    assert row["label"] == "dynamic -> sliding (window=8) @3" and row["switches"] == "3:sliding"
    assert row["compile_ms"] == 38_250.0 and row["warm_up_ms"] is None
    summary = trace.summary()
    assert row["share_of_memory_bound"] == summary["share_of_memory_bound"] == pytest.approx(0.5, rel=0.01)
    cells = dict(zip([title for title, _, _ in present.RUN_TABLE], present.run_cells(row), strict=True))
    assert cells["one-time s"] == "compile 38.2" and cells["of mem. limit"] == "50%"
    assert cells["strategy"] == row["label"]
    assert cells["policy state MiB"] == present.UNKNOWN  # steps that did not measure it
    for i, s in enumerate(trace.steps):
        s.policy_bytes = i * 2**19
    cells = dict(zip([title for title, _, _ in present.RUN_TABLE], present.run_cells(present.run_row("#1", trace)),
                     strict=True))
    assert cells["policy state MiB"] == "2.000"  # the peak
    path = report.write_csv([row], tmp_path / "runs.csv")
    header, values = path.read_text().splitlines()
    csv = dict(zip(header.split(","), values.split(","), strict=True))
    assert csv["compile ms"] == "38250.0" and csv["warm-up ms"] == ""
    assert float(csv["share of memory-bound speed"]) == pytest.approx(0.5, rel=0.01)


def test_the_card_says_per_kind_of_cache_layer_what_one_token_adds_and_what_stays_fixed():
    hybrid = {"cache_kinds": ["state", "state", "attention"], "layer_token_bytes": [0, 0, 256],
              "layer_state_bytes": [2048, 2048, 0], "fixed_state_bytes": 4096}
    assert present.cache_kind_rows(hybrid) == [("2 x linear-attention / state-space", "2,048 B fixed state"),
                                       ("1 x attention", "256 B/token"),
                                       ("fixed state", "4,096 bytes, whatever the context")]
    t5 = {"cache_kinds": ["attention+cross"] * 2, "layer_token_bytes": [512, 512], "layer_state_bytes": [0, 0],
          "fixed_state_bytes": 0, "cross_bytes_per_prompt_token": 1024}
    assert present.cache_kind_rows(t5) == [("2 x self-attention", "512 B/token"),
                                   ("cross-attention", "1,024 B per prompt token (the encoder's output, all layers), "
                                                       "fixed once the prompt is read")]
    latent = {"kv_lora_rank": 16, "qk_rope_head_dim": 8, "stored_bytes": 96, "expanded_bytes": 512, "factor": 512 / 96}
    deepseek = {"cache_kinds": ["attention"] * 2, "layer_token_bytes": [96, 96], "layer_state_bytes": [0, 0],
                "latent_attention": latent}
    assert present.cache_kind_rows(deepseek)[-1] == (
        "latent attention", "caches 96 B/token/layer: the latent (kv_lora_rank 16 + rope 8), as serving engines do; "
        "per-head keys and values would be 512 B (5.3x)")
    plain = {"cache_kinds": ["attention"], "layer_token_bytes": [256]}
    assert present.cache_kind_rows(plain) == []  # nothing to add to the card


def test_one_label_names_a_strategy_everywhere():
    """The window's legends, lists, frontier and tables, the command line, the kept files and the CSV cells name a
    strategy with present.strategy_label (and its options with options_text)."""
    from kvviz.engine.strategies import choose
    from kvviz.files.evaluation import EvalRun
    from kvviz.present import options_text, strategy_label

    strategy = {"name": "quantized", "options": {"backend": "hqq", "nbits": 2, "residual_length": 128}}
    defaults = {"quantized": {"backend": "quanto", "nbits": 4, "residual_length": 128}}
    assert strategy_label(strategy) == "quantized (backend=hqq, nbits=2, residual_length=128)"
    assert strategy_label(strategy, defaults) == "quantized (backend=hqq, nbits=2)"
    assert strategy_label(strategy, defaults, limit=20) == "quantized (backend=…)"
    assert strategy_label({"name": "dynamic", "options": {}}, {"dynamic": {}}) == "dynamic"
    assert strategy_label(strategy, {"sink": {}}) == strategy_label(strategy)  # a strategy the defaults do not list
    assert options_text(strategy["options"], " ") == "backend=hqq nbits=2 residual_length=128"
    choice = choose("sink", {"sink_tokens": 4, "window": 60})
    assert choice.label() == strategy_label({"name": choice.name, "options": choice.options})
    run = EvalRun(model={}, strategy={"name": "sink", "options": dict(choice.options)}, document={}, method={})
    assert run.label() == choice.label() == "sink (sink_tokens=4, window=60)"
