"""The engine, the trace format and the CLI never import Qt."""

import subprocess
import sys


def test_engine_imports_no_qt():
    code = (
        "import sys; import kvviz.engine.decode, kvviz.engine.bench, kvviz.files.trace, kvviz.cli.main; "
        "bad = [m for m in sys.modules if m.startswith(('PySide6', 'pyqtgraph', 'kvviz.qt'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
