"""`kvviz bench`: kvviz's decoder and plain model.generate, each in a fresh process, interleaved."""

import json

from tests.commands import kvviz


def test_bench_compares_with_generate_in_clean_processes(tmp_path):
    out = tmp_path / "bench.json"
    result = kvviz("bench", "--model", "tiny", "--strategies", "sliding:window=8", "--new-tokens", "12",
                   "--repeats", "2", "--out", out)
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert "fresh process" in figures["reference"]
    assert set(figures["strategies"]) == {"sliding (window=8)"}
    for row in figures["strategies"].values():
        assert len(row["generate_runs"]) == len(row["kvviz_runs"]) == 2
        assert row["ratio"] == row["kvviz_tokens_per_s"] / row["generate_tokens_per_s"] > 0
    assert "ratio" in result.stdout and "sliding (window=8)" in result.stdout
