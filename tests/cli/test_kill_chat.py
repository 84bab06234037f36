"""kill -9 at random moments of a chat: `kvviz chat --trace FILE` killed in the middle of any journal write keeps
every turn that finished before, and its journal reads (`kvviz trace`, the window's File ▸ Open) as the conversation
so far. The kills are `test_kill`'s: a forked child, the tiny model loaded; KVVIZ_KILL_SEED replays a failure."""

import random

from kvviz.files.formats import read_kept
from tests.cli.test_kill import KILLED, SEED, in_child, preloaded, readable  # noqa: F401 - preloaded: a fixture
from tests.commands import kvviz

TURNS = 5


def turns(trace) -> list[tuple]:
    """What each turn said and kept: its messages, its tokens and its cache, less its timings."""
    return [(t.index, t.chat, t.start, t.end, t.new_tokens, t.cache_bytes, t.evicted) for t in trace.turns], \
        [(s.turn, s.position, s.token) for s in trace.steps], [(m.role, m.content, m.turn) for m in trace.messages]


def test_a_chat_killed_at_any_turn_keeps_every_turn_finished_before(tmp_path, preloaded):  # noqa: F811
    script = tmp_path / "chat.txt"
    script.write_text("Hello there.\nWhat is a cache?\n/new\nTell me a story.\nAnd then?\nThe end.\n")
    chat = ["chat", "--model", "tiny", "--script", script, "--system", "Be brief.", "--max-new-tokens", "5",
            "--ignore-eos", "--quiet"]
    assert in_child([*chat, "--trace", tmp_path / "whole.json"]) == 0
    whole = read_kept(tmp_path / "whole.json")
    assert len(whole.turns) == TURNS and not (tmp_path / "whole.json.journal").exists()
    print(f"kill seed {SEED}")
    rng = random.Random(SEED)
    for kill_at in sorted({2, *rng.sample(range(1, TURNS + 1), 2)}):  # a journal write per turn
        folder = tmp_path / f"killed-{kill_at}"
        folder.mkdir()
        assert in_child([*chat, "--trace", folder / "chat.json"], kill_at, rng.random()) == KILLED, SEED
        files = readable(folder)
        if kill_at == 1:  # killed while the journal was created: nothing half-written
            assert files == {}, SEED
            continue
        assert list(files) == ["chat.json.journal"], SEED
        kept = files["chat.json.journal"]
        done = kill_at - 1  # the turn whose line was cut is lost, no more
        expected = turns(whole)
        ours = turns(kept)
        assert ours[0] == expected[0][:done], SEED
        assert ours[1] == expected[1][: len(ours[1])] and len(ours[1]) == sum(t[4] for t in expected[0][:done]), SEED
        assert kept.cancelled and kept.error.startswith(f"stopped after {done} turn"), SEED
    shown = kvviz("trace", folder / "chat.json.journal")
    assert shown.returncode == 0 and f"{done} turns" in shown.stdout and "(cancelled)" in shown.stdout, shown.stdout


def test_a_damaged_chat_journal_is_refused_by_name(tmp_path, preloaded):  # noqa: F811
    script = tmp_path / "chat.txt"
    script.write_text("Hello.\nAgain.\nOnce more.\n")
    chat = ["chat", "--model", "tiny", "--script", script, "--max-new-tokens", "3", "--ignore-eos", "--quiet"]
    assert in_child([*chat, "--trace", tmp_path / "chat.json"], kill_at=3) == KILLED
    path = tmp_path / "chat.json.journal"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[2])  # the second turn's line without the first's
    ran = kvviz("trace", path)
    assert ran.returncode != 0 and "line 2 of the journal is not the turns that follow" in ran.stderr, ran.stderr
    path.write_text(lines[0].replace('"max_new_tokens":3', '"max_new_tokens":"x"') + lines[1])
    ran = kvviz("trace", path)
    assert ran.returncode != 0 and "max_new_tokens" in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
