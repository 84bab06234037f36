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

# (title, paragraph): one per view, in the order they appear in the window. {NAME}s are filled in by `words`.
VIEWS: list[tuple[str, str]] = [
    (
        "Cache memory",
        "Bytes the cache holds after each step, in MiB, against the tokens in context (prompt plus generated). "
        "<b>Measured</b> (wide solid line) is what the cache's tensors really allocate (shared storages "
        "counted once, quantized tensors walked to their packed payload, scales and zero points). "
        "<b>Predicted</b> (thin dashed line on top) is what the model's config and the strategy's "
        "allocation rule alone say it should be; for the dynamic and static caches the two agree exactly. "
        "The dotted line marks the end of the prompt (prefill); a dash-dotted line marks a switch of strategy. "
        "A thin dotted line in the run's colour is the part that does not grow with the tokens generated: the "
        "fixed-size states of linear-attention and state-space layers, or an encoder-decoder's cross-attention keys "
        "and values of the prompt (the plot then starts at 0).",
    ),
    (
        "Step latency",
        "Wall time of each decode step in milliseconds: one forward pass over one new token, with the "
        "cache's own work. The prefill (the whole prompt in one pass) is a star, kept off the scale; its time "
        "is in the legend above. The dashed line is each step's memory-bound floor: the time to read every "
        "weight and the whole KV cache once at this machine's measured memory bandwidth (measured once, kept "
        "in kvviz's cache folder; kvviz bench measures it again). No step can be faster. The KV cache's share "
        "of those bytes grows with the context, so a growing cache's floor rises while a sink, sliding or "
        "quantized cache's stays low: a smaller cache is faster because each step reads fewer bytes. The "
        "status bar and the Runs table give the share of that limit a run reached. One-time pauses (quanto's "
        "kernel build, torch.compile) are marked where they happened and are in no step's time.",
    ),
    (
        "Fidelity",
        "Shown for runs made with <i>Compare with the exact cache</i>: a full-precision DynamicCache "
        "reference runs in lockstep on the same tokens, and this plot shows KL(reference || run) of the "
        "next-token distributions at every step, in nats. 0 means the cache changed nothing; the Runs "
        "table adds the share of steps whose most likely token agrees (top-1 agree) and the first step "
        "where they differ. The reference's time is measured apart and not counted in tokens/s.",
    ),
    (
        "Cache map",
        "What each layer (rows) holds at each position (columns, one per token) after the latest step. "
        "{FULL}: full precision. {QUANTIZED}: quantized. {RESIDUAL}: residual buffer, the newest tokens a "
        "quantized cache keeps in full precision. {SINK}: attention sinks, the first tokens a sink cache keeps. "
        "{EVICTED}: evicted, the token was dropped. {PREALLOCATED}: allocated but not written yet (a static cache's "
        "preallocated slots). {UNSEEN}: not yet used. {STATE}: fixed-size state: a linear-attention or state-space "
        "layer (Mamba, gated DeltaNet) folds every token into a convolution and a recurrent state whose size never "
        "changes, so it holds no positions (hover for the shapes). {SHARED}: shares another layer's keys and values "
        "(Gemma 3n's KV-shared layers keep none of their own). With per-head eviction (H2O, SnapKV, key norm) each "
        "KV head of a layer keeps its own positions: a position only some of them hold is a fainter {held}, "
        "the fainter the fewer heads hold it (hover a cell for the count). The title names the run shown.",
    ),
    (
        "Attention",
        "The tab beside the cache map. Left: where the current token's attention goes, per layer (rows) over the "
        "positions (columns), averaged over the query heads, on a log scale; positions a layer no longer holds "
        "draw none and keep the evicted colour. Right: each layer's share of that attention on the first four "
        "positions (the attention sink), at every step, one line per layer and their mean. It is computed only "
        "while this tab is on screen: the map shows the last step computed, and trace files keep the shares, "
        "not the map.",
    ),
    (
        "Cache bytes per layer, now",
        "Bytes of keys and of values each layer holds after the latest step, in KiB (or MiB for large "
        "caches), each layer's bars centred on its number. Layers that share or skip their cache show it here. A "
        "third bar is what does not grow: a linear-attention or state-space layer's fixed-size state (yellow), or "
        "an encoder-decoder's cross-attention keys and values of the prompt (purple). Under multi-head latent "
        "attention (DeepSeek-V3) the two bars are the compressed latent and the rotary key part, what the cache "
        "stores in place of per-head keys and values.",
    ),
    (
        "Time per layer",
        "Mean wall time of each decoder layer's forward pass over the decode steps, in milliseconds, one "
        "line per run; measured with hooks on the layers from the first decode step on (a run under torch.compile "
        "does not measure it).",
    ),
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
    (
        "Evaluate",
        "How well the model reads a long document through each strategy's cache (StreamingLLM's evaluation). "
        "Each strategy in the list reads the document one token at a time through its own cache, and the "
        "model's prediction of every next token is scored: its negative log-likelihood (NLL, natural log). "
        "Strategies that keep every token exactly (dynamic, static) read a chunk of tokens per forward, with "
        "the same result. <b>Log-perplexity</b>: the mean NLL of the last 64 predictions at each position, "
        "in nats (fewer at the very start; the y range leaves the first 16 out, the start of any text is hard "
        "to predict); lower reads the text better, and a rise after a strategy's first eviction (dashed line) "
        "is what dropping tokens costs. <b>Cache memory</b>: measured (solid) and predicted (dashed) after each "
        "prediction, in MiB (dots: measured once per chunk). The table gives per strategy the perplexity (exp "
        "of the mean NLL) over all predictions and over their second half, the cache at the end, predictions "
        "per second, and the first position predicted after the cache dropped a token. Strategies are named "
        "by the options they set away from their defaults; hover for all of them. Longer documents are cut at "
        "the model's context, and the line above the plots says so. File: save the evaluation (a kvviz-eval "
        "file per strategy and summary.csv, as <i>kvviz eval --out</i>), export its summary as CSV, open kept "
        "evaluation files.",
    ),
    (
        "Choose",
        "Which cache should you use? Under Controls ▸ Choose, give the text, the tokens to measure, the context "
        "each sequence will reach (default: the model's maximum), how many sequences at once, the memory budget "
        "(4GiB, 512MiB, or free for the device's free memory) and the quality you accept (5% on perplexity, or "
        "kl=0.05 nats), and untick the configurations of the default grid you do not want. Choose reads the text "
        "through each, compared at every prediction with the exact cache (KL divergence, top-1 agreement), times a "
        "few decode steps with it alone, and derives its memory at your target from its own size rule. Each "
        "configuration is a point: quality lost (perplexity change in %, or mean KL in nats) against cache bytes "
        "at the target (log axis), coloured by decode speed; the line joins the frontier, the configurations no "
        "other beats on both. The dashed line is your tolerance, the dash-dotted one your budget. Hover a point "
        "for its numbers; click it (or its row) for its running perplexity, KL and measured cache along the text. "
        "Above, the answer: the smallest cache within the tolerance and the best quality within the budget, with "
        "what they rest on. Stop keeps the finished configurations; File ▸ Save sweep writes the kvviz-sweep "
        "file, its CSV and the frontier picture.",
    ),
    (
        "Conversation",
        "A chat with one cache kept across the turns (the Chat tab of the Controls picks the model, the strategy "
        "and the tokens each answer may have). Each message is rendered with the whole history by the chat "
        "template and only the tokens the cache does not hold yet are fed; where the rendered history differs "
        "from what the cache holds (a template that rewrites earlier turns, an answer whose text tokenizes "
        "differently), the cache is cropped at the first differing token, or prefilled again where it cannot be "
        "cropped (it has evicted or quantized), and the table's note says so. <b>Regenerate</b>: the last answer "
        "again from the cache cropped back to your message. <b>Edit…</b>: the selected turn's message into the "
        "box; Send replaces it and drops what came after. <b>New chat</b>: a deep copy of the cached system prompt "
        "(its bytes are counted twice). <b>Switch</b> converts the chat's cache between turns or mid-answer. The "
        "plots run over tokens in context, each turn's first token a dashed line; the cache map colours what the "
        "cache holds by role (shades alternate by turn) and what it evicted. The table gives per turn the tokens "
        "fed and kept, the time to first token, a full re-prefill of the history (measured when ticked), decode "
        "tokens/s, the cache at the turn's end and the tokens evicted during it. Closing the window (or Ctrl-C, "
        "SIGTERM) loses no finished turn: the chat is written again to the file File ▸ Save conversation last "
        "wrote, or else to a new file in the folder About kvviz names; File ▸ Open reopens it.",
    ),
    (
        "vLLM server",
        "Polled from the server's /metrics. <b>KV-cache usage</b>: the share of the server's cache blocks "
        "in use, or that many tokens, or MiB. <b>Requests</b>: running and waiting. <b>Server latency "
        "percentiles</b>: time to first token (TTFT) and inter-token latency (ITL), p50 solid, p90 dashed, "
        "p99 dotted, in ms on a log scale, from the server's histograms. <b>Throughput</b>: generated "
        "tokens/s. <b>Prefix-cache hit rate</b>: the share of prompt tokens found in the cache, per poll "
        "interval (dots) and since attach (line), in %. <b>Per-token latency</b>: kvviz's own requests, "
        "timed on arrival, next to local runs.",
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


def views_html(palette: theme.Palette | None = None) -> str:
    """Every view's help in the colours of `palette` (default: the theme shown)."""
    named = words(palette or theme.current())
    return "".join(f"<h3>{html.escape(title)}</h3><p>{text.format_map(named)}</p>" for title, text in VIEWS)


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

    def __init__(self, window):
        self.window = window
        self.dialog: QDialog | None = None
        self.strategies: list = []  # the engine's strategies, once the worker has listed them
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

    def set_strategies(self, listing) -> None:
        """The worker's listing of (strategy, available, reason): the views' help describes each strategy."""
        self.strategies = [strategy for strategy, _, _ in listing]

    def show_views(self) -> QDialog:
        return self._show("What the views show", views_html() + strategies_html(self.strategies), (640, 620))

    def show_shortcuts(self) -> QDialog:
        return self._show("Keyboard and mouse", table_html(shortcuts(self.window)), (460, 420))

    def show_about(self) -> QDialog:
        text = (
            "<h3>kvviz</h3><p>The key-value cache of a transformer language model, live: what it holds, "
            "what it costs in memory and time, and what each cache strategy changes.</p>"
            + table_html(versions())
            + f"<p>Failures are explained in the window; their details (tracebacks) go to {log_path()}.</p>"
            + f"<p>A conversation not saved when the window closed is kept in "
            f"{unsaved.folder()}.</p>"
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
