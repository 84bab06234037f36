"""`kvviz serve` on the default model, in this process: the JSON it prints, its table, and bad input refused by name
before any model is loaded; its kept file on the tiny model: journaled while it serves (a killed serve keeps what it
measured), and refused by name when damaged."""

import json

import pytest

from kvviz.files.formats import read_kept
from tests.cli.test_kill import KILLED, in_child, preloaded, readable  # noqa: F401 - preloaded: a fixture
from tests.commands import kvviz

POOL = ["--page-size", "16", "--max-batch-tokens", "64", "--max-new-tokens", "6"]


@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("What is the capital of France?\n\nName three colours.\n", encoding="utf-8")
    return path


def test_json_has_a_row_per_request_and_the_pool(prompts):
    ran = kvviz("serve", "--prompts", prompts, *POOL, "--blocks", "8", "--json")
    assert ran.returncode == 0, ran.stderr
    figures = json.loads(ran.stdout)
    assert [r["prompt"] for r in figures["requests"]] == ["What is the capital of France?", "Name three colours."]
    for row in figures["requests"]:
        assert {"prompt", "text", "ttft_ms", "tpot_ms", "preemptions"} <= row.keys()
        assert row["text"] and row["ttft_ms"] > 0 and row["finished"]
    assert figures["blocks"] == 8 and figures["page_size"] == 16 and not figures["sized_from_memory"]
    assert figures["peak_bytes"] == figures["peak_blocks"] * figures["bytes_per_block"] > 0
    assert figures["reused_blocks"] >= 0 and figures["preemptions"] >= 0 and figures["tokens_per_s"] > 0


def test_the_table_names_each_request_and_the_pool():
    ran = kvviz("serve", "--requests", "2", "--raw", *POOL, "--blocks", "40", "--rate", "50")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].split()[:3] == ["request", "prompt", "in"]
    assert [line.split()[0] for line in lines[1:3]] == ["r0", "r1"]
    assert any(line.startswith("pool: 40 blocks of 16 tokens (as asked)") for line in lines)


@pytest.mark.parametrize(("args", "said"), [
    (["--scheduler", "lifo"], "unknown scheduler 'lifo': give fifo or prefill_first"),
    (["--blocks", "0"], "blocks must be at least 1, got 0"),
    (["--page-size", "2"], "the page size must be at least 4 tokens"),
    (["--rate", "0"], "the rate must be above 0 requests per second"),
    (["--requests", "0"], "--requests must be at least 1"),
    (["--prompts", "missing.txt"], "cannot read --prompts missing.txt"),
])
def test_bad_input_is_refused_by_name(args, said, tmp_path):
    ran = kvviz("serve", *args, cwd=tmp_path)
    assert ran.returncode == 2
    assert said in ran.stderr and "Traceback" not in ran.stderr


def test_an_empty_prompts_file_and_a_pool_too_small_are_refused(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    ran = kvviz("serve", "--prompts", empty)
    assert ran.returncode == 2 and "holds no prompt: give one prompt per line" in ran.stderr
    ran = kvviz("serve", "--requests", "1", *POOL, "--blocks", "1")
    assert ran.returncode == 2 and "and the pool has 1: give at least" in ran.stderr


SERVED = ["serve", "--model", "tiny", "--raw", "--page-size", "16", "--blocks", "8", "--max-batch-tokens", "32",
          "--max-new-tokens", "12"]


def shape(run) -> list[tuple]:
    """What each step did and held, less its timings."""
    return [(s.batch, s.pool.tables, s.waiting) for s in run.steps]


def test_a_serve_killed_mid_run_keeps_the_steps_it_journaled(tmp_path, preloaded, monkeypatch):  # noqa: F811
    from kvviz.files import serve_trace

    monkeypatch.setattr(serve_trace, "JOURNAL_S", 0.0)  # a journal line at every step (the child is forked from here)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello there.\nWhat is a cache?\nTell me a story.\n")
    assert in_child([*SERVED, "--prompts", prompts, "--trace", tmp_path / "whole.json"]) == 0
    whole = read_kept(tmp_path / "whole.json")
    assert not whole.cancelled and all(r.finished for r in whole.requests) and len(whole.steps) > 4
    assert not (tmp_path / "whole.json.journal").exists()
    folder = tmp_path / "killed"
    folder.mkdir()
    # writes: the journal's start, then a line per step; the fifth cut halfway
    assert in_child([*SERVED, "--prompts", prompts, "--trace", folder / "serve.json"], 5, 0.5) == KILLED
    files = readable(folder)
    assert list(files) == ["serve.json.journal"]
    kept = files["serve.json.journal"]
    assert shape(kept) == shape(whole)[:3]
    assert kept.cancelled and kept.error.startswith("stopped after 0 of 3 requests")
    shown = kvviz("trace", folder / "serve.json.journal")
    assert shown.returncode == 0 and "3 requests, cancelled" in shown.stdout, shown.stdout


@pytest.mark.parametrize(("damage", "said"), [
    (lambda d: d["requests"][0].update(token_times=d["requests"][0]["token_times"][::-1]),
     "requests[0].token_times: expected times in order"),
    (lambda d: d["steps"][0]["batch"][0].update(request="r9"), "steps[0]: expected requests of the file"),
    (lambda d: d["pool"].update(groups=[]), "pool.groups: expected at least one group of layers"),
    (lambda d: d["summary"].update(peak_blocks=10**6), "summary.peak_blocks"),
    (lambda d: d.update(version=2), "of version 2; this kvviz reads version 1"),
])
def test_a_damaged_serve_trace_is_refused_by_name(tmp_path, served, damage, said):
    data = json.loads(json.dumps(served))
    damage(data)
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(data))
    ran = kvviz("trace", path)
    assert ran.returncode == 2 and said in ran.stderr and "Traceback" not in ran.stderr, ran.stderr


@pytest.fixture(scope="module")
def served(tiny_model):
    """One run served on the tiny model, as its file holds it (damaged in turn)."""
    from kvviz.engine.decode import encode_prompt
    from kvviz.engine.serve import serve
    from kvviz.files.serve_trace import ServeSettings

    prompts = [(q, encode_prompt(tiny_model.tokenizer, q, raw=True)) for q in ("Hello there.", "What is a cache?")]
    return serve(tiny_model, prompts, ServeSettings(max_new_tokens=3, page_size=16, blocks=8)).to_dict()
