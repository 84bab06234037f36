"""A sweep on the tiny model: the frontier, the answer, memory at a target against a measured run, a stop that keeps
what finished, and the sweep file."""

import copy

import pytest
import torch

from kvviz.engine import evaluate, strategies, sweep
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.strategies import capacity_for
from kvviz.engine.target_memory import size_at
from kvviz.errors import OptionError
from kvviz.files import documents, frontier
from kvviz.files import sweep as sweep_file
from kvviz.files.formats import read_kept
from kvviz.files.jsonfile import KeptFileError
from kvviz.files.qa import AnswerRecord
from kvviz.files.sweep_report import csv_row, speed_text
from kvviz.present import clock

TOKENS = 96
CONFIGS = ["sink:sink_tokens=4:window=20", "h2o:budget=24", "tova:budget=48", "sliding:window=33",
           "quantized:backend=hqq:nbits=4:residual_length=16", "snapkv:budget=40:window=8", "knorm:budget=24",
           "tova:budget=20"]


def prepared(loaded, choices, tokens=TOKENS):
    ids, record, _ = evaluate.prepare(loaded, documents.builtin("alice"), sweep.with_reference(choices), tokens)
    return ids, record


@pytest.fixture(scope="module")
def swept(tiny_model):
    choices = [strategies.parse_spec(c) for c in CONFIGS]
    ids, record = prepared(tiny_model, choices)
    question = sweep.ask(tiny_model.model, context=1024, sequences=3, budget="2MiB", tolerance="kl=0.01")
    run = sweep.SweepRun(tiny_model, choices, ids, record, question, rows=4)
    finished = list(run)
    return run, finished


def test_every_configuration_reads_the_whole_text_and_is_compared(swept):
    run, finished = swept
    result = run.sweep
    assert [c.label for c in result.configurations][0] == "dynamic"  # the exact cache was added, first
    assert len(finished) == len(CONFIGS) + 1 and all(c.finished for c in result.configurations)
    for config in result.configurations:
        assert len(config.kl) == len(config.top1) == len(config.run.records) == TOKENS - 1
        s = config.summary()
        assert s["final_cache_bytes"] == config.target.predicted_at_measured  # the size rule, checked
    reference = result.reference().summary()
    assert reference["mean_kl"] < 1e-6 and reference["top1"] == 1.0
    assert max(c.summary()["mean_kl"] for c in result.configurations) > 1e-3  # eviction does cost something
    # each reads alone, in chunks: those that evict step through each chunk (`stepped_reading`), none shares forwards
    assert {c.measured_rows for c in result.configurations} == {1}
    assert {c.run.method["mode"] for c in result.configurations} == {"chunked"}


def test_the_sweep_is_timed_against_its_compute_bound_floor(swept, tmp_path):
    run, _ = swept
    speed = run.sweep.speed
    assert speed.floor_rows == len(CONFIGS) and speed.floor_s > 0
    assert speed.floor_share == speed.wall_s / speed.floor_s
    assert f"x the compute-bound floor ({clock(speed.floor_s)}: {TOKENS - 1} plain forwards of one token for 8 rows " \
           f"over a full cache of {TOKENS // 2} tokens" in speed_text(run.sweep)
    assert read_kept(run.sweep.save(tmp_path / "sweep.json")).speed == speed


def test_the_floor_is_plain_forwards_of_the_rows_over_half_the_text(tiny_model):
    ids, record = prepared(tiny_model, [])
    exact = evaluate.Evaluation(tiny_model, strategies.choose("dynamic"), ids, record)
    list(exact)
    times = sweep.floor_forward_ms(exact.run, torch.tensor([[ids[48]]] * 5), 48, 3)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert exact.run.cache.get_seq_length() == TOKENS - 1  # the exact cache itself is left as it was
    assert sweep.floor_forward_ms(exact.run, torch.tensor([[ids[48]]]), TOKENS, 3) is None  # it holds fewer


def test_the_frontier_is_what_no_other_configuration_beats_on_both(swept):
    result = swept[0].sweep
    points = {c.label: (frontier.memory(c), frontier.quality_loss(result, c)) for c in frontier.placed(result)}
    on = {c.label for c in frontier.frontier(result)}
    for label, (m, q) in points.items():
        beaten = any(m2 <= m and q2 <= q and (m2, q2) != (m, q) for other, (m2, q2) in points.items() if other != label)
        assert (label in on) == (not beaten), label
    assert len(on) >= 2


def test_a_configuration_that_could_not_answer_is_named_with_why(swept):
    result = copy.deepcopy(swept[0].sweep)
    config = result.configurations[1]
    why = "the item takes 9,000 positions, more than the model's context of 4,096"
    config.answers = [AnswerRecord(0, 0, regime, "", None, 0, 0, None, None, None, why)
                      for regime in ("query-agnostic", "multi-turn")]
    assert f"{config.label} could not answer (query-agnostic, multi-turn): {why}." in frontier.caveats(result)
    assert csv_row(result, config)["error"] == f"answering (query-agnostic, multi-turn): {why}"
    assert csv_row(result, result.configurations[2])["error"] is None


def test_the_answer_agrees_with_the_table(swept):
    result = swept[0].sweep
    said = frontier.answer(result)
    tolerance, budget = result.question.tolerance.value, result.question.budget_bytes
    placed = frontier.placed(result)
    within = [c for c in placed if c.summary()["mean_kl"] <= tolerance]
    fits = [c for c in placed if frontier.memory(c) <= budget]
    assert said.smallest is min(within, key=lambda c: (frontier.memory(c), c.summary()["mean_kl"]))
    assert said.best is min(fits, key=lambda c: (c.summary()["mean_kl"], frontier.memory(c)))
    assert said.smallest.label in said.sentences[0] and said.best.label in said.sentences[1]
    assert "extrapolated" in said.caveats[0]  # measured on 96 tokens, asked at 1,024
    per_sequence = said.best.target.per_sequence_bytes
    assert said.best.target.sequences_in_budget == budget // per_sequence


def test_no_configuration_meeting_the_terms_names_the_nearest(swept):
    result = swept[0].sweep
    strict = sweep_file.Sweep(result.model, result.document, sweep_file.Question(
        1024, 3, 1, "1 byte", sweep_file.Tolerance("perplexity", 0.0)), result.configurations)
    said = frontier.answer(strict)
    assert not said.met and said.best is None
    assert "No configuration fits" in said.sentences[1] and "the smallest is" in said.sentences[1]


@pytest.mark.parametrize("spec", ["dynamic", "static", "sliding:window=40", "sink:sink_tokens=4:window=30",
                                  "h2o:budget=32", "quantized:backend=hqq:nbits=4:residual_length=16"])
def test_memory_at_a_target_equals_a_measured_run_at_that_length(tiny_model, spec):
    """The size rule replayed to a target of 100 tokens against a cache sized for and fed those 100 tokens as a sweep
    feeds them (as many tokens per forward as `Strategy.feed_span` allows: a chunk where it keeps every token exactly,
    up to its next quantization for a quantized cache, a chunk in two forwards for a sliding window, else one)."""
    target = 100
    choice = strategies.parse_spec(spec)
    ids, _ = prepared(tiny_model, [choice], target)
    run = CacheRun(tiny_model.model, choice, capacity_for(choice, target))
    chunk = evaluate.CHUNK
    fed = 0
    with torch.inference_mode():
        for span in evaluate.feed_sizes(target, lambda seen: run.strategy.feed_span(choice.options, seen, chunk)):
            for n in run.strategy.feed_forwards(span):
                run.forward(torch.tensor([ids[fed : fed + n]]), streamed=True)
                fed += n
    measured = sum(layer.total_bytes for layer in run.measure(slots=False))
    assert size_at(tiny_model.model, choice, target, chunk) == (measured, run.policy_bytes())
    assert size_at(tiny_model.model, choice, target, chunk, sequences=3)[0] == 3 * measured


def test_a_stop_keeps_what_finished(tiny_model, tmp_path):
    choices = [strategies.parse_spec(c) for c in CONFIGS[:3]]
    ids, record = prepared(tiny_model, choices)
    question = sweep.ask(tiny_model.model, budget="1GiB")
    run = sweep.SweepRun(tiny_model, choices, ids, record, question, rows=1)  # one at a time
    for config in run:
        assert config.finished
        run.cancel()
    result = run.sweep
    assert result.cancelled and result.configurations[0].finished
    assert [c.status for c in result.configurations[1:]] == ["cancelled"] * 3
    kept = read_kept(result.save(tmp_path / "sweep.json"))
    assert [c.label for c in kept.configurations] == [c.label for c in result.configurations]
    assert kept.configurations[0].kl == result.configurations[0].kl
    assert "did not finish" in frontier.answer(kept).text()


def test_a_damaged_sweep_file_is_refused_by_field(swept, tmp_path):
    import json

    data = swept[0].sweep.to_dict()
    data["configurations"][1]["kl"] = data["configurations"][1]["kl"][:-1]
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(data))
    with pytest.raises(KeptFileError, match=r"configurations\[1\]\.kl: expected one value per prediction"):
        read_kept(path)


@pytest.mark.parametrize("budget", ["lots", "4 GiBs", "-1GiB", "0"])
def test_a_budget_that_does_not_parse_names_the_accepted_forms(tiny_model, budget):
    with pytest.raises(OptionError, match="give a size such as 4GiB"):
        sweep.ask(tiny_model.model, budget=budget)


def test_the_question_is_checked(tiny_model):
    with pytest.raises(OptionError, match="more than the 4,096 positions"):
        sweep.ask(tiny_model.model, context=5000)
    with pytest.raises(OptionError, match="5% or a mean KL"):
        sweep.ask(tiny_model.model, tolerance="five")
    assert sweep.ask(tiny_model.model, tolerance="0.05 nats").tolerance == sweep_file.Tolerance("kl", 0.05)
    assert frontier.parse_budget("1.5 GB") == 1_500_000_000 and frontier.parse_budget("512MiB") == 512 * 2**20


def test_the_default_grid_covers_every_strategy_family_at_three_budgets(tiny_model):
    choices, skipped = sweep.default_grid(tiny_model.model, 2000)
    names = [c.name for c in choices if not c.options.get("prefill_chunk")]
    assert names[0] == "dynamic"
    for name in ("sliding", "sink", "h2o", "tova", "knorm"):
        assert names.count(name) == 3, name
    assert {(c.options["backend"], c.options["nbits"]) for c in choices if c.name == "quantized"} >= {
        ("quanto", 4), ("quanto", 2), ("hqq", 8), ("hqq", 4), ("hqq", 2)}
    # 1,000 would keep its prompt
    assert [c.options["budget"] for c in choices if c.name == "snapkv"] == [250, 250, 500]
    twins = [(c.name, c.options["prefill_chunk"]) for c in choices if c.options.get("prefill_chunk")]
    assert twins == [("sink", 256), ("h2o", 256), ("snapkv", 256)]  # the most compressed, their prompts in chunks
    assert len(skipped) == 1 and "would never evict" in skipped[0]
    leaders = [(c.name, c.options["budget"], c.options.get("adaptive")) for c in choices
               if c.name in ("expected_attention", "kvzip", "random")]  # kvpress's leaders and baseline, at a quarter
    assert leaders == [("expected_attention", 500, False), ("kvzip", 500, None), ("random", 500, False),
                       ("expected_attention", 500, True)]
