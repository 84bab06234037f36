"""The folder of unsaved work keeps what its rule says (Help ▸ About says it) and cleans the rest when a window starts:
the newest files that windows which ended left, for a while; never a running window's journals."""

import os
import time

from kvviz.files.jsonfile import process_alive
from kvviz.qt import unsaved


def test_the_newest_left_stay_for_a_while_and_the_rest_go(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_UNSAVED_DIR", str(tmp_path))
    folder = unsaved.folder()
    folder.mkdir()
    dead = next(pid for pid in range(2**22 - 1, 2**21, -1) if not process_alive(pid))
    now = time.time()
    left = []
    for age in range(unsaved.KEEP_NEWEST + 3):  # an hour apart, the newest first
        path = folder / (f"eval-{dead}-{age}-1-dynamic.json.journal", f"sweep-{dead}-{age}.json.journal",
                         f"conversation-{age}.json")[age % 3]
        path.write_text("{}")
        os.utime(path, (now - 3600 * age, now - 3600 * age))
        left.append(path)
    stale = folder / f"chat-{dead}-1.json.journal"
    stale.write_text("{}")
    os.utime(stale, (now - 86400 * (unsaved.KEEP_DAYS + 1),) * 2)
    own = folder / f"run-{os.getpid()}-1.json.journal"  # a running window's, however old
    own.write_text("{}")
    os.utime(own, (0, 0))
    mine = folder / "notes.txt"  # not kvviz's
    mine.write_text("mine")

    removed = unsaved.clean(now)
    assert sorted(removed) == sorted([*left[unsaved.KEEP_NEWEST:], stale])
    assert all(path.exists() for path in left[: unsaved.KEEP_NEWEST]) and own.exists() and mine.exists()
    assert unsaved.clean(now) == []
    assert f"newest {unsaved.KEEP_NEWEST}" in unsaved.RULE and f"{unsaved.KEEP_DAYS} days" in unsaved.RULE
