"""Shared fixtures. Tests never reach the Hugging Face Hub."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
if os.environ.get("PYTEST_XDIST_WORKER"):  # a core per worker: torch's threads of two workers would wait on each other
    os.environ.setdefault("OMP_NUM_THREADS", "1")
if "KVVIZ_UNSAVED_DIR" not in os.environ:  # the windows of the suite journal their runs here, not in the user's folder
    import tempfile

    os.environ["KVVIZ_UNSAVED_DIR"] = tempfile.mkdtemp(prefix="kvviz-unsaved-")

import pytest  # noqa: E402

pytest_plugins = ("tests.watchdog",)


@pytest.fixture(scope="session")
def default_model():
    from kvviz.engine import models

    return models.load_model("default")


@pytest.fixture(scope="session")
def tiny_model():
    from kvviz.engine import models

    return models.load_model("tiny")


@pytest.fixture(scope="session")
def short_context_model(tiny_model, tmp_path_factory):
    """The tiny model saved as a folder that says its context is 256 positions: what a document longer than the
    context does, without reading tiny's 4,096."""
    import copy

    folder = tmp_path_factory.mktemp("short-context")
    model = copy.deepcopy(tiny_model.model)
    model.config.max_position_embeddings = 256
    model.save_pretrained(folder)
    tiny_model.tokenizer.save_pretrained(folder)
    return folder


# Threads of other libraries that live for the process and sleep: tqdm's monitor of progress bars, and the workers
# of unnamed executor pools (torch.compile's, idle between compiles). kvviz names every thread it starts "kvviz-...".
IDLE_LIBRARY_THREADS = ("tqdm_monitor", "ThreadPoolExecutor-")


@pytest.fixture(autouse=True)
def _threads_are_joined(request):
    """Every thread a test starts has ended when it ends: a thread left running takes a core from the tests
    after it (torch's thread pool then waits on it at every matrix product)."""
    import threading
    import time

    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 10.0
    while True:
        # Python's threads only: a QThread that ran Python shows as a _DummyThread, alive for ever (the window
        # fixture checks that its worker thread ended)
        left = [t for t in threading.enumerate() if t not in before and t.is_alive()
                and not isinstance(t, threading._DummyThread) and not t.name.startswith(IDLE_LIBRARY_THREADS)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"threads left running by the test: {[t.name for t in left]}"


@pytest.fixture(autouse=True)
def _garbage_collected_between_tests():
    """Once a window made its collector (kvviz.qt.collector), Python collects only when the collector's timer fires,
    inside a Qt event loop: a test that runs none (an engine test after a window's) has its garbage collected here,
    on this thread, as the timer would have."""
    yield
    import gc
    import sys

    collector = sys.modules.get("kvviz.qt.collector")
    if collector is not None and not gc.isenabled():
        collector.install().collect_due()


# -- the order the xdist workers take the modules in ---------------------------------------------------------------
# `make test` runs each module on one worker (--dist loadscope) and takes the modules in the order this hook leaves
# them (--no-loadscope-reorder). xdist's own order, most tests first, leaves for the end the modules of one or two
# slow tests (a benchmark, a subprocess) while the other worker has nothing left to do. Here the modules go longest
# first, by the seconds each took the last time it ran (kept in pytest's cache); a module not timed yet goes first,
# most tests first, which is the whole order on a fresh checkout.
SECONDS_KEY = "kvviz/module_seconds"


def _scope(nodeid: str) -> str:
    return nodeid.rsplit("::", 1)[0]  # as xdist's loadscope groups tests: a module, or a class of one


def pytest_collection_modifyitems(config, items):
    cache = getattr(config, "cache", None)
    if cache is None or not hasattr(config, "workerinput"):  # a run without workers keeps the files' order
        return
    timed = cache.get(SECONDS_KEY, {})
    count: dict[str, int] = {}
    for item in items:
        count[_scope(item.nodeid)] = count.get(_scope(item.nodeid), 0) + 1

    def longest_first(item) -> tuple:
        scope = _scope(item.nodeid)
        if scope not in timed:
            return (0, -count[scope])
        seconds, tests = timed[scope]
        return (1, -seconds * count[scope] / max(tests, 1))  # a run of some of its tests counts pro rata

    items.sort(key=longest_first)  # stable: a module's tests keep their order


class ModuleSeconds:
    """Adds up the seconds of each module's tests as the workers report them, and keeps them in the cache."""

    def __init__(self, cache):
        self.cache = cache
        self.seconds: dict[str, list] = {}

    def pytest_runtest_logreport(self, report):
        entry = self.seconds.setdefault(_scope(report.nodeid), [0.0, 0])
        entry[0] += report.duration
        entry[1] += report.when == "teardown"  # one per test run

    def pytest_sessionfinish(self):
        if self.seconds:
            self.cache.set(SECONDS_KEY, {**self.cache.get(SECONDS_KEY, {}), **self.seconds})


def pytest_configure(config):
    cache = getattr(config, "cache", None)
    if cache is not None and not hasattr(config, "workerinput"):  # the process that gathers every test's report
        config.pluginmanager.register(ModuleSeconds(cache), "kvviz-module-seconds")
