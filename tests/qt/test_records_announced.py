"""The worker tells the window of a run's new records once, until the window's redraw takes them (Worker.sigRecords,
re-armed by RunStore.sigTaking): a queued signal at every token woke the GUI thread for each of them."""

from kvviz.files.trace import StepRecord, Trace
from kvviz.present import RUNNING
from kvviz.qt.run_store import RunStore
from kvviz.qt.worker import Worker

TAKEN_AT = 5  # the step after which a frame takes the records


def test_a_run_announces_its_records_once_until_they_are_taken(qapp):
    worker = Worker()  # on this thread: its signals reach these handlers at once
    worker.load("tiny")
    steps, announced = [], []

    def on_step(run_id, step) -> None:
        steps.append(step.index)
        if step.index == TAKEN_AT:
            worker.records_wanted()

    worker.sigStep.connect(on_step)
    worker.sigRecords.connect(lambda run_id: announced.append(steps[-1]))
    worker.run(1, {"strategy": "dynamic", "prompt": "Hello there",
                   "settings": {"max_new_tokens": 12, "stop_at_eos": False}})
    assert steps == list(range(12))  # every step is still reported on the worker's thread
    assert announced == [0, TAKEN_AT]  # the first record, then the first once the window took them


def test_the_store_re_arms_its_producers_before_it_reads_the_records(qapp):
    store = RunStore()
    trace = Trace(model={}, strategy={"name": "dynamic", "options": {}})
    run_id = store.add(trace, RUNNING, generating=True)
    store.sync()
    taking = []
    store.sigTaking.connect(lambda: taking.append(store.runs[run_id].n))
    store.sync()
    assert taking == []  # nothing arrived: nothing taken, nobody re-armed
    trace.steps.append(StepRecord(index=0, phase="prefill", token_id=1, token="a", wall_ms=1.0, cache_bytes=0,
                                  predicted_cache_bytes=0, rss_bytes=0, strategy="dynamic", layers=[]))
    store.records_arrived(run_id)
    store.sync()
    assert taking == [0]  # re-armed before the record was read: one appended meanwhile would be announced
    assert store.runs[run_id].n == 1
