"""The Help menu: what each view shows (with its units) and what each cache strategy keeps, the keyboard and mouse
shortcuts, and About.

The shortcut list is read from the window's own actions, so it is the set that really works. Versions
come from the installed packages' metadata (importlib.metadata): torch and transformers are never
imported on the GUI thread for it.
"""

from __future__ import annotations

import html
import platform
from importlib import metadata

import PySide6
from PySide6.QtCore import Qt, qVersion
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QMessageBox, QTextBrowser, QVBoxLayout

from kvviz import present
from kvviz.files.trace import SlotState
from kvviz.qt import theme, unsaved
from kvviz.qt.log_file import log_path

# (title, paragraph) of the docks around the modes' views; each mode declares its own (Mode.help). {NAME}s are filled
# in by `words`.
VIEWS: list[tuple[str, str]] = [
    (
        "Tokens",
        "The prompt (muted) and the generated text of the run in view. Each token is shaded by its step's "
        "latency, from none at the run's median to full at twice the median; the prefill is underlined; "
        "\u21b5 marks a new line. Hover a token for its step: position, time in ms, cache size in MiB, RSS.",
    ),
    (
        "Runs",
        "One row per run, live, finished or opened from a file: tokens generated, tokens/s, mean decode ms, "
        "peak cache MiB and its status first, then the strategy (hover it for its options), the share of the "
        "memory-bound limit, 95th-percentile decode ms, prefill ms, one-time pauses, policy state MiB (the most an "
        "evicting policy kept beside keys and values: the position of each token held, H2O's attention sums), peak "
        "process RSS MiB, "
        "scoring ms, the fidelity columns and the model. Status: <i>{STARTING}</i> or <i>{RUNNING}</i> while it "
        "generates (<i>{STREAMING}</i> for a server's reply), then <i>{FINISHED}</i>, <i>{CANCELLED}</i> (stopped "
        "with Stop or Esc, or opened from the journal of a process that ended without saving; what it generated is "
        "kept) or <i>{FAILED}</i> (hover either for why). Select several rows "
        "(Ctrl or Shift + click) to overlay them; their colours are the plots' colours.",
    ),
]

MOUSE = [
    ("Drag in a plot", "pan"),
    ("Mouse wheel in a plot", "zoom"),
    ("Double-click a plot", "fit the data again"),
    ("Hover a plot or a token", "read its values"),
    ("Ctrl/Shift + click in Runs", "overlay several runs"),
]


def versions() -> list[tuple[str, str]]:
    """(name, version) of kvviz and what it runs on; "not installed" where a package is missing."""

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return [
        ("kvviz", installed("kvviz")),
        ("torch", installed("torch")),
        ("transformers", installed("transformers")),
        ("Qt", qVersion()),
        ("PySide6", PySide6.__version__),
        ("pyqtgraph", installed("pyqtgraph")),
        ("Python", platform.python_version()),
    ]


def shortcuts(window) -> list[tuple[str, str]]:
    """(keys, what) for every window action with a shortcut, then the mouse gestures."""
    rows = []
    seen = set()
    for action in window.findChildren(QAction):
        keys = [k.toString(QKeySequence.SequenceFormat.NativeText) for k in action.shortcuts() if not k.isEmpty()]
        text = action.text().replace("&", "").rstrip("…").strip()
        if keys and text and (text, tuple(keys)) not in seen:
            seen.add((text, tuple(keys)))
            rows.append((" or ".join(keys), text))
    return sorted(rows, key=lambda row: row[1].lower()) + MOUSE


def words(palette: theme.Palette) -> dict[str, str]:
    """What the {NAME}s of VIEWS stand for: each cache state's colour in words (theme.STATE_COLOUR_WORDS) after a
    swatch of it as the theme shown draws it, and the Runs table's statuses as kvviz.present writes them."""

    def swatch(colour: str, word: str) -> str:
        return f'<span style="color:{colour}">&#9632;</span>&nbsp;{word}'

    named = {state.name: swatch(theme.state_colour(state, palette), theme.STATE_COLOUR_WORDS[state].capitalize())
             for state in SlotState}
    named["held"] = swatch(theme.held_share_colour(0.5, palette), theme.STATE_COLOUR_WORDS[SlotState.FULL])
    statuses = (present.STARTING, present.RUNNING, present.STREAMING, present.FINISHED, present.CANCELLED,
                present.FAILED)
    return named | {status.upper(): status for status in statuses}


def views_html(modes, palette: theme.Palette | None = None) -> str:
    """Every mode's views (its Help section, under the mode's title), then the docks around them, in the colours of
    `palette` (default: the theme shown)."""
    named = words(palette or theme.current())

    def sections(heading: str, views) -> str:
        body = "".join((f"<h3>{html.escape(title)}</h3>" if title != heading else "")
                       + f"<p>{text.format_map(named)}</p>" for title, text in views)
        return f"<h2>{html.escape(heading)}</h2>{body}"

    return "".join(sections(mode.title, mode.help) for mode in modes) + sections("Around the views", VIEWS)


def strategies_html(strategies) -> str:
    """What each cache strategy keeps and the paper or code it follows, from the engine's own strategy objects."""
    items = "".join(
        f"<li><b>{html.escape(s.name)}</b>: {html.escape(s.description)}"
        + (f". <i>Follows</i> {html.escape(s.reference)}." if s.reference else "") + "</li>"
        for s in strategies
    )
    return f"<h3>Cache strategies</h3><ul>{items}</ul>" if items else ""


def table_html(rows: list[tuple[str, str]]) -> str:
    body = "".join(
        f"<tr><td style='padding:2px 16px 2px 0'><b>{html.escape(a)}</b></td><td>{html.escape(b)}</td></tr>"
        for a, b in rows
    )
    return f"<table cellspacing='0'>{body}</table>"


class HelpMenu:
    """Help ▸ What the views show, Keyboard and mouse, About kvviz. The dialog shown is kept as `dialog`."""

    def __init__(self, window, modes):
        self.window = window
        self.modes = modes
        self.dialog: QDialog | None = None
        menu = window.menuBar().addMenu("&Help")
        self.actions: dict[str, QAction] = {}
        for key, text, shortcut, slot in (
            ("views", "&What the views show", QKeySequence.StandardKey.HelpContents, self.show_views),
            ("shortcuts", "&Keyboard and mouse", None, self.show_shortcuts),
            ("about", "&About kvviz", None, self.show_about),
        ):
            action = QAction(text, window)
            if shortcut is not None:
                action.setShortcut(shortcut)
            action.triggered.connect(lambda *_, s=slot: s())
            menu.addAction(action)
            self.actions[key] = action

    def show_views(self) -> QDialog:
        strategies = [strategy for strategy, _, _ in self.window.model.listing]  # once the worker has listed them
        return self._show("What the views show", views_html(self.modes) + strategies_html(strategies), (640, 620))

    def show_shortcuts(self) -> QDialog:
        return self._show("Keyboard and mouse", table_html(shortcuts(self.window)), (460, 420))

    def show_about(self) -> QDialog:
        text = (
            "<h3>kvviz</h3><p>The key-value cache of a transformer language model, live: what it holds, "
            "what it costs in memory and time, and what each cache strategy changes.</p>"
            + table_html(versions())
            + f"<p>Failures are explained in the window; their details (tracebacks) go to {log_path()}.</p>"
            + f"<p>A conversation not saved when the window closed is kept in {unsaved.folder()}, with the journals "
            "of windows that ended without closing (the runs, evaluations, chats and sweeps they measured: File ▸ Open "
            f"shows them, and continues an evaluation or a sweep); {unsaved.RULE}.</p>"
        )
        box = QMessageBox(QMessageBox.Icon.NoIcon, "About kvviz", text, QMessageBox.StandardButton.Ok, self.window)
        box.setTextFormat(Qt.TextFormat.RichText)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        self.dialog = box
        return box

    def _show(self, title: str, body: str, size: tuple[int, int]) -> QDialog:
        dialog = QDialog(self.window)
        dialog.setWindowTitle(title)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        browser = QTextBrowser()
        browser.setOpenExternalLinks(False)
        browser.setHtml(body)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(dialog.close)
        layout = QVBoxLayout(dialog)
        layout.addWidget(browser)
        layout.addWidget(buttons)
        dialog.resize(*size)
        dialog.show()
        self.dialog = dialog
        return dialog
