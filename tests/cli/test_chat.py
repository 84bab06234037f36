"""`kvviz chat`: scripted and typed conversations, their trace, and what it refuses (in this process, tiny model)."""

import io
import json

from kvviz.files import conversation as conversation_file
from tests.commands import kvviz

SCRIPT = "Hello, who are you?\nWhat is a KV cache?\n\n/new\nHello, who are you?\n"


def test_a_scripted_chat_prints_each_turn_and_keeps_a_trace_that_kvviz_trace_reads(tmp_path):
    script = tmp_path / "chat.txt"
    script.write_text(SCRIPT, encoding="utf-8")
    trace = tmp_path / "chat.json"
    ran = kvviz("chat", "--model", "tiny", "--script", script, "--system", "Be brief.", "--max-new-tokens", 4,
                "--compare-reprefill", "--trace", trace, "--json")
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert (out["turns"], out["chats"]) == (3, 2)
    first, second, again = out["turn_records"]
    assert second["kept"] == first["end"] - 1 and second["reprefill_logit_diff"] < 1e-4
    assert again["chat"] == 1 and again["kept"] == out["prefix"]["tokens"]
    assert again["prefix_copy_bytes"] == out["prefix"]["cache_bytes"]

    kept = conversation_file.load(trace)
    assert [m.role for m in kept.messages] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert kept.messages[3].start == kept.turns[1].start and kept.messages[4].end == kept.turns[1].end
    assert len(kept.steps) == 12 and {s.turn for s in kept.steps} == {0, 1, 2}
    shown = kvviz("trace", trace)
    assert shown.returncode == 0 and "3 turns in 2 chat(s)" in shown.stdout and "full re-prefill" in shown.stdout


def test_a_bad_script_or_a_damaged_conversation_is_refused_by_name(tmp_path):
    script = tmp_path / "chat.json"
    script.write_text(json.dumps(["Hello", "  "]), encoding="utf-8")
    ran = kvviz("chat", "--model", "tiny", "--script", script)
    assert ran.returncode == 2 and f"{script}: message 1 is empty" in ran.stderr

    script.write_text(json.dumps([{"role": "assistant", "content": "Hi"}]), encoding="utf-8")
    ran = kvviz("chat", "--model", "tiny", "--script", script)
    assert ran.returncode == 2 and "message 0 is not" in ran.stderr

    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps({"format": "kvviz-conversation", "version": 1, "model": {},
                                   "strategy": {"name": "dynamic"}, "messages": [], "turns": [],
                                   "steps": [{"turn": 3}]}), encoding="utf-8")
    ran = kvviz("trace", damaged)
    assert ran.returncode == 2 and str(damaged) in ran.stderr and "steps[0]" in ran.stderr


def test_ctrl_c_keeps_the_finished_turns(tmp_path, monkeypatch):
    from kvviz.engine.conversation import Conversation

    reprefill = Conversation.reprefill
    calls = []

    def interrupted_at_the_second(self, turn):
        calls.append(turn)
        if len(calls) == 2:
            raise KeyboardInterrupt
        reprefill(self, turn)

    monkeypatch.setattr(Conversation, "reprefill", interrupted_at_the_second)
    script = tmp_path / "chat.txt"
    script.write_text("One\nTwo\nThree\n", encoding="utf-8")
    trace = tmp_path / "chat.json"
    ran = kvviz("chat", "--model", "tiny", "--script", script, "--max-new-tokens", 3, "--compare-reprefill",
                "--trace", trace)
    assert ran.returncode == 130
    kept = conversation_file.load(trace)
    assert kept.cancelled and len(kept.turns) == 2 and kept.turns[0].reprefill_ms is not None


def test_typed_messages_refuse_an_empty_one_and_go_on(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello there\n   \n/regenerate\n"))
    ran = kvviz("chat", "--model", "tiny", "--max-new-tokens", 3, "--quiet")
    assert ran.returncode == 0, ran.stderr
    assert "the message is empty" in ran.stderr
    assert "turn 2: 1 tokens fed" in ran.stderr  # the regenerated answer fed only the last token of the prompt


def test_chat_bench_prints_each_target(tmp_path):
    out = tmp_path / "bench.json"
    ran = kvviz("chat-bench", "--model", "tiny", "--reuse-turns", 2, "--reuse-new-tokens", 1, "--bounded",
                "sink:sink_tokens=4:window=12", "--bounded-turns", 3, "--early-turn", 1, "--flat-from", 2,
                "--bounded-new-tokens", 2, "--out", out)
    assert ran.returncode == 0, ran.stderr
    figures = json.loads(out.read_text())
    assert figures["reuse"]["turns"][1]["logit_diff"] < 1e-4
    assert figures["bounded"][0]["budget_bytes"] == figures["bounded"][0]["max_bytes"]
    for target in ("first token", "largest deviation", "ratio"):
        assert target in ran.stdout


def test_switch_at_counts_the_conversations_steps_and_is_refused_as_in_run(tmp_path):
    """Steps count across the answers: a switch at the end of an answer takes the next turn, one inside an answer its
    next step; a switch the cache cannot take by then stops the chat there, its finished turns kept."""
    script = tmp_path / "chat.txt"
    script.write_text("one two three four\nfive six seven eight\n", encoding="utf-8")
    args = ("chat", "--model", "tiny", "--script", script, "--raw", "--max-new-tokens", 4, "--ignore-eos", "--quiet")
    switched = kvviz(*args, "--switch-at", "4:sliding:window=64", "--switch-at", "6:h2o:budget=64", "--trace",
                     tmp_path / "switched.json")
    assert switched.returncode == 0, switched.stderr
    kept = conversation_file.load(tmp_path / "switched.json")
    assert [s.strategy for s in kept.steps] == ["dynamic"] * 4 + ["sliding"] * 2 + ["h2o"] * 2
    assert [t.strategy["name"] for t in kept.turns] == ["dynamic", "h2o"] and kept.error is None

    refused = kvviz(*args, "--strategy", "h2o", "--set", "budget=12", "--switch-at", "6:static", "--trace",
                    tmp_path / "refused.json")
    assert refused.returncode == 2
    assert ("--switch-at 6: cannot switch from 'h2o' to 'static': 'h2o' has already evicted tokens, and a static "
            "cache cannot hold the gaps they leave") in refused.stderr and "Traceback" not in refused.stderr
    stopped = conversation_file.load(tmp_path / "refused.json")
    assert len(stopped.turns) == 2 and not stopped.turns[0].cancelled and stopped.turns[1].cancelled
    assert len(stopped.steps) == 6 and stopped.error.startswith("--switch-at 6: cannot switch")
