"""Commands that only read files, list options or talk to a server start without importing torch."""

import subprocess
import sys

import pytest

from kvviz.files.trace import LayerRecord, StepRecord, Trace
from tests.attach.test_session_cli import recorded_session

CHECK = (
    "import sys\n"
    "from kvviz.__main__ import main\n"
    "try:\n"
    "    status = main(sys.argv[1:])\n"
    "except SystemExit as exit:\n"
    "    status = exit.code\n"
    "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
    "print('HEAVY', heavy, 'STATUS', status)\n"
)


def run_and_list_heavy_imports(*args) -> str:
    result = subprocess.run([sys.executable, "-c", CHECK, *args], capture_output=True, text=True, timeout=120)
    return result.stdout.splitlines()[-1]


def small_trace() -> Trace:
    layer = LayerRecord(128, 128, 2, 2, storage={"full": 256}, spans=[[2, 2]])
    step = StepRecord(0, "prefill", 7, "a", 3.0, 256, 256, 10_000_000, "dynamic", [layer], position=2)
    return Trace(model={"name": "m"}, strategy={"name": "dynamic", "options": {}}, prompt="hi", prompt_tokens=2,
                 steps=[step])


@pytest.mark.parametrize("kind", ["version", "strategies-help", "trace", "attach-session"])
def test_starts_without_torch(tmp_path, kind):
    if kind == "trace":
        args = ["trace", str(small_trace().save(tmp_path / "t.json"))]
    elif kind == "attach-session":
        args = ["attach", str(recorded_session().save(tmp_path / "s.json"))]
    else:
        args = {"version": ["--version"], "strategies-help": ["strategies", "--help"]}[kind]
    assert run_and_list_heavy_imports(*args) == "HEAVY [] STATUS 0"


def test_the_check_sees_torch_when_a_command_needs_it():
    # listing the strategies asks torch whether CUDA is here (offloading); transformers only builds caches
    assert run_and_list_heavy_imports("strategies") == "HEAVY ['torch'] STATUS 0"
