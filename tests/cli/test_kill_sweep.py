"""kill -9 at random moments of a sweep: `kvviz choose --out` killed in the middle of any journal write keeps every
configuration that finished before, leaves nothing unreadable, and `--resume` (killed again, then resumed) ends with
the table and CSV of an uninterrupted sweep. The kills are `test_kill`'s: a forked child, the tiny model loaded, that
kills itself in its k-th write to a journal; KVVIZ_KILL_SEED replays a failure."""

import csv
import json
import random

from kvviz.files import sweep
from kvviz.files.sweep_report import TIMED_COLUMNS
from tests.cli.test_kill import KILLED, SEED, in_child, preloaded, readable  # noqa: F401 - preloaded: a fixture
from tests.commands import kvviz

CHOOSE = ["choose", "--model", "tiny", "--tokens", "40", "--context", "512", "--budget", "1GiB", "--rows", "2",
          "--configs", "sliding:window=12,sink:sink_tokens=2:window=10,h2o:budget=12,tova:budget=12"]
WRITES = 5  # the journal's writes: one per configuration (dynamic; sliding and sinks alone, in chunks; a batch of two)


def table(folder) -> list[dict]:
    """sweep.csv, less its timings."""
    with (folder / "sweep.csv").open() as f:
        return [{k: v for k, v in row.items() if k not in TIMED_COLUMNS} for row in csv.DictReader(f)]


def test_a_sweep_killed_anywhere_and_resumed_ends_as_an_uninterrupted_one(tmp_path, preloaded):  # noqa: F811
    whole = tmp_path / "whole"
    assert in_child([*CHOOSE, "--out", whole], WRITES + 1) == 0  # WRITES counts them all (`test_kill`)
    assert in_child([*CHOOSE, "--out", tmp_path / "last"], WRITES) == KILLED
    expected = table(whole)
    print(f"kill seed {SEED}")
    rng = random.Random(SEED)
    for chain in range(2):
        folder = tmp_path / f"chain-{chain}"
        first = 3 if chain == 0 else rng.randint(1, WRITES)  # the first chain: after dynamic and the first batch
        assert in_child([*CHOOSE, "--out", folder], first, rng.random()) == KILLED, SEED
        partial = readable(folder)
        assert list(partial) in ([], ["sweep.json.journal"]), (partial, SEED)
        resume = ["--resume"] if partial else []  # killed while the journal was created: nothing to resume
        if partial:
            kept = partial["sweep.json.journal"]
            done = [c for c in kept.configurations if c.status == "finished"]
            assert len(done) == first - 1 and kept.cancelled == (first <= WRITES), SEED
            for config in kept.configurations:
                if config.status != "finished":
                    assert config.run.error.startswith(f"stopped after {first - 1} of 5 configurations"), SEED
        assert in_child([*CHOOSE, "--out", folder, *resume], rng.randint(1, WRITES), rng.random()) in (KILLED, 0), \
            SEED
        readable(folder)
        resume = ["--resume"] if (folder / "sweep.json.journal").exists() else []
        assert in_child([*CHOOSE, "--out", folder, *resume]) == 0, SEED
        assert not (folder / "sweep.json.journal").exists(), SEED
        assert table(folder) == expected, (first, SEED)


def test_resume_refuses_a_journal_of_another_question_naming_each_difference(tmp_path, preloaded):  # noqa: F811
    assert in_child([*CHOOSE, "--out", tmp_path], kill_at=3) == KILLED
    other = [*CHOOSE[:4], "30", "--context", "256", "--budget", "2GiB", "--rows", "2", "--configs", "sliding:window=12"]
    ran = kvviz(*other, "--out", tmp_path, "--resume")
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    for named in ("the text's tokens", "the target context (512 there, 256 here)", "the budget (1073741824 there, "
                  "2147483648 here)", "the configurations (dynamic, sliding (window=12), sink"):
        assert named in ran.stderr, (named, ran.stderr)
    assert "the tolerance" not in ran.stderr and "the rows" not in ran.stderr
    shown = kvviz("trace", tmp_path / "sweep.json.journal")
    assert shown.returncode == 0 and "stopped after 2 of 5 configurations" in shown.stdout, shown.stdout + shown.stderr
    assert len(sweep.read_journal(tmp_path / "sweep.json.journal").finished) == 2
    empty = kvviz(*CHOOSE, "--out", tmp_path / "empty", "--resume")
    assert empty.returncode == 2 and "holds no sweep journal to resume" in empty.stderr


def test_a_damaged_sweep_journal_is_refused_by_name(tmp_path, preloaded):  # noqa: F811
    assert in_child([*CHOOSE, "--out", tmp_path], kill_at=3) == KILLED
    path = tmp_path / "sweep.json.journal"
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace('"measured_rows":1', '"measured_rows":"x"')
    path.write_text("".join(lines))
    ran = kvviz(*CHOOSE, "--out", tmp_path, "--resume")
    assert ran.returncode == 2 and "measured_rows" in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    path.write_text(lines[0] + '{"configuration": 9, "elapsed_s": 1, "data": {}}\n' + lines[2])
    ran = kvviz("trace", path)
    assert ran.returncode != 0 and "line 2 of the journal is neither" in ran.stderr, ran.stderr


def test_a_sweep_killed_while_asking_keeps_the_answers_given_and_does_not_ask_again(tmp_path, preloaded):  # noqa: F811
    questions = tmp_path / "questions.jsonl"
    rows = [{"context": "The magic number is 4417. " * 4, "question": "What is the number?", "answers": ["4417"],
             "max_new_tokens": 4},
            {"context": "Alice sat by her sister on the bank. " * 3, "question": "Who sat?", "answers": ["Alice"],
             "max_new_tokens": 4}]
    questions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    asking = [*CHOOSE[:-1], "sliding:window=12,h2o:budget=12", "--qa", questions, "--raw"]
    assert in_child([*asking, "--out", tmp_path / "whole"]) in (0, 3)
    folder = tmp_path / "killed"
    assert in_child([*asking, "--out", folder], kill_at=2) == KILLED  # in the second item's answers: the first kept
    kept = sweep.read_journal(folder / "sweep.json.journal")
    assert kept.answered == [("query-agnostic", 0)] and not kept.finished
    assert [[a.item for a in c.answers] for c in kept.sweep.configurations] == [[0], [0], [0]]
    said = tmp_path / "stderr.txt"  # resumed in a child too: one thread, as the uninterrupted sweep's rounding
    assert in_child([*asking, "--out", folder, "--resume"], stderr=said) in (0, 3)
    assert "the answers to 1 item kept" in said.read_text(), said.read_text()
    for ours, theirs in zip(table(folder), table(tmp_path / "whole"), strict=True):
        assert ours == theirs, {k: (v, theirs[k]) for k, v in ours.items() if v != theirs[k]}
    answers = [[a.to_dict() for a in c.answers] for c in sweep.load(folder / "sweep.json").configurations]
    assert answers == [[a.to_dict() for a in c.answers] for c in sweep.load(tmp_path / "whole" / "sweep.json")
                       .configurations]
