"""The window's look and layout as behaviour: what fits, what clears, what a wheel turn changes, what an export
holds, what Help offers and what a save says. Real window, real tiny model; no pixels compared."""

from __future__ import annotations

import re
from importlib import metadata

from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QImage, QKeySequence, QWheelEvent
from PySide6.QtWidgets import QApplication, QTextBrowser

from kvviz.present import CANCELLED, FAILED, FINISHED, RUNNING, STARTING
from kvviz.qt import theme
from kvviz.qt.panels.runs import COLUMNS
from kvviz.qt.plots import MemoryPlot
from kvviz.qt.plots.titles import short_forms, unit_forms


def _wheel(widget, steps: int = 1) -> None:
    """A wheel turn over the middle of a widget, delivered as Qt delivers it (through the event filters)."""
    centre = QPointF(widget.width() / 2, widget.height() / 2)
    event = QWheelEvent(
        centre,
        QPointF(widget.mapToGlobal(centre.toPoint())),
        QPoint(0, 0),
        QPoint(0, 120 * steps),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(widget, event)


def test_wheel_changes_a_field_only_when_it_has_the_focus(qtbot, window):
    tokens = window.controls.settings_panel.max_new_tokens
    combo = window.controls.strategy_panel.combo
    tokens.setValue(100)
    assert window.controls.strategy_panel.set_current("sliding")  # its option fields are built as it is picked
    option = window.controls.strategy_panel._widgets["window"]
    before, option_before = combo.currentIndex(), option.value()
    window.modes["local"].run_button.setFocus()
    _wheel(tokens, -1)
    _wheel(combo, -1)
    _wheel(option, -1)
    assert tokens.value() == 100 and combo.currentIndex() == before and option.value() == option_before
    for field in (tokens, option):  # a passing wheel does not take the focus
        assert field.focusPolicy() == Qt.FocusPolicy.StrongFocus

    window.activateWindow()
    tokens.setFocus()
    qtbot.waitUntil(tokens.hasFocus, timeout=3000)
    _wheel(tokens, 1)
    assert tokens.value() == 101  # focused: the wheel is the user's intent


def test_no_field_of_the_window_takes_a_passing_wheel(qtbot, window):
    """The guard sits on each field (`wheel_guard.guard`), not on the application: every combo and spin box the window
    holds, the option fields of every strategy included, keeps its value under a wheel turn without the focus."""
    from PySide6.QtWidgets import QAbstractSpinBox, QComboBox

    def value(field):
        return field.currentIndex() if isinstance(field, QComboBox) else field.text()

    panel = window.controls.strategy_panel
    window.modes["local"].run_button.setFocus()
    for name in panel.names():
        assert panel.set_current(name), name  # its option fields are built as it is picked
        for field in window.findChildren(QComboBox) + window.findChildren(QAbstractSpinBox):
            before = value(field)
            for steps in (1, -1):  # one of the two changes an unguarded field, whatever its value and range
                _wheel(field, steps)
                assert value(field) == before, (name, type(field).__name__, field.objectName())
            assert field.focusPolicy() != Qt.FocusPolicy.WheelFocus, name


def test_hover_readout_clears_on_leave_and_when_another_run_starts(qtbot, drive, window):
    drive.load(window, "tiny")
    drive.run(window, "dynamic", tokens=10)
    window.redraw()
    plot = window.modes["local"].view.memory_plot
    assert plot.legend_bar.texts() == ["measured", "predicted", "prefill's allocations, ★ their peak"]
    area = plot.plot.vb.sceneBoundingRect()
    plot.hover_at(QPointF(area.left() + 0.97 * area.width(), area.center().y()))  # past the prefill's allocations
    assert "tokens" in plot.readout_text() and "MiB (pred." in plot.readout_text()
    plot.hover_at(QPointF(area.left() + 0.2 * area.width(), area.center().y()))  # over them
    assert "prefill:" in plot.readout_text() and "MiB allocated" in plot.readout_text()
    centre = area.center()
    plot.hover_at(centre)
    assert plot.crosshair.isVisible()
    assert plot.title_label.shown_text() not in ("", plot.readout_text())  # the readout is not in the title

    QApplication.sendEvent(plot.widget.viewport(), QEvent(QEvent.Type.Leave))
    assert plot.readout_text() == "" and not plot.crosshair.isVisible()

    plot.hover_at(centre)
    assert plot.crosshair.isVisible()
    drive.run(window, "sliding", {"window": 8}, tokens=6)
    window.redraw()
    assert not plot.crosshair.isVisible() and plot.readout_text() == ""


def test_empty_plots_have_no_legend_and_legends_name_the_runs(qtbot, drive, window):
    for plot in window.modes["local"].view.plots + window.modes["server"].view.plots:
        assert plot.legend_bar.isHidden(), type(plot).__name__
    assert window.modes["local"].view.run_legend.isHidden()
    drive.load(window, "tiny")
    first = drive.run(window, "dynamic", tokens=6)
    second = drive.run(window, "sink", {"sink_tokens": 2, "window": 6}, tokens=6)
    window.runs_table.select_runs([first, second])
    window.redraw()
    names = window.modes["local"].view.run_legend.texts()
    assert names[0].startswith(f"#{first} dynamic") and names[1].startswith(f"#{second} sink")
    latency = window.modes["local"].view.latency_plot.legend_bar.texts()
    assert latency[:3] == ["step time", "memory-bound floor", "prefill"] and len(latency) == 5
    assert all(t.endswith(" ms") for t in latency[3:])
    assert "evicted" in window.modes["local"].view.cache_map.legend_bar.texts()
    assert window.modes["local"].view.cache_map.title_label.detail.startswith(f"#{second} sink")


def test_titles_and_axis_labels_shorten_but_keep_their_unit(qtbot):
    assert short_forms("Cache memory: measured (solid) and predicted (dashed)")[-1] == "Cache memory"
    assert short_forms("Step latency (decode steps; prefill apart)")[-1] == "Step latency"
    assert unit_forms("cache memory (MiB)") == ["cache memory (MiB)", "memory (MiB)", "MiB"]
    assert unit_forms("latency (ms, log scale)")[-1] == "ms"
    plot = MemoryPlot()
    qtbot.addWidget(plot)
    plot.resize(900, 400)
    plot.show()
    qtbot.waitExposed(plot)
    assert plot.title_label.shown_text() == MemoryPlot.title and plot.axis_label("left") == "cache memory (MiB)"
    plot.resize(260, 170)
    qtbot.waitUntil(lambda: plot.axis_label("left") != "cache memory (MiB)", timeout=3000)
    assert plot.title_label.shown_text() == "Cache memory"
    assert plot.axis_label("left").endswith("MiB") or plot.axis_label("left").endswith("MiB)")
    assert MemoryPlot.title in plot.title_label.toolTip()


def test_exports_have_the_width_asked_a_title_and_no_empty_plot(qtbot, drive, window, tmp_path):
    actions = window.file_actions
    assert actions.export_plots(tmp_path / "none") == [] and "empty" in actions.last_message
    actions.message_box.close()
    drive.load(window, "tiny")
    window.modes["local"].reference_box.setChecked(True)
    drive.run(window, "sink", {"sink_tokens": 2, "window": 6}, tokens=8)
    window.redraw()
    assert not window.modes["local"].view.fidelity_plot.isHidden()
    files = actions.export_plots(tmp_path / "plots", width=1280)
    names = {p.name for p in files}
    assert "fidelity_plot.svg" in names and "fidelity_plot.png" in names
    for path in files:
        if path.suffix == ".png":
            image = QImage(str(path))
            assert image.width() == 1280 and image.height() > 300, path
        else:
            svg = path.read_text(encoding="utf-8")
            width, height = (float(v) for v in re.search(r'width="([\d.]+)mm" height="([\d.]+)mm"', svg).groups())
            assert width > 100 and height > 50, path  # never a 0 mm page
    memory = (tmp_path / "plots" / "memory_plot.svg").read_text(encoding="utf-8")
    assert "<title>Cache memory: measured (solid) and predicted (dashed); the prefill" in memory
    assert "cache memory (MiB)" in memory and "predicted" in memory  # axis label and legend are drawn
    message = window.statusBar().currentMessage()
    assert message.startswith(f"saved {(tmp_path / 'plots').resolve()}") and "1280 px" in message


def test_every_save_says_where_in_the_status_bar(qtbot, drive, window, tmp_path):
    drive.load(window, "tiny")
    drive.run(window, "dynamic", tokens=4)
    actions = window.file_actions
    saved = []
    window.sigSaved.connect(saved.append)
    for save, name in (
        (actions.save_selected_trace, "run.json"),
        (actions.export_runs_csv, "runs.csv"),
        (actions.save_window_png, "window.png"),
    ):
        path = save(tmp_path / name)
        assert window.statusBar().currentMessage().startswith(f"saved {path.resolve()}")
    assert saved == [str((tmp_path / name).resolve()) for name in ("run.json", "runs.csv", "window.png")]
    assert not window.error_bar.isVisible()


def test_prompt_token_count_comes_from_the_model(qtbot, drive, window):
    panel = window.controls.prompt_panel
    panel.set_text("Hello there, how are you?")
    qtbot.waitUntil(lambda: panel.count_label.text() == "– tokens", timeout=3000)  # no model: no count
    drive.load(window, "tiny")
    qtbot.waitUntil(
        lambda: panel.count_label.text().endswith(" tokens") and "–" not in panel.count_label.text(), timeout=10000
    )
    run_id = drive.run(window, "dynamic", tokens=2, prompt="Hello there, how are you?")
    prompt_tokens = window.store.runs[run_id].trace.prompt_tokens
    qtbot.waitUntil(lambda: panel.count_label.text() == f"{prompt_tokens:,} tokens", timeout=10000)
    window.controls.settings_panel.raw.setChecked(True)  # no chat template: fewer tokens
    qtbot.waitUntil(lambda: panel.count_label.text() not in ("counting…", f"{prompt_tokens:,} tokens"), timeout=10000)
    assert int(panel.count_label.text().split()[0].replace(",", "")) < prompt_tokens


def test_open_prompt_file_accepts_utf8_text_and_says_what_is_wrong_otherwise(window, tmp_path):
    actions = window.file_actions
    good = tmp_path / "story.md"
    good.write_text("Once upon a time — a cache.\n", encoding="utf-8")
    assert actions.open_prompt_file(good) == "Once upon a time — a cache.\n"
    assert window.controls.prompt_panel.text() == "Once upon a time — a cache.\n"
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    pdf = tmp_path / "paper.pdf"
    pdf.write_bytes(b"%PDF-1.4")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    for path, words in ((latin, "not UTF-8"), (pdf, ".txt or .md"), (empty, "empty"), (tmp_path / "gone.txt", "gone")):
        assert actions.open_prompt_file(path) is None
        assert path.name in actions.last_message and words in actions.last_message, actions.last_message
        assert "Traceback" not in actions.last_message
        actions.message_box.close()
    assert window.controls.prompt_panel.text() == "Once upon a time — a cache.\n"  # unchanged by the failures
    assert "Open prompt file…" in [a.text().replace("&", "") for a in window.menuBar().actions()[0].menu().actions()]


def test_help_menu_and_switch_shortcut(qtbot, window):
    help_menu = window.menuBar().actions()[-1]
    assert help_menu.text().replace("&", "") == "Help"
    entries = [a.text().replace("&", "") for a in help_menu.menu().actions()]
    assert entries == ["What the views show", "Keyboard and mouse", "About kvviz"]

    qtbot.waitUntil(lambda: bool(window.model.listing), timeout=20000)  # listed by the worker
    views = window.help.show_views()
    body = views.findChild(QTextBrowser).toPlainText()
    for heading in ("Local run", "Evaluate", "Chat", "Choose", "vLLM server", "Cache memory", "Step latency",
                    "Fidelity", "Cache map", "Attention", "Tokens", "Cache strategies"):
        assert heading in body
    # what each policy keeps and the paper it follows
    for follows in ("snapkv: SnapKV: cut the prompt", "Follows SnapKV (Li et al., NeurIPS 2024)", "Follows H2O (Zhang",
                    "Follows Devoto et al., EMNLP 2024", "Follows TOVA (Oren et al.", "Follows StreamingLLM"):
        assert follows in body
    for unit in ("MiB", "milliseconds", "nats", "KiB"):
        assert unit in body
    # the cache map's colours in the words theme.py holds true of both themes, the statuses as the Runs table writes
    cache_map = re.sub("\u25a0\\s", "", body[body.index("Cache map") : body.index("\nAttention\n")])  # swatches
    for state, word in theme.STATE_COLOUR_WORDS.items():
        assert f"{word.capitalize()}: {theme.STATE_LABELS[state].split(',')[0]}" in cache_map, word
    # no colour the map does not use (whole words: "shared" holds "red")
    assert "fainter blue" in cache_map and not re.search(r"\b(Purple|red)\b", cache_map)
    runs = body[body.index("\nRuns\n") : body.index("Cache strategies")]
    for status in (STARTING, RUNNING, FINISHED, CANCELLED, FAILED):
        assert status in runs
    assert "stopped with Stop" in runs and ", stopped," not in runs
    views.close()

    shortcuts = window.help.show_shortcuts().findChild(QTextBrowser).toPlainText()
    assert "F6" in shortcuts and "Switch strategy at the next step" in shortcuts and "Ctrl+Q" in shortcuts

    about = window.help.show_about()
    for name in ("torch", "transformers"):
        assert f"{name}{metadata.version(name)}" in re.sub(r"<[^>]+>|\s", "", about.text())
    about.close()

    switch = window.menus.switch_action
    assert QKeySequence("F6") in switch.shortcuts() and QKeySequence("Ctrl+Shift+Return") in switch.shortcuts()
    assert not switch.isEnabled()  # only while a run is generating


def test_runs_table_keeps_three_rows_and_gets_its_height_back(qtbot, window):
    table = window.runs_table
    header = table.horizontalHeader().sizeHint().height()
    assert table.minimumHeight() >= header + 3 * table.verticalHeader().defaultSectionSize()
    window.resize(1600, 1000)
    qtbot.wait(50)
    QApplication.processEvents()
    tall = window.runs_dock.height()
    window.resize(1280, 600)
    qtbot.wait(50)
    QApplication.processEvents()
    assert window.runs_dock.height() >= table.minimumHeight()
    window.resize(1600, 1000)
    qtbot.waitUntil(lambda: abs(window.runs_dock.height() - tall) <= 3, timeout=3000)


def test_runs_table_shows_its_figures_and_status_without_scrolling_at_1280x720(qtbot, drive, window):
    """A quantized run's six options made the strategy column about 690 px wide: the figures and the status went
    past the table's right edge. They come first now, and a long strategy is cut with its whole text as tooltip."""
    window.resize(1280, 720)
    window.reset_layout()
    drive.load(window, "tiny")
    run_id = drive.run(window, "quantized", {"nbits": 2}, tokens=3)
    window.redraw()
    QApplication.processEvents()
    table, header = window.runs_table, window.runs_table.horizontalHeader()
    assert table.horizontalScrollBar().value() == 0
    for title in ("run", "tokens", "tokens/s", "decode ms (mean)", "peak cache MiB", "status", "strategy"):
        column = COLUMNS.index(title)
        right = header.sectionViewportPosition(column) + header.sectionSize(column)
        assert 0 <= header.sectionViewportPosition(column) and right <= table.viewport().width(), title
    label = table.cell(run_id, "strategy")
    assert label.startswith("quantized (backend=quanto, nbits=2") and label.endswith(")")
    strategy = COLUMNS.index("strategy")
    assert header.sectionSize(strategy) < table.sizeHintForColumn(strategy)  # cut, "…" at its end
    assert table.item(0, strategy).toolTip() == label
    # with room to spare the whole label shows
    window.resize(1920, 1080)
    window.reset_layout()
    QApplication.processEvents()
    assert header.sectionSize(strategy) >= table.sizeHintForColumn(strategy)


def test_choose_table_shows_whole_rows_and_six_at_1280x720(qtbot, window):
    window.set_mode("choose")
    view = window.modes["choose"].view
    row = view.table.verticalHeader().defaultSectionSize()
    for size in ((1280, 720), (1920, 1080)):
        window.resize(*size)
        qtbot.wait(50)
        QApplication.processEvents()
        shown = view.table.viewport().height()
        assert shown % row == 0 and shown // row >= 6, (size, shown, row)  # no row cut in half
        assert view.frontier_plot.height() >= view.frontier_plot.minimumSizeHint().height()  # its axes keep their room
