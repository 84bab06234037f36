"""The token stream of the run in view: generated text, each token shaded by its step latency; hover shows
the step. It follows the run store: the run shown is the store's primary run."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Signal
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import QTextEdit, QToolTip, QWidget

from kvviz.attach.request_trace import STRATEGY as SERVED
from kvviz.files.trace import StepRecord
from kvviz.present import mib
from kvviz.qt import theme
from kvviz.qt.run_store import RunStore
from kvviz.qt.series import RunSeries

STEP_PROPERTY = QTextFormat.Property.UserProperty + 1
# Qt lays out a whole paragraph again after each insertion, so one long paragraph makes every update slower:
# 77 ms a frame at 4,000 tokens of a model stuck repeating "/-", 11 ms with paragraphs of 3,000 characters.
# A new paragraph starts at the first word boundary past MAX_PARAGRAPH characters, and past HARD_PARAGRAPH
# at any token: text without spaces (Chinese, a model stuck on "!!!") shows one line ending early there.
MAX_PARAGRAPH = 1500
HARD_PARAGRAPH = MAX_PARAGRAPH + 500
PIN_ALPHA = 70  # a pinned span's shade behind the prompt's text


class TokenView(QTextEdit):
    sigPin = Signal(str)  # text selected to watch in the next run (kvviz.qt.panels.pins)

    def __init__(self, store: RunStore | None = None, parent: QWidget | None = None):
        """store: the window's RunStore, whose primary run this view shows (None: `show_run` only)."""
        super().__init__(parent)
        self.setReadOnly(True)
        self.setMouseTracking(True)
        self.setPlaceholderText("Generated tokens appear here; hover one to see its step.")
        self.palette_ = theme.PALETTES["dark"]
        self.series: RunSeries | None = None
        self._shown = 0
        self._scale_ms: float | None = None
        self._pins_marked = False
        self.store = store
        if store is not None:
            store.sigShownChanged.connect(self._follow_store)

    def _follow_store(self, _shown=None) -> None:
        primary = self.store.primary()
        if primary is not self.series:
            self.show_run(primary)

    def apply_palette(self, palette: theme.Palette) -> None:
        self.palette_ = palette
        if self.series is not None:
            self.show_run(self.series)

    def show_run(self, series: RunSeries | None) -> None:
        """Show a run from its start (prompt in muted colour, then its tokens)."""
        self.clear()
        self.series = series
        self._shown = 0
        self._scale_ms = None
        if series is None:
            return
        prompt = QTextCharFormat()
        prompt.setForeground(QColor(self.palette_.muted))
        cursor = self.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(series.trace.prompt, prompt)
        self._pins_marked = False
        self.update_tokens()

    def _mark_pins(self, series: RunSeries) -> None:
        """The run's pinned spans shaded in the prompt (the first place each occurs, as the run pinned it)."""
        prompt = series.trace.prompt
        marked = QTextCharFormat()
        shade = QColor(theme.YELLOW)  # the cache map's colour of a span partly held: a pinned span's colour
        shade.setAlpha(PIN_ALPHA)
        marked.setBackground(shade)
        for pin in series.trace.pins:
            start = prompt.find(pin.label) if pin.label else -1
            if start < 0:
                continue
            cursor = QTextCursor(self.document())
            cursor.setPosition(start)
            cursor.setPosition(start + len(pin.label), QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(marked)

    def update_tokens(self) -> None:
        """Append the steps of the shown run that are not on screen yet."""
        series = self.series
        if series is None:
            return
        steps = series.trace.steps[: series.n]  # the records drawn so far: the plots show the same
        if not self._pins_marked and steps:  # the run's own trace by now (a live run's header has no pins)
            self._pins_marked = True
            self._mark_pins(series)
        if self._shown >= len(steps):
            return
        if self._scale_ms is None or self._shown < 16:
            decode = [s.wall_ms for s in steps if s.phase == "decode"]
            if decode:
                decode.sort()
                # shade from the median (no colour) to twice the median (full colour)
                self._scale_ms = decode[len(decode) // 2]
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        scroll = self.verticalScrollBar()
        at_end = scroll.value() >= scroll.maximum() - 4
        cursor.beginEditBlock()  # one layout pass for the whole batch
        for i in range(self._shown, len(steps)):
            text = visible(steps[i].token)
            length = cursor.block().length()
            if length > MAX_PARAGRAPH and text[:1].isspace():
                cursor.insertBlock()
                text = text[1:]
            elif length > HARD_PARAGRAPH:
                cursor.insertBlock()
            cursor.insertText(text, self._format(i, steps[i]))
        cursor.endEditBlock()
        self._shown = len(steps)
        if at_end:
            scroll.setValue(scroll.maximum())

    def _format(self, index: int, step: StepRecord) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setProperty(STEP_PROPERTY, index)
        fmt.setForeground(QColor(self.palette_.foreground))
        if step.phase == "prefill":
            fmt.setFontUnderline(True)
        elif self._scale_ms:
            strength = min(max(step.wall_ms / self._scale_ms - 1.0, 0.0), 1.0)
            if strength > 0.05:
                r, g, b = self.palette_.shade
                fmt.setBackground(QColor(r, g, b, int(40 + 150 * strength)))
        return fmt

    def contextMenuEvent(self, event) -> None:  # noqa: N802 - Qt override
        """The usual menu, and "Pin for the next run" when prompt words are selected."""
        menu = self.createStandardContextMenu(event.pos())
        selected = self.pinnable()
        if selected:
            action = menu.addAction("Pin for the next run")
            action.setToolTip("The next local run watches these words: the cache map outlines them")
            action.triggered.connect(lambda *_: self.sigPin.emit(selected))
        menu.exec(event.globalPos())

    def pinnable(self) -> str:
        """The selected text where it lies within the prompt shown (what a run can pin), else ""."""
        cursor = self.textCursor()
        if self.series is None or not cursor.hasSelection() or cursor.selectionEnd() > len(self.series.trace.prompt):
            return ""
        return self.series.trace.prompt[cursor.selectionStart() : cursor.selectionEnd()]

    def step_at(self, pos) -> int | None:
        cursor = self.cursorForPosition(pos)
        cursor.movePosition(QTextCursor.MoveOperation.Right)
        value = cursor.charFormat().property(STEP_PROPERTY)
        return value if isinstance(value, int) else None

    def viewportEvent(self, event) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.ToolTip and self.series is not None:
            index = self.step_at(event.pos())
            if index is not None and index < len(self.series.trace.steps):
                QToolTip.showText(event.globalPos(), step_tooltip(self.series.trace.steps[index]), self)
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)


def visible(token: str) -> str:
    """Newlines and tabs get a visible mark so that whitespace tokens can be seen and hovered."""
    return token.replace("\n", "\u21b5\n").replace("\t", "\u2192\t")


def step_tooltip(step: StepRecord) -> str:
    if step.strategy == SERVED:  # timed on arrival at kvviz; the server's cache is not seen per request
        wait = "after the request was sent" if step.phase == "prefill" else "after the previous token"
        return f"token {step.index} {step.token!r}\narrived {step.wall_ms:.1f} ms {wait}\nstreamed by a vLLM server"
    return (
        f"step {step.index} ({step.phase})\n"
        f"token {step.token!r} (id {step.token_id}) at position {step.position}\n"
        f"{step.wall_ms:.1f} ms\n"
        f"cache {mib(step.cache_bytes, 3)} (predicted {mib(step.predicted_cache_bytes, 3)})\n"
        f"RSS {mib(step.rss_bytes, 0)}\n"
        f"strategy {step.strategy}"
    )
