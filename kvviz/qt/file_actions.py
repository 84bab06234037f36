"""The File menu: open any kept file (also by drag and drop), open a prompt file, save the selected run as a trace,
each mode's own entries (save an evaluation, a chat, a sweep, a server session: `Mode.file_entries`), export the
Runs table, the plots on screen and the window.

Every action is a thin dialog in front of a function that takes an explicit path (`open_trace`, `open_prompt_file`,
`save_selected_trace`, `export_runs_csv`, `export_plots`, `save_window_png`, and the modes' `save`), so tests and
scripts call the same code the menu does. The dialogs (these, the modes', the model chooser's and the recording's)
start in the folder last used for their kind of file (kvviz.qt.file_dialogs). Every save is confirmed in the status
bar with the file's full path. `install(modes)` adds the menu entries and drag and drop of kept files onto the window.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QMainWindow,
    QMenu,
    QMessageBox,
    QPushButton,
    QSpinBox,
)

from kvviz import present
from kvviz.files import documents, report
from kvviz.files.formats import read_kept
from kvviz.files.journal import SUFFIX as JOURNAL_SUFFIX
from kvviz.files.jsonfile import KeptFileError
from kvviz.qt import wheel_guard
from kvviz.qt.file_dialogs import FileDialogs
from kvviz.qt.mode_api import FileEntry
from kvviz.qt.plots.base import DEFAULT_EXPORT_WIDTH
from kvviz.qt.plots.titles import short_forms
from kvviz.qt.recorder import install_recorder

TRACE_FILTER = ("kvviz traces, evaluations, sweeps and server sessions (*.json *.journal);;"
                "Journals a killed run, evaluation, chat or sweep left (*.journal);;All files (*)")
EXPORT_WIDTHS = (320, 7680)  # px: the widths an export may have


class FileActions(QObject):
    """Kept alive on the window as `window.file_actions`: its file dialogs and messages from the start (the modes
    use them), its menu entries once the modes are made (`install`); also the drag-and-drop event filter."""

    def __init__(self, window: QMainWindow):
        super().__init__(window)
        self.window = window
        self.last_message = ""
        self.message_box: QMessageBox | None = None
        self.actions: dict[str, QAction] = {}
        self.dialog: QDialog | None = None  # the export dialog while it is open
        self.dialogs = FileDialogs(window.settings, window)  # each starts in the last folder of its kind

    # -- the functions behind the actions ---------------------------------------------------------

    def open_trace(self, path: str | os.PathLike):
        """Open any kept file into the mode that shows its kind (a trace into the Runs table, an evaluation into the
        Evaluate tab, ...); what that mode's `open` returns (a trace's run id). On a bad file shows a message,
        changes nothing, returns None."""
        try:
            kept = read_kept(path)
        except KeptFileError as exc:
            self.show_message("Could not open", f"Could not open {Path(path).name}: {exc}")
            return None
        shown = self.window.show_kept(kept)
        if str(path).endswith(JOURNAL_SUFFIX) and shown is not None:
            if getattr(kept, "error", None):  # why it is partial
                self.window.statusBar().showMessage(kept.error, 30_000)
            self.window.mode.offer_to_continue(kept, Path(path))
        return shown

    def open_prompt_file(self, path: str | os.PathLike) -> str | None:
        """Put a UTF-8 .txt or .md file's text in the prompt; returns it, or shows why not and returns None."""
        try:
            text = documents.read_text(path)
        except documents.DocumentError as exc:
            self.show_message("Could not open prompt", str(exc))
            return None
        self.window.panels.prompt_panel.set_text(text)
        self.window.statusBar().showMessage(f"prompt from {Path(path).resolve()} ({len(text):,} characters)", 20_000)
        return text

    def save_selected_trace(self, path: str | os.PathLike) -> Path | None:
        primary = self.window.store.primary()
        if primary is None:
            self.show_message("Nothing to save", "Select a run in the Runs table first.")
            return None
        try:
            saved = primary.trace.save(path)
        except OSError as exc:
            self.show_message("Could not save trace", f"Could not save {path}: {exc}")
            return None
        self.window.say_saved(saved, f"run #{primary.run_id}, {len(primary.trace.steps)} steps")
        return saved

    def export_runs_csv(self, path: str | os.PathLike) -> Path:
        """Every run in the Runs table, in table order, as kvviz.files.report's CSV."""
        store = self.window.store
        rows = [
            present.run_row(f"#{run_id}", store.runs[run_id].trace, store.status(run_id))
            for run_id in self.window.runs_table.run_ids()
        ]
        written = report.write_csv(rows, path)
        self.window.say_saved(written, f"{len(rows)} runs")
        return written

    def export_plots(
        self, folder: str | os.PathLike, formats: tuple[str, ...] = ("png", "svg"), width: int = DEFAULT_EXPORT_WIDTH
    ) -> list[Path]:
        """Each plot of the view on screen (local, evaluation or server) with its title, axes and legend, as
        <name>.png `width` pixels wide and <name>.svg in folder: the plots of the map's tab behind too. A plot with
        nothing to draw (the fidelity plot when no run has a reference, the attention view of a run recorded
        without it) is left out, and the status bar names it; with nothing to draw at all, nothing is written and a
        message says so."""
        if not EXPORT_WIDTHS[0] <= width <= EXPORT_WIDTHS[1]:
            raise ValueError(f"an export is {EXPORT_WIDTHS[0]} to {EXPORT_WIDTHS[1]} pixels wide, not {width}")
        plots = self.window.mode.plots()
        panels = [p for p in plots if p.has_data()]
        if not panels:
            self.show_message("Nothing to export", "The plots are empty: run a prompt or open a trace first.")
            return []
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for panel in panels:
            name = _snake(type(panel).__name__)
            if "png" in formats:
                path = folder / f"{name}.png"
                if not panel.export_image(width).save(str(path)):
                    raise OSError(f"could not write {path}")
                written.append(path)
            if "svg" in formats:
                written.append(panel.export_svg(folder / f"{name}.svg", width))
        empty = [short_forms(p.title_label.title)[-1] for p in plots if p not in panels]
        self.window.say_saved(folder, f"{len(written)} files, {width} px wide"
                              + (f"; nothing to draw, left out: {', '.join(empty)}" if empty else ""))
        return written

    def save_window_png(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        image = self.window.grab()
        if not image.save(str(path)):
            raise OSError(f"could not write {path}")
        self.window.say_saved(path, f"{image.width()}x{image.height()}")
        return path

    def show_message(self, title: str, text: str) -> None:
        """A window-modal message that does not block the caller (so scripts and tests go on)."""
        self.last_message = text
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self.window)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        self.message_box = box

    def ask(self, title: str, text: str, yes: str, on_yes) -> QMessageBox:
        """A window-modal question that does not block the caller: `yes` (its button) calls `on_yes`; or Cancel."""
        box = QMessageBox(QMessageBox.Icon.Question, title, text, QMessageBox.StandardButton.Cancel, self.window)
        box.addButton(yes, QMessageBox.ButtonRole.AcceptRole).clicked.connect(on_yes)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        return box

    def install(self, modes) -> None:
        """The File menu's entries (the shell's, with each mode's own after Save trace), drag and drop of kept files
        onto the window, the model chooser's file dialogs and the Record menu."""
        window = self.window
        menu = _file_menu(window)
        before = next((a for a in menu.actions() if a.text().replace("&", "") == "Quit"), None)
        entries = [
            FileEntry("open", "&Open trace or session…", self._ask_open, QKeySequence.StandardKey.Open),
            FileEntry("prompt", "Open &prompt file…", self.ask_prompt_file, QKeySequence("Ctrl+Shift+O")),
            FileEntry("save", "&Save selected run as trace…", self._ask_save, QKeySequence.StandardKey.Save),
            *(entry for mode in modes for entry in mode.file_entries),
            FileEntry("csv", "Export runs table as &CSV…", self._ask_csv),
            FileEntry("plots", "Export &plots as PNG/SVG…", self._ask_plots),
            FileEntry("window", "Save &window as PNG…", self._ask_window),
        ]
        for entry in entries:
            action = QAction(entry.text, window)
            if entry.shortcut is not None:
                action.setShortcut(entry.shortcut)
            action.triggered.connect(lambda *_, ask=entry.ask: ask())
            menu.insertAction(before, action) if before is not None else menu.addAction(action)
            self.actions[entry.key] = action
        if before is not None:
            menu.insertSeparator(before)
        window.setAcceptDrops(True)
        window.installEventFilter(self)
        window.panels.model_panel.sigBrowseRequested.connect(self.ask_model)
        window.panels.prompt_panel.sigOpenRequested.connect(self.ask_prompt_file)
        install_recorder(window, self.dialogs)

    # -- dialogs ------------------------------------------------------------------------------------

    def _ask_open(self) -> None:
        path = self.dialogs.open_file("kept", "Open trace, conversation, evaluation or server session", TRACE_FILTER)
        if path:
            self.open_trace(path)

    def _ask_save(self) -> None:
        primary = self.window.store.primary()
        if primary is None:
            self.show_message("Nothing to save", "Select a run in the Runs table first.")
            return
        path = self.dialogs.save_file("kept", "Save trace", f"run-{primary.run_id}.kvviz.json", "kvviz traces (*.json)")
        if path:
            self.save_selected_trace(path)

    def _ask_csv(self) -> None:
        path = self.dialogs.save_file("tables", "Export runs table", "runs.csv", "CSV (*.csv)")
        if path:
            self._guard(self.export_runs_csv, path)

    def ask_prompt_file(self) -> None:
        path = self.dialogs.open_file("prompts", "Open prompt file", "Text and Markdown (*.txt *.md);;All files (*)")
        if path:
            self.open_prompt_file(path)

    def ask_model(self, folder: bool) -> None:
        """The model chooser's Folder… (True) or GGUF… (False): the model chosen is loaded."""
        path = (self.dialogs.folder("models", "Model folder") if folder else
                self.dialogs.open_file("models", "GGUF model file", "GGUF files (*.gguf);;All files (*)"))
        if path:
            self.window.panels.model_panel.choose(path)

    def _ask_plots(self) -> None:
        settings = self.window.settings
        folder = str(settings.value("export/folder", "") or Path.home() / "kvviz-plots")
        dialog = ExportDialog(self.window, folder, int(settings.value("export/width", DEFAULT_EXPORT_WIDTH)))
        dialog.accepted.connect(lambda: self._export_from(dialog))
        dialog.open()
        self.dialog = dialog

    def _export_from(self, dialog: ExportDialog) -> None:
        folder, formats, width = dialog.choice()
        self.window.settings.setValue("export/folder", folder)
        self.window.settings.setValue("export/width", width)
        self._guard(lambda f: self.export_plots(f, formats, width), folder)

    def _ask_window(self) -> None:
        path = self.dialogs.save_file("images", "Save window", "kvviz-window.png", "PNG (*.png)")
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


class ExportDialog(QDialog):
    """Where the plots go, in which formats, and how wide the images are."""

    def __init__(self, parent, folder: str, width: int):
        super().__init__(parent)
        self.setWindowTitle("Export plots")
        self.folder = QLineEdit(folder)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.width_box = QSpinBox()
        self.width_box.setRange(*EXPORT_WIDTHS)
        self.width_box.setSingleStep(160)
        self.width_box.setSuffix(" px")
        self.width_box.setValue(max(EXPORT_WIDTHS[0], min(EXPORT_WIDTHS[1], width)))
        self.width_box.setToolTip("Width of each image; the height follows the plot's shape")
        self.png = QCheckBox("PNG")
        self.png.setChecked(True)
        self.svg = QCheckBox("SVG (vector)")
        self.svg.setChecked(True)
        row = QHBoxLayout()
        row.addWidget(self.folder, 1)
        row.addWidget(browse)
        kinds = QHBoxLayout()
        kinds.addWidget(self.png)
        kinds.addWidget(self.svg)
        kinds.addStretch(1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self._accept)
        buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("folder", row)
        form.addRow("width", self.width_box)
        form.addRow("formats", kinds)
        form.addRow(buttons)
        self.resize(520, self.sizeHint().height())
        wheel_guard.guard(self)

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Export plots to folder", self.folder.text())
        if folder:
            self.folder.setText(folder)

    def _accept(self) -> None:
        if self.folder.text().strip() and (self.png.isChecked() or self.svg.isChecked()):
            self.accept()

    def choice(self) -> tuple[str, tuple[str, ...], int]:
        formats = tuple(k for k, box in (("png", self.png), ("svg", self.svg)) if box.isChecked())
        return self.folder.text().strip(), formats, self.width_box.value()


def _trace_paths(mime) -> list[str]:
    if mime is None or not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls()
            if u.isLocalFile() and u.toLocalFile().lower().endswith((".json", JOURNAL_SUFFIX))]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _file_menu(window: QMainWindow) -> QMenu:
    for action in window.menuBar().actions():
        menu = action.menu()
        if menu is not None and action.text().replace("&", "") == "File":
            return menu
    return window.menuBar().addMenu("&File")


