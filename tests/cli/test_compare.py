import csv

from kvviz.files import trace
from tests.commands import kvviz


def test_compare_writes_traces_csv_report_and_figures(tmp_path):
    out = tmp_path / "cmp"
    result = kvviz("compare", "--model", "tiny", "--strategies",
                   "dynamic,quantized:backend=hqq:nbits=2:q_group_size=32,sink:window=8", "--prompt", "compare these",
                   "--max-new-tokens", "12", "--ignore-eos", "--out", out)
    assert result.returncode == 0, result.stderr
    traces = sorted(out.glob("trace-*.json"))
    assert [trace.load(p).strategy["name"] for p in traces] == ["dynamic", "quantized", "sink"]
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["strategy"] for r in rows] == ["dynamic", "quantized", "sink"]
    assert rows[0]["top-1 agreement"] == "1" and rows[0]["mean KL (nats)"] == "0"
    assert float(rows[1]["peak cache MiB"]) < float(rows[0]["peak cache MiB"])
    report = (out / "report.md").read_text()
    for name in ("memory.png", "latency.png", "cache-map-1.png", "cache-map-3.png"):
        assert f"]({name})" in report
        assert (out / name).stat().st_size > 5000  # a real picture, not an empty grab


def test_compare_rejects_bad_strategy_before_running(tmp_path):
    result = kvviz("compare", "--model", "tiny", "--strategies", "dynamic,sliding:window=0", "--prompt", "x",
                   "--out", tmp_path / "o")
    assert result.returncode == 2 and "option 'window' of strategy 'sliding'" in result.stderr
    assert not (tmp_path / "o").exists()
