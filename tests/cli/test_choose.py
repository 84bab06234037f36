"""`kvviz choose` on the tiny model, in this process: the table, the answer and its exit status, the kept files, bad
input, a configuration that cannot run, and Ctrl-C."""

import json

import pytest

from kvviz.files.formats import read_kept
from tests.commands import kvviz

BASE = ["choose", "--model", "tiny", "--tokens", "64", "--context", "512"]
CONFIGS = "sink:sink_tokens=4:window=16,h2o:budget=20,snapkv:budget=40:window=8"


@pytest.fixture(scope="module")
def chosen(tmp_path_factory):
    out = tmp_path_factory.mktemp("choose")
    ran = kvviz(*BASE, "--configs", CONFIGS, "--budget", "4MiB", "--tolerance", "kl=1", "--out", out)
    return ran, out


def test_the_table_the_answer_and_the_kept_files(chosen):
    ran, out = chosen
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("configuration | perplexity")
    assert any(line.startswith("dynamic |") for line in lines)  # the exact cache, added
    assert "The smallest cache within your tolerance" in ran.stdout and "Within your budget of 4MiB" in ran.stdout
    kept = read_kept(out / "sweep.json")
    assert [c.label for c in kept.configurations][:2] == ["dynamic", "sink (sink_tokens=4, window=16)"]
    assert (out / "sweep.csv").read_text().splitlines()[0].startswith("strategy,options,status")
    report = (out / "report.md").read_text()
    assert "## Answer" in report and "| configuration |" in report and "![" in report
    assert (out / "frontier.png").stat().st_size > 0 and (out / "frontier.svg").read_text().lstrip().startswith("<")


def test_a_configuration_that_cannot_run_says_why_and_the_others_go_on(chosen):
    ran, _ = chosen
    snapkv = next(line for line in ran.stdout.splitlines() if line.startswith("snapkv"))
    assert "error: snapkv" in snapkv and "would never evict" in snapkv
    assert "sink (sink_tokens=4, window=16) |" in ran.stdout


def test_trace_reads_a_kept_sweep(chosen):
    _, out = chosen
    ran = kvviz("trace", out / "sweep.json")
    assert ran.returncode == 0
    assert "configuration | perplexity" in ran.stdout and "The smallest cache" in ran.stdout


def test_no_configuration_in_the_budget_has_its_own_exit_status(tmp_path):
    ran = kvviz(*BASE, "--configs", "sink:sink_tokens=4:window=16", "--budget", "1", "--json")
    assert ran.returncode == 3
    result = json.loads(ran.stdout)
    assert result["answer"]["met"] is False and result["answer"]["best"] is None
    assert "No configuration fits" in result["answer"]["sentences"][1]


@pytest.mark.parametrize(("args", "says"), [
    (["--budget", "lots"], "give a size such as 4GiB"),
    (["--tolerance", "a bit"], "5% or a mean KL"),
    (["--context", "100000"], "more than the 4,096 positions"),
    (["--sequences", "0"], "--sequences must be at least 1"),
    (["--configs", "sink:windows=3"], "has no option 'windows'"),
])
def test_bad_input_names_what_is_accepted(args, says):
    ran = kvviz(*BASE, *args)
    assert ran.returncode == 2
    assert says in ran.stderr and "Traceback" not in ran.stderr and "Error:" not in ran.stderr


def test_a_shorter_text_is_measured_as_it_is(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("A short text about caches. " * 6)
    ran = kvviz("choose", "--model", "tiny", "--text", text, "--configs", "sink:sink_tokens=4:window=8")
    assert ran.returncode == 0, ran.stderr
    assert "fewer than the 2,000 a sweep reads by default: measuring all" in ran.stderr


def test_ctrl_c_keeps_the_configurations_that_finished(tmp_path, monkeypatch):
    from kvviz.cli import choose

    calls = []

    def interrupt(self):
        calls.append(1)
        if self.run.sweep.configurations[0].kl and len(calls) > 70:  # the exact cache has read the text
            raise KeyboardInterrupt

    monkeypatch.setattr(choose.Progress, "update", interrupt)
    ran = kvviz(*BASE, "--configs", "sink:sink_tokens=4:window=16,h2o:budget=20", "--rows", "1", "--out", tmp_path)
    assert ran.returncode == 130
    kept = read_kept(tmp_path / "sweep.json")
    assert kept.cancelled and kept.configurations[0].finished
    assert [c.status for c in kept.configurations[1:]] == ["cancelled", "cancelled"]


def test_a_kept_conversation_is_read_as_its_messages(tmp_path):
    script, kept = tmp_path / "chat.txt", tmp_path / "chat.json"
    script.write_text("Tell me about the rabbit.\nAnd the queen?\n")
    chat = kvviz("chat", "--model", "tiny", "--script", script, "--max-new-tokens", "8", "--trace", kept)
    assert chat.returncode == 0, chat.stderr
    ran = kvviz(*BASE, "--conversation", kept, "--configs", "sink:sink_tokens=4:window=8", "--json")
    assert ran.returncode in (0, 3), ran.stderr
    assert json.loads(ran.stdout)["document"] == "chat.json"
    refused = kvviz(*BASE, "--conversation", script)
    assert refused.returncode == 2 and "chat.txt" in refused.stderr and "Traceback" not in refused.stderr


def test_each_configuration_serves_a_request_and_the_budget_may_cover_the_process(tmp_path):
    """Every configuration's serving peak and time to first token at the target, predicted from a request of the text's
    length (measured, beside it); with --budget-covers process the budget bounds the weights, one request's prefill
    and the other caches, so fewer sequences fit in it than in a budget for the caches alone."""
    configs = ["--configs", "sink:sink_tokens=4:window=16,sink:sink_tokens=4:window=16:prefill_chunk=16"]
    for_caches = json.loads(kvviz(*BASE, *configs, "--budget", "64MiB", "--json").stdout)
    for_process = json.loads(kvviz(*BASE, *configs, "--budget", "64MiB", "--budget-covers", "process",
                                   "--json").stdout)
    for rows in (for_caches["configurations"], for_process["configurations"]):
        for row in rows:
            assert row["measured_tokens"] == 64 and row["at_target_predicted"] is True
            assert row["peak_bytes_at_target"] >= row["peak_bytes_measured"] > row["final_cache_bytes"]
            assert row["ttft_ms_at_target"] > 0 and row["process_bytes"] >= row["peak_bytes_at_target"]
    whole, chunked = for_process["configurations"][1:]
    assert chunked["peak_bytes_at_target"] < whole["peak_bytes_at_target"]  # its prompt read 16 tokens at a time
    assert for_process["question"]["budget_covers"] == "process"
    fits = [(c["sequences_in_budget"], p["sequences_in_budget"])
            for c, p in zip(for_caches["configurations"], for_process["configurations"], strict=True)]
    assert all(process < caches for caches, process in fits), fits
    skipped = json.loads(kvviz(*BASE, "--configs", "sink:sink_tokens=4:window=16", "--no-first-token",
                               "--json").stdout)
    assert all(row["peak_bytes_at_target"] is None and row["ttft_ms_at_target"] is None
               for row in skipped["configurations"])
