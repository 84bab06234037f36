"""kvviz.present: the formatting the CLI, the reports and the window share (no Qt, numpy or torch)."""

from __future__ import annotations

import subprocess
import sys

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
