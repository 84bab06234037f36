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
