"""The memory-bound floor: bandwidth measured once and kept, and the weight bytes a decode step reads."""

import json

import torch

from kvviz.engine import machine
from kvviz.engine.measure import weight_read_bytes


def test_bandwidth_measured_once_then_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    cpu = torch.device("cpu")
    first = machine.memory_bandwidth(cpu)
    assert first > 1e8  # any machine reads more than 100 MB/s
    kept = json.loads((tmp_path / machine.BANDWIDTH_FILE).read_text())
    assert kept[machine.machine_key(cpu)]["bytes_per_s"] == first
    assert machine.memory_bandwidth(cpu) == first  # read back, not measured again


def test_measuring_again_keeps_the_best_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    cpu = torch.device("cpu")
    key = machine.machine_key(cpu)
    (tmp_path / machine.BANDWIDTH_FILE).write_text(json.dumps({key: {"bytes_per_s": 1e15}}))
    assert machine.memory_bandwidth(cpu, force=True) == 1e15


def test_a_damaged_bandwidth_file_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    (tmp_path / machine.BANDWIDTH_FILE).write_text("[1, 2")
    assert machine.memory_bandwidth(torch.device("cpu")) > 1e8


def test_weight_bytes_count_a_tied_embedding_once(default_model):
    model = default_model.model
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    assert weight_read_bytes(model) == sum(p.numel() * p.element_size() for p in model.parameters())
    assert default_model.card["weight_bytes"] == weight_read_bytes(model)


def test_an_untied_input_embedding_counts_one_row(tiny_model):
    import copy

    model = copy.deepcopy(tiny_model.model)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    table = model.get_input_embeddings().weight
    every = sum(p.numel() * p.element_size() for p in model.parameters())
    assert weight_read_bytes(model) == every - table.numel() * 4 + table.shape[1] * 4


def test_bench_measures_the_bandwidth_of_the_device_its_runs_used(monkeypatch):
    """--device auto on a CUDA machine runs on CUDA: the bandwidth beside the runs' rates is the GPU's."""
    from kvviz.engine import bench

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(machine, "memory_bandwidth", lambda device, force=False: asked.append(device) or 1e12)
    figures = bench.run_bench("tiny", [], new_tokens=4, repeats=1, device="auto")
    assert asked == [torch.device("cuda")] and figures["bandwidth_bytes_per_s"] == 1e12
