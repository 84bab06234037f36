"""How a plot's title and axis labels keep to the room they have.

- The title keeps to one line at any width: the whole title where it fits, else its short form (the part before
  ":", " (" or ","), else cut with "…"; the whole title is its tooltip. A plot may add a detail after the title (the
  cache map names its run), cut first.
- Axis labels keep their unit: where "cache memory (MiB)" is longer than the axis, "memory (MiB)" or "MiB" is shown
  instead.
"""

from __future__ import annotations

import html
import re

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

HINT_TEXT = "Drag to pan, mouse wheel to zoom, double-click to fit the data again."


def short_forms(text: str) -> list[str]:
    """A title and its short form: the part before its first ": ", " (" or ", " ("Cache memory")."""
    cuts = [i for i in (text.find(": "), text.find(" ("), text.find(", ")) if i > 0]
    return [text, text[: min(cuts)]] if cuts else [text]


def unit_forms(label: str) -> list[str]:
    """An axis label and its shorter forms that keep the unit: "cache memory (MiB)", "memory (MiB)", "MiB"."""
    match = re.fullmatch(r"(.*?)\s*\(([^()]+)\)", label)
    if not match:
        return [label]
    words, unit = match.group(1).split(), match.group(2)
    forms = [label]
    if len(words) > 1:
        forms.append(f"{words[-1]} ({unit})")
    forms.append(unit)
    if ", " in unit:  # "ms, log scale": the unit itself comes first
        forms.append(unit.split(", ")[0])
    return forms


class TitleLabel(QLabel):
    """One line: the title's longest form that fits (bold), then the detail (italic) cut to the room left."""

    DETAIL_MIN_PX = 60  # a detail with less room than this is left out

    def __init__(self, title: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("plotTitle")
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumWidth(1)
        self._title = title
        self._detail = ""
        self._fit()

    @property
    def title(self) -> str:
        return self._title

    @property
    def detail(self) -> str:
        return self._detail

    def set_title(self, title: str | None = None, detail: str | None = None) -> None:
        if title is not None:
            self._title = title
        if detail is not None:
            self._detail = detail
        self._fit()

    def shown_text(self) -> str:
        """The text on screen, without markup (tests)."""
        return re.sub(r"<[^>]+>", "", html.unescape(self.text().replace("&nbsp;", " ")))

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit()

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._fit()

    def _fit(self) -> None:
        room = self.contentsRect().width() - 4
        bold = QFontMetrics(self.font())
        italic_font = QFont(self.font())
        italic_font.setBold(False)
        italic_font.setItalic(True)
        italic = QFontMetrics(italic_font)
        forms = short_forms(self._title)
        title = next((f for f in forms if bold.horizontalAdvance(f) <= room), None)
        if title is None:
            title = bold.elidedText(forms[-1], Qt.TextElideMode.ElideRight, max(room, 0))
        text = f"<b>{html.escape(title)}</b>"
        if self._detail:
            left = room - bold.horizontalAdvance(title) - italic.horizontalAdvance("  ")
            if left >= self.DETAIL_MIN_PX:
                detail = italic.elidedText(self._detail, Qt.TextElideMode.ElideRight, left)
                text += f'&nbsp;&nbsp;<span style="font-weight:normal"><i>{html.escape(detail)}</i></span>'
        if text != self.text():
            self.setText(text)
        full = self._title + (f"  {self._detail}" if self._detail else "")
        self.setToolTip(f"{full}\n{HINT_TEXT}")
