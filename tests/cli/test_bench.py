"""`kvviz bench`: kvviz's decoder and plain model.generate, each in a fresh process, interleaved."""

import json

import pytest

from tests.commands import kvviz


def test_bench_compares_with_generate_in_clean_processes(tmp_path):
    out = tmp_path / "bench.json"
    result = kvviz("bench", "--model", "tiny", "--strategies", "sliding:window=8", "--new-tokens", "12",
                   "--repeats", "1", "--out", out)
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert "fresh process" in figures["reference"]
    assert set(figures["strategies"]) == {"sliding (window=8)"}
    for row in figures["strategies"].values():
        # the kvviz run between two reference runs, over their mean
        assert len(row["generate_runs"]) == 2 and len(row["kvviz_runs"]) == 1
        assert row["ratio"] == row["kvviz_tokens_per_s"] / (sum(row["generate_runs"]) / 2) > 0
    assert "ratio" in result.stdout and "sliding (window=8)" in result.stdout


def test_the_kvviz_side_journals_its_steps_as_a_default_run_does(tiny_model, monkeypatch, tmp_path):
    from kvviz.engine import strategies, timed_run
    from kvviz.files.trace import TraceJournal

    update, journaled = TraceJournal.update, []

    def spied(journal):
        update(journal)
        journaled.append(len(journal.journal.path.read_text().splitlines()))  # header + a line per step

    monkeypatch.setattr(TraceJournal, "update", spied)
    monkeypatch.chdir(tmp_path)
    times = timed_run.kvviz_times(tiny_model, strategies.choose("dynamic", {}), "Hello", 4)
    assert len(times) == 4 and journaled == [2, 3, 4, 5]
    assert list(tmp_path.iterdir()) == []  # its journal removed with its folder


def test_bench_sweep_prints_the_sweep_against_its_floor_and_plain_generate(tmp_path):
    out = tmp_path / "bench.json"
    result = kvviz("bench", "--sweep", "--model", "tiny", "--tokens", "40", "--strategies",
                   "sliding:window=9,h2o:budget=12", "--new-tokens", "8", "--repeats", "1", "--floor-forwards", "2",
                   "--out", out)
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    labels = [c["label"] for c in figures["configurations"]]
    assert labels == ["dynamic", "sliding (window=9)", "h2o (budget=12, recent=-1, average=False)"]
    assert figures["floor_rows"] == 2 and figures["floor_tokens"] == 20 and figures["floor_s"] > 0
    assert figures["floor_share"] == figures["wall_s"] / figures["floor_s"]
    assert len(figures["generate_runs"]) == 1 and figures["generate_tokens_per_s"] > 0
    for line in ("compute-bound floor:", "39 plain forwards of one token for 2 rows over a full cache of 20 tokens",
                 "share of the floor:", "plain generate:", "machine: load average", repr(
                     figures["configurations"][1]["perplexity"])):
        assert line in result.stdout


def test_bench_reading_refuses_a_text_too_short_to_predict(tmp_path):
    result = kvviz("bench", "--eval", "--model", "tiny", "--tokens", "1", "--out", tmp_path / "bench.json")
    assert result.returncode == 2 and "--tokens" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("mode, flag, value, least", [
    ("--gui", "--repeats", "0", 1), (None, "--repeats", "-1", 1), ("--gui", "--new-tokens", "1", 2),
    (None, "--new-tokens", "0", 2), ("--sweep", "--rows", "0", 1), ("--sweep", "--floor-forwards", "0", 1),
])
def test_bench_refuses_counts_it_cannot_measure_with_before_loading_anything(tmp_path, mode, flag, value, least):
    out = tmp_path / "bench.json"
    result = kvviz("bench", *([mode] if mode else []), "--model", "tiny", flag, value, "--out", out)
    assert result.returncode == 2 and f"{flag} must be at least {least}, not {value}" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("value, target, word", [
    (0.9498, ">= 0.95", "missed"), (0.95, ">= 0.95", "met"), (33.0, "< 33", "missed"), (32.9, "< 33", "met"),
    (2.0, "<= 2", "met"), (None, "<= 2", "unknown"),
])
def test_the_gui_bench_says_on_which_side_of_its_target_a_figure_lies(value, target, word):
    from kvviz.cli.bench import verdict

    assert verdict(value, target) == word  # 0.9498 prints as 0.950 at three places: the word is what a reader trusts


def test_the_serving_sides_answer_alike(monkeypatch, tiny_model):
    """kvviz serve, transformers' generate_batch and generate one request after another: the same answers to the same
    requests (the sides of `kvviz bench --serve`, here in this process)."""
    from kvviz.engine import timed_serve

    monkeypatch.setattr(timed_serve.models, "load_model", lambda *args, **kwargs: tiny_model)
    request = {"model": "tiny", "dtype": "auto", "device": "auto", "requests": 3, "new_tokens": 5, "page_size": 16,
               "blocks": 32, "max_batch_tokens": 64}
    sides = {side: timed_serve.main(request | {"side": side}) for side in timed_serve.SIDES}
    assert sides["kvviz"]["answers"] == sides["generate-batch"]["answers"] == sides["generate-each"]["answers"]
    assert all(s["tokens"] == sum(map(len, s["answers"])) > 0 and s["wall_s"] > 0 for s in sides.values())


@pytest.mark.parametrize("args", [["--concurrency", "1,x"], ["--concurrency", "0"], ["--requests", "0"]])
def test_bench_serve_refuses_what_it_cannot_serve(tmp_path, args):
    result = kvviz("bench", "--serve", "--model", "tiny", *args, "--out", tmp_path / "bench.json")
    assert result.returncode == 2 and "--serve needs --requests of at least 1" in result.stderr
