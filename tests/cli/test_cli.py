"""`kvviz` as a user runs it: exit statuses, stdout and stderr (in this process; a real subprocess where the
process is what is tested: the console entry point's exit statuses and Ctrl-C)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kvviz.cli.main import COMMANDS
from kvviz.files import trace
from tests.commands import kvviz, kvviz_process


def test_run_json_and_trace(tmp_path):
    path = tmp_path / "t.json"
    result = kvviz("run", "--model", "tiny", "--strategy", "sink", "--set", "window=8", "--prompt", "hello",
                   "--max-new-tokens", "12", "--ignore-eos", "--trace", str(path), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["new_tokens"] == 12 and summary["strategy"]["options"]["window"] == 8
    loaded = trace.load(path)
    assert len(loaded.steps) == 12 and not loaded.cancelled
    assert summary["peak_cache_bytes"] == max(s.cache_bytes for s in loaded.steps)


def test_run_streams_text_and_prints_summary(tmp_path):
    result = kvviz_process("run", "--model", "default", "--prompt", "What is the capital of France?",
                           "--max-new-tokens", "10", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "tokens/s" in result.stdout and "MiB" in result.stdout
    written = list(tmp_path.glob("kvviz-dynamic-*.json"))
    assert len(written) == 1 and trace.load(written[0]).steps


@pytest.mark.parametrize(
    "args,status,message",
    [
        (["run", "--model", "tiny", "--strategy", "nope", "--prompt", "x"], 2, "unknown strategy 'nope'"),
        (["run", "--model", "tiny", "--set", "window", "--prompt", "x"], 2, "a strategy option is KEY=VALUE"),
        (["run", "--model", "tiny", "--strategy", "sliding", "--set", "window=0", "--prompt", "x"], 2, "window"),
        (["run", "--model", "tiny"], 2, "give a prompt with --prompt"),
        (["run", "--model", "tiny", "--prompt-file", "/no/such/file"], 2, "cannot read the prompt file"),
        (["run", "--model", "/no/such/model", "--prompt", "x"], 1, "neither a model directory"),
        (["run", "--model", "tiny", "--strategy", "offloaded", "--prompt", "x", "--no-trace"], 2, "CUDA"),
        (["trace", "pyproject.toml"], 2, "pyproject.toml is not a kvviz file"),
        (["run", "--max-new-tokens", "many"], 2, "invalid int value"),
    ],
)
def test_errors_are_one_paragraph_without_traceback(args, status, message):
    result = kvviz(*args)
    assert result.returncode == status, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args,status,message", [
    (["run", "--model", "tiny", "--strategy", "nope", "--prompt", "x"], 2, "unknown strategy 'nope'"),
    (["run", "--model", "/no/such/model", "--prompt", "x"], 1, "neither a model directory"),
    (["run", "--max-new-tokens", "many"], 2, "invalid int value"),
])
def test_the_console_entry_point_exits_with_the_status(args, status, message):
    result = kvviz_process(*args)
    assert result.returncode == status, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_debug_shows_traceback():
    result = kvviz("--debug", "run", "--model", "tiny", "--strategy", "nope", "--prompt", "x")
    assert result.returncode == 2 and "Traceback" in result.stderr


def test_strategies_json():
    result = kvviz("strategies", "--json")
    listing = json.loads(result.stdout)
    assert {s["name"] for s in listing} >= {"none", "dynamic", "static", "quantized", "sliding", "sink"}
    sink = next(s for s in listing if s["name"] == "sink")
    assert {o["name"]: o["default"] for o in sink["options"]} == {"sink_tokens": 4, "window": 252, "prefill_chunk": 0}


def test_strategies_say_what_they_follow():
    result = kvviz("strategies")
    assert result.returncode == 0, result.stderr
    assert "follows SnapKV (Li et al., NeurIPS 2024) and its reference code" in result.stdout
    assert "pooling=average" in result.stdout and "skip_layers=2" in result.stdout and "recent=-1" in result.stdout


def test_switch_at_is_refused_only_once_the_cache_has_evicted(tmp_path):
    """A switch to static needs every token: allowed while h2o has evicted nothing, refused (the run stopped, its
    trace kept) once it has, as measured."""
    args = ("run", "--model", "tiny", "--strategy", "h2o", "--set", "budget=12", "--raw", "--max-new-tokens", "10",
            "--ignore-eos", "--prompt", "one two three four five six seven eight")  # 8 tokens: 12 seen by step 4
    early = kvviz(*args, "--switch-at", "3:static", "--trace", str(tmp_path / "early.json"), "--json")
    assert early.returncode == 0, early.stderr
    assert json.loads(early.stdout)["peak_policy_bytes"] > 0  # the policy's own state, before the switch
    assert trace.load(tmp_path / "early.json").switches[0].to_strategy == "static"
    late = kvviz(*args, "--switch-at", "9:static", "--trace", str(tmp_path / "late.json"))
    assert late.returncode == 2
    assert ("--switch-at 9: cannot switch from 'h2o' to 'static': 'h2o' has already evicted tokens, and a static "
            "cache cannot hold the gaps they leave") in late.stderr and "Traceback" not in late.stderr
    kept = trace.load(tmp_path / "late.json")
    assert len(kept.steps) == 9 and kept.error.startswith("--switch-at 9: cannot switch") and not kept.switches
    assert "policy" in late.stdout  # the summary is printed, with the policy's state


def test_model_card_command():
    result = kvviz("model", "--model", "default")
    assert result.returncode == 0, result.stderr
    assert "LlamaForCausalLM" in result.stdout and "46,080 bytes" in result.stdout


def test_ctrl_c_writes_partial_trace(tmp_path):
    path = tmp_path / "partial.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvviz", "run", "--model", "default", "--prompt", "Tell me a long story.",
         "--max-new-tokens", "2000", "--ignore-eos", "--trace", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    # the first streamed character means a step has been recorded; then interrupt as a terminal would
    assert proc.stdout.read(1), "kvviz exited before generating"
    time.sleep(1)
    os.kill(proc.pid, signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    partial = trace.load(path)
    assert partial.cancelled and 0 < len(partial.steps) < 2000


def test_debug_prints_the_traceback_of_a_strategy_that_fails_inside_an_evaluation(monkeypatch):
    from kvviz.engine import evaluate

    def broken(self, *args, **kwargs):  # a bug inside one strategy's reading of the document
        raise IndexError("index 7 is out of bounds")

    monkeypatch.setattr(evaluate.Evaluation, "take", broken)
    args = ["eval", "--model", "tiny", "--builtin", "alice", "--tokens", "8", "--strategies", "sliding:window=4"]
    quiet, loud = kvviz(*args), kvviz("--debug", *args)
    assert quiet.returncode == loud.returncode == 1
    for result in (quiet, loud):
        assert "sliding (window=4) failed: IndexError: index 7 is out of bounds" in result.stdout
    assert "Traceback" not in quiet.stderr
    assert "Traceback" in loud.stderr and "in broken" in loud.stderr


def test_run_and_compare_say_what_the_cache_keeps_of_a_long_prompt(tmp_path):
    prompt = "The cache grows by one token at every step of decoding, and the window keeps only the last few."
    ran = kvviz("run", "--model", "tiny", "--strategy", "sliding:window=8", "--prompt", prompt, "--raw",
                "--max-new-tokens", "2", "--no-trace")
    assert ran.returncode == 0, ran.stderr
    assert "more than this cache keeps (7): the prefill reads all of it, then the cache keeps its last 7" in ran.stderr
    compared = kvviz("compare", "--model", "tiny", "--strategies", "dynamic,sink:sink_tokens=2:window=4", "--prompt",
                     prompt, "--raw", "--max-new-tokens", "2", "--no-reference", "--out", tmp_path / "c")
    assert compared.returncode == 0, compared.stderr
    assert compared.stderr.count("more than this cache keeps") == 1  # sink's, not dynamic's
    assert "its first 2 tokens (the sinks) and its last 4" in compared.stderr


def test_one_form_for_a_strategy_with_options_everywhere():
    from kvviz.cli.common import parse_switches

    colons = parse_switches(["64:quantized:backend=hqq:nbits=2"])
    commas = parse_switches(["64:quantized,backend=hqq,nbits=2"])  # the earlier form, still read
    assert colons == commas and colons[64].name == "quantized" and colons[64].options["nbits"] == 2
    ran = kvviz("run", "--model", "tiny", "--strategy", "sink:window=8", "--set", "sink_tokens=2", "--prompt", "hi",
                "--max-new-tokens", "2", "--no-trace", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["strategy"]["options"] == {"sink_tokens": 2, "window": 8, "prefill_chunk": 0}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_explains_itself(command):
    """`kvviz COMMAND --help` prints its usage and exits 0 (argparse formats each help text with %: a stray % in one
    would make it a traceback)."""
    ran = kvviz(command, "--help")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(f"usage: kvviz {command}") and "Traceback" not in ran.stderr
