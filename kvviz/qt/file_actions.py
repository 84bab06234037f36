"""The File menu's keep-and-share actions: open and save traces, export the Runs table, plots and window.

Every action is a thin dialog in front of a function that takes an explicit path (`open_trace`,
`save_selected_trace`, `export_runs_csv`, `export_plots`, `save_window_png`), so tests and scripts
call the same code the menu does. `install_file_actions(window)` adds the menu entries and drag and
drop of `.json` trace files onto the window.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMenu, QMessageBox

from kvviz import present, report
from kvviz.formats import read_kept
from kvviz.jsonfile import KeptFileError

TRACE_FILTER = "kvviz traces and server sessions (*.json);;All files (*)"


class FileActions(QObject):
    """Kept alive on the window as `window.file_actions`; also the drag-and-drop event filter."""

    def __init__(self, window: QMainWindow):
        super().__init__(window)
        self.window = window
        self.last_message = ""
        self.message_box: QMessageBox | None = None
        self.actions: dict[str, QAction] = {}

    # -- the functions behind the actions ---------------------------------------------------------

    def open_trace(self, path: str | os.PathLike):
        """Open a trace (into the Runs table) or a server session (into the server view).

        Returns the new run's id or the Session; on a bad file shows a message, changes nothing, returns None.
        """
        try:
            kept = read_kept(path)
        except KeptFileError as exc:
            self.show_message("Could not open", f"Could not open {Path(path).name}: {exc}")
            return None
        return self.window.show_kept(kept)

    def save_server_session(self, path: str | os.PathLike) -> Path | None:
        try:
            saved = self.window.server.save_session(path)
        except OSError as exc:
            self.show_message("Could not save session", f"Could not save {path}: {exc}")
            return None
        if saved is None:
            self.show_message("Nothing to save", "Connect to a vLLM server first (Controls ▸ vLLM server).")
        return saved

    def save_selected_trace(self, path: str | os.PathLike) -> Path | None:
        primary = self.window.store.primary()
        if primary is None:
            self.show_message("Nothing to save", "Select a run in the Runs table first.")
            return None
        try:
            return primary.trace.save(path)
        except OSError as exc:
            self.show_message("Could not save trace", f"Could not save {path}: {exc}")
            return None

    def export_runs_csv(self, path: str | os.PathLike) -> Path:
        """Every run in the Runs table, in table order, as kvviz.report's CSV."""
        store = self.window.store
        rows = [
            present.run_row(f"#{run_id}", store.runs[run_id].trace, store.status(run_id))
            for run_id in self.window.runs_table.run_ids()
        ]
        return report.write_csv(rows, path)

    def export_plots(self, folder: str | os.PathLike, formats: tuple[str, ...] = ("png", "svg")) -> list[Path]:
        """Each plot of the view on screen (local or server) as <name>.png and <name>.svg in folder."""
        import pyqtgraph.exporters as exporters

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for panel in self.window.visible_plots():
            name = _snake(type(panel).__name__)
            item = panel.plot
            if "png" in formats:
                exporter = exporters.ImageExporter(item)
                width = max(2, int(item.sceneBoundingRect().width()))
                exporter.parameters()["width"] = width
                path = folder / f"{name}.png"
                exporter.export(str(path))
                written.append(path)
            if "svg" in formats:
                path = folder / f"{name}.svg"
                try:
                    exporters.SVGExporter(item).export(str(path))
                except (ValueError, IndexError):  # pyqtgraph's SVG clean-up trips on some Qt 6 paths
                    _render_svg(panel, path)
                written.append(path)
        return written

    def save_window_png(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        if not self.window.grab().save(str(path)):
            raise OSError(f"could not write {path}")
        return path

    def show_message(self, title: str, text: str) -> None:
        """A window-modal message that does not block the caller (so scripts and tests go on)."""
        self.last_message = text
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self.window)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        self.message_box = box

    # -- dialogs ------------------------------------------------------------------------------------

    def _ask_open(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open trace or server session", "", TRACE_FILTER)
        if path:
            self.open_trace(path)

    def _ask_save(self) -> None:
        primary = self.window.store.primary()
        if primary is None:
            self.show_message("Nothing to save", "Select a run in the Runs table first.")
            return
        path, _ = QFileDialog.getSaveFileName(
            self.window, "Save trace", f"run-{primary.run_id}.kvviz.json", "kvviz traces (*.json)"
        )
        if path:
            self.save_selected_trace(path)

    def _ask_session(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self.window, "Save server session", "server.kvviz-attach.json", "kvviz sessions (*.json)"
        )
        if path:
            self.save_server_session(path)

    def _ask_csv(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self.window, "Export runs table", "runs.csv", "CSV (*.csv)")
        if path:
            self._guard(self.export_runs_csv, path)

    def _ask_plots(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.window, "Export plots to folder")
        if folder:
            self._guard(self.export_plots, folder)

    def _ask_window(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self.window, "Save window", "kvviz-window.png", "PNG (*.png)")
        if path:
            self._guard(self.save_window_png, path)

    def _guard(self, function, path) -> None:
        try:
            function(path)
        except OSError as exc:
            self.show_message("Could not write", f"Could not write {path}: {exc}")

    # -- drag and drop ------------------------------------------------------------------------------

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt override
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove):
            if _trace_paths(event.mimeData()):
                event.acceptProposedAction()
                return True
        elif kind == QEvent.Type.Drop:
            paths = _trace_paths(event.mimeData())
            if paths:
                for path in paths:
                    self.open_trace(path)
                event.acceptProposedAction()
                return True
        return False


def _render_svg(widget, path: Path) -> None:
    """Vector SVG of a widget through Qt's own SVG generator."""
    from PySide6.QtCore import QPoint, QRect, QSize
    from PySide6.QtGui import QPainter
    from PySide6.QtSvg import QSvgGenerator

    generator = QSvgGenerator()
    generator.setFileName(str(path))
    generator.setSize(QSize(widget.width(), widget.height()))
    generator.setViewBox(QRect(0, 0, widget.width(), widget.height()))
    generator.setTitle(type(widget).__name__)
    painter = QPainter(generator)
    try:
        widget.render(painter, QPoint(0, 0))
    finally:
        painter.end()


def _trace_paths(mime) -> list[str]:
    if mime is None or not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile().lower().endswith(".json")]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _file_menu(window: QMainWindow) -> QMenu:
    for action in window.menuBar().actions():
        menu = action.menu()
        if menu is not None and action.text().replace("&", "") == "File":
            return menu
    return window.menuBar().addMenu("&File")


def install_file_actions(window: QMainWindow) -> FileActions:
    """Add Open/Save/Export entries to the File menu and drag and drop of trace files."""
    actions = FileActions(window)
    window.file_actions = actions
    menu = _file_menu(window)
    before = next((a for a in menu.actions() if a.text().replace("&", "") == "Quit"), None)
    entries = [
        ("open", "&Open trace or session…", QKeySequence.StandardKey.Open, actions._ask_open),
        ("save", "&Save selected run as trace…", QKeySequence.StandardKey.Save, actions._ask_save),
        ("session", "Save se&rver session…", None, actions._ask_session),
        ("csv", "Export runs table as &CSV…", None, actions._ask_csv),
        ("plots", "Export &plots as PNG/SVG…", None, actions._ask_plots),
        ("window", "Save &window as PNG…", None, actions._ask_window),
    ]
    for key, text, shortcut, slot in entries:
        action = QAction(text, window)
        if shortcut is not None:
            action.setShortcut(shortcut)
        action.triggered.connect(lambda *_, s=slot: s())
        menu.insertAction(before, action) if before is not None else menu.addAction(action)
        actions.actions[key] = action
    if before is not None:
        menu.insertSeparator(before)
    window.setAcceptDrops(True)
    window.installEventFilter(actions)
    from kvviz.qt.recorder import install_recorder

    install_recorder(window)
    return actions
