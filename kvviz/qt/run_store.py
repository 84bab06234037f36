"""The run store: every run the window knows, in one Qt model object that the views subscribe to.

It owns the runs (a `RunSeries` each: its producer's `Trace` and the buffers drawn from it), their
ids (allocated here and nowhere else), their statuses, the run the local engine is generating, and
the selection of runs the plots overlay. Producers add runs and report new records through its
public methods: the local runs (kvviz.qt.local.runs), kvviz's own requests to a server
(kvviz.qt.server.mode), files opened (kvviz.qt.file_actions) and the GUI bench. Views take the
store in `__init__` and follow its signals (napari's habit); the window's redraw reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from PySide6.QtCore import QObject, Signal

from kvviz.files.trace import Trace
from kvviz.present import FAILED, FINAL_STATUSES
from kvviz.qt.series import RunSeries


class RunStore(QObject):
    sigRunAdded = Signal(int)  # a new run's id
    sigRunsChanged = Signal()  # records arrived or a status changed: a redraw is due
    sigRunEnded = Signal(int, str)  # run id, final status; its last records are drawn
    sigRunRemoved = Signal(int)  # a run withdrawn (refused before it started): it leaves every view
    sigShownChanged = Signal(list)  # the ids of the runs the plots overlay
    sigTaking = Signal()  # the redraw takes the records that arrived, now: producers may announce the next ones

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._runs: dict[int, RunSeries] = {}
        self._status: dict[int, str] = {}
        self._next_id = 1
        self._generating: int | None = None
        self._shown: list[int] = []
        self._arrived: set[int] = set()  # runs whose traces have records not drawn yet
        self._changed: set[int] = set()  # runs whose row shows old numbers or an old status

    # -- reading ------------------------------------------------------------------------------------

    @property
    def runs(self) -> Mapping[int, RunSeries]:
        return MappingProxyType(self._runs)

    def status(self, run_id: int) -> str:
        """starting, running (local engine), streaming (a server), or one of FINAL_STATUSES."""
        return self._status[run_id]

    @property
    def generating(self) -> int | None:
        """The run the local engine is generating now, or None."""
        return self._generating

    @property
    def shown(self) -> list[int]:
        return list(self._shown)

    def shown_series(self) -> list[RunSeries]:
        return [self._runs[r] for r in self._shown]

    def primary(self) -> RunSeries | None:
        """The run the single-run views (bars, cache map, tokens) show: the one generating, if shown, else the
        last one shown."""
        if self._generating in self._shown:
            return self._runs[self._generating]
        return self._runs[self._shown[-1]] if self._shown else None

    # -- adding and filling (producers) -------------------------------------------------------------

    def add(self, trace: Trace, status: str, generating: bool = False, overlay: bool = False) -> int:
        """A new run with its producer's trace; returns its id. A trace with a final status is complete
        (a file). `generating`: the local engine's run; `overlay`: shown next to the runs shown now,
        not instead of them."""
        run_id = self._next_id
        self._next_id += 1
        if status in FINAL_STATUSES:
            series = RunSeries.from_trace(run_id, trace)
        else:
            series = RunSeries(run_id, trace)
            self._arrived.add(run_id)
        self._runs[run_id] = series
        self._status[run_id] = status
        if generating:
            self._generating = run_id
        self.sigRunAdded.emit(run_id)
        self.show([*self._shown, run_id] if overlay else [run_id])
        return run_id

    def attach(self, run_id: int, trace: Trace) -> None:
        """The producer's own trace for a run added with its request's header (before any record)."""
        self._runs[run_id].attach(trace)
        self._arrived.add(run_id)
        self._mark(run_id)

    def set_status(self, run_id: int, status: str) -> None:
        self._status[run_id] = status
        self._mark(run_id)

    def records_arrived(self, run_id: int) -> None:
        """The producer appended records to the run's trace; they are drawn at the next redraw."""
        series = self._runs.get(run_id)
        if series is None or series.finished:
            return  # a stale signal of a run that has ended
        self._arrived.add(run_id)
        self.sigRunsChanged.emit()

    def end(self, run_id: int, status: str, error: str | None = None) -> None:
        """The producer is done: its last records are drawn, the status is final."""
        series = self._runs.get(run_id)
        if series is None:
            return
        if status == FAILED and error and not series.trace.error:
            series.trace.error = error
        series.sync()
        self._arrived.discard(run_id)
        series.finished = True
        if self._generating == run_id:
            self._generating = None
        self.set_status(run_id, status)
        self.sigRunEnded.emit(run_id, status)

    def withdraw(self, run_id: int, shown_before: list[int]) -> None:
        """A run its producer refused before it started: it leaves the store (its number goes to the next run)
        and the runs shown before it was asked for are shown again. It ends as FAILED for whoever waits on it."""
        series = self._runs.pop(run_id, None)
        if series is None:
            return
        del self._status[run_id]
        self._arrived.discard(run_id)
        self._changed.discard(run_id)
        series.finished = True
        if self._generating == run_id:
            self._generating = None
        if run_id == self._next_id - 1:
            self._next_id = run_id
        self._shown = [r for r in self._shown if r != run_id]  # no view may look it up from here on
        self.sigRunRemoved.emit(run_id)
        self.show([r for r in shown_before if r in self._runs])
        self.sigRunEnded.emit(run_id, FAILED)

    # -- the selection ------------------------------------------------------------------------------

    def show(self, run_ids: list[int]) -> None:
        """Overlay these runs in the plots (the Runs table's selection)."""
        shown = [r for r in run_ids if r in self._runs]
        if shown != self._shown:
            self._shown = shown
            self.sigShownChanged.emit(list(shown))

    # -- drawing ------------------------------------------------------------------------------------

    def sync(self) -> None:
        """Move every arrived record into its run's buffers (the redraw calls this first)."""
        arrived, self._arrived = self._arrived, set()
        if arrived:
            self.sigTaking.emit()  # before the traces are read: a record appended while they are is announced
        for run_id in arrived:
            if self._runs[run_id].sync():
                self._changed.add(run_id)

    def take_changed(self) -> set[int]:
        """The runs whose numbers or status changed since the last call (rows to refresh)."""
        changed, self._changed = self._changed, set()
        return changed

    def _mark(self, run_id: int) -> None:
        self._changed.add(run_id)
        self.sigRunsChanged.emit()
