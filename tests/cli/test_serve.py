"""`kvviz serve` on the default model, in this process: the JSON it prints, its table, and bad input refused by name
before any model is loaded."""

import json

import pytest

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
