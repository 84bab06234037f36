"""The window's link to a vLLM server: connect, poll /metrics, kvviz's own request and a bounded load.

Every network call runs off the GUI thread (the poller's thread, or one thread per action); results
reach the window only through this object's signals, which Qt queues because the object lives on
the GUI thread. What was collected stays in `session()`: a failed request, a server restart or a
disconnect loses none of it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from PySide6.QtCore import QObject, Signal

from kvviz.attach.client import RequestRecord, count_prompt_tokens, first_model, stream_completion
from kvviz.attach.load import run_load
from kvviz.attach.poller import Poller, base_url, scrape
from kvviz.attach.request_trace import request_trace
from kvviz.attach.session import Session, predict


def prediction_folder(model: str | None, chosen: str) -> Path | None:
    """Where to read the served model's config: the folder the user chose, else the model id if it is one."""
    for candidate in (chosen.strip(), model or ""):
        if candidate and (Path(candidate).expanduser() / "config.json").is_file():
            return Path(candidate).expanduser()
    return None


class ServerConnection(QObject):
    sigConnected = Signal(object)  # Session: url, model, cache, prediction
    sigConnectFailed = Signal(str, str)  # url, message
    sigPrediction = Signal(object)  # kvviz's predicted KV bytes per token next to the server's (after sigConnected)
    sigPoint = Signal(object, object)  # Snapshot, Point (None for a failed scrape)
    sigNotice = Signal(str, bool)  # message, is_error: restarts, old metric names, failures, recoveries
    sigRequestStarted = Signal(int, object)  # request key, empty Trace
    sigToken = Signal(int, object)  # request key, TokenTiming
    sigRequestDone = Signal(int, object)  # request key, RequestRecord
    sigLoadDone = Signal(object)  # the load's summary dict

    def __init__(self, parent=None):
        super().__init__(parent)
        self.url: str | None = None
        self.poller: Poller | None = None
        self._session: Session | None = None
        self._requests: list[RequestRecord] = []
        self._notes_seen = (0, 0)  # events, errors already told
        self._next_key = 1
        self._lock = threading.Lock()
        self._load_cancel: threading.Event | None = None
        self.load_running = False
        self._closed = False
        self._detached = True
        self.engine_ready = threading.Event()  # set by the window once its worker has imported the engine

    @property
    def connected(self) -> bool:
        """Attached and polling (from just before sigConnected until disconnect)."""
        return self.poller is not None and not self._detached

    # -- connecting ---------------------------------------------------------------------------------

    def connect_to(self, url: str, interval: float, model_dir: str = "", dtype: str = "auto") -> None:
        """Check the server in a thread; sigConnected or sigConnectFailed follows."""
        self.disconnect()
        url = base_url(url)
        threading.Thread(
            target=self._connect, args=(url, interval, model_dir, dtype), name="kvviz-connect", daemon=True
        ).start()

    def _connect(self, url: str, interval: float, model_dir: str, dtype: str) -> None:
        try:
            with httpx.Client(timeout=10.0, trust_env=False) as client:
                first = scrape(client, url)
                if not first.ok:
                    raise RuntimeError(first.error)
                model = first_model(client, url)
        except RuntimeError as exc:
            self._send(self.sigConnectFailed, url, str(exc))
            return
        session = Session(url=url, model=model, interval=interval, cache=dict(first.cache))
        poller = Poller(url, interval=interval)
        poller.callback = lambda snap, point: self._on_scrape(poller, snap, point)
        with self._lock:
            self.url, self.poller, self._session, self._requests = url, poller, session, []
            self._notes_seen = (0, 0)
            self._detached = False
        self._send(self.sigConnected, session)  # before the first point: queued signals keep their order
        poller.start()
        self._predict(session, prediction_folder(model, model_dir), dtype)

    def _predict(self, session: Session, folder: Path | None, dtype: str) -> None:
        """kvviz's KV bytes per token for the served model, once polling runs (it may wait for the engine)."""
        # The prediction imports transformers, whose lazy module is not safe to import from two threads at
        # once: wait until the window's worker has finished importing the engine.
        if folder is None or not self.engine_ready.wait(120):
            return
        try:
            session.prediction = predict(folder, session.cache, dtype)
        except (RuntimeError, ValueError, ImportError) as exc:
            self._send(self.sigNotice, f"no KV prediction: {exc}", True)
            return
        if session is self._session:  # not a connection the user has left meanwhile
            self._send(self.sigPrediction, session.prediction)

    def _on_scrape(self, poller: Poller, snap, point) -> None:  # on the poller's thread
        if poller is not self.poller:  # a scrape of the previous server, finishing after a reconnect
            return
        events_seen, errors_seen = self._notes_seen
        events, errors = list(poller.events), list(poller.errors)
        self._notes_seen = (len(events), len(errors))
        for _, message in events[events_seen:]:
            self._send(self.sigNotice, message, False)
        for _, message in errors[errors_seen:]:
            self._send(self.sigNotice, message, True)
        self._send(self.sigPoint, snap, point)

    def disconnect(self) -> None:
        """Stop polling and the load; what was collected stays in session()."""
        if self._load_cancel is not None:
            self._load_cancel.set()
        self._detached = True
        if self.poller is not None:
            self.poller.cancel()
            if self._session is not None and self._session.finished is None:
                self._session.finished = time.time()

    def _send(self, signal, *args) -> None:
        """Emit from a worker thread, unless the window has closed (its objects may be gone)."""
        if not self._closed:
            signal.emit(*args)

    def shutdown(self, timeout: float = 1.0) -> None:
        self._closed = True
        self.disconnect()
        if self.poller is not None:
            self.poller.join(timeout)

    # -- kvviz's own request and the load ----------------------------------------------------------------

    def send_prompt(self, prompt: str, max_tokens: int, temperature: float = 0.0) -> int | None:
        """Stream one timed request; returns its key (sigRequestStarted, sigToken..., sigRequestDone follow)."""
        if self._session is None or not self.connected:
            return None
        key = self._next_key
        self._next_key += 1
        args = (key, self._session.url, self._session.model, prompt, max_tokens, temperature)
        threading.Thread(target=self._stream, args=args, name="kvviz-own-request", daemon=True).start()
        return key

    def _stream(self, key: int, url: str, model: str, prompt: str, max_tokens: int, temperature: float) -> None:
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            prompt_tokens = count_prompt_tokens(client, url, model, prompt)
            self._send(self.sigRequestStarted, key, request_trace(url, model, prompt, max_tokens, prompt_tokens))
            record = stream_completion(
                client,
                url,
                model,
                prompt,
                max_tokens=max_tokens,
                temperature=temperature,
                on_token=lambda timing: self._send(self.sigToken, key, timing),
            )
        record.prompt_tokens = record.prompt_tokens or prompt_tokens
        with self._lock:
            self._requests.append(record)
        self._send(self.sigRequestDone, key, record)

    def start_load(
        self,
        requests: int,
        concurrency: int,
        duration: float,
        shared_prefix: str,
        max_tokens: int,
        ignore_eos: bool = False,
    ) -> bool:
        """N requests at concurrency C within S seconds (validated by the panel); sigLoadDone at the end."""
        if self._session is None or not self.connected or self.load_running:
            return False
        self.load_running = True
        self._load_cancel = threading.Event()
        args = (self._session.url, self._session.model, requests, concurrency, duration, shared_prefix)
        threading.Thread(
            target=self._load, args=(*args, max_tokens, ignore_eos, self._load_cancel), name="kvviz-load", daemon=True
        ).start()
        return True

    def _load(self, url, model, requests, concurrency, duration, prefix, max_tokens, ignore_eos, cancel) -> None:
        result = run_load(
            url,
            model,
            requests,
            concurrency,
            duration,
            prefix,
            max_tokens=max_tokens,
            cancel=cancel,
            ignore_eos=ignore_eos,
        )
        with self._lock:
            self._requests.extend(result.records)
            if self._session is not None:
                self._session.load = result.summary()
        self.load_running = False
        self._send(self.sigLoadDone, result.summary())

    def stop_load(self) -> None:
        if self._load_cancel is not None:
            self._load_cancel.set()

    # -- what was collected ------------------------------------------------------------------------------

    def session(self) -> Session | None:
        """Everything collected so far, as a Session ready to save (a copy; collection goes on)."""
        if self._session is None:
            return None
        with self._lock:
            base = self._session
            requests = list(self._requests)
        poller = self.poller
        return Session(
            url=base.url,
            model=base.model,
            started=base.started,
            finished=base.finished or time.time(),
            interval=base.interval,
            cache=dict(base.cache),
            prediction=base.prediction,
            snapshots=list(poller.snapshots) if poller else [],
            requests=requests,
            load=base.load,
            errors=list(base.errors) + [list(e) for e in (poller.errors if poller else [])],
            events=[list(e) for e in (poller.events if poller else [])],
        )
