"""Start the kvviz window: `main()` is what `kvviz` with no arguments runs."""

from __future__ import annotations

import argparse
import os
import sys

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication

from kvviz.qt import theme


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvviz", description="Open the kvviz window.")
    parser.add_argument("--model", default=None, help="model to load at start (default: the last one used)")
    parser.add_argument("--theme", choices=theme.THEMES, default=None, help="colour theme")
    parser.add_argument("--no-load", action="store_true", help="do not load a model at start")
    parser.add_argument(
        "--quit-after", type=float, default=None, metavar="SECONDS", help=argparse.SUPPRESS
    )  # smoke tests: close the window after this many seconds
    args, _qt_args = parser.parse_known_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    """Create the application, show the window (the model loads in the background), run the loop."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "kvviz", *argv])
    app.setApplicationName("kvviz")
    app.setOrganizationName("kvviz")

    from kvviz.qt.main_window import MainWindow  # after QApplication: pyqtgraph reads its config

    settings = QSettings("kvviz", "kvviz")
    if args.theme:
        settings.setValue("view/theme", args.theme)
    spec = args.model or str(settings.value("model/spec", "default"))
    window = MainWindow(settings=settings, autoload=None if args.no_load else spec)
    window.show()
    if args.quit_after is not None:
        QTimer.singleShot(int(args.quit_after * 1000), window.close)
    status = app.exec()
    if window.thread_stuck:
        # A model load that cannot be interrupted (e.g. inside from_pretrained) is still running;
        # the settings are saved, so leave now rather than hang or abort in the thread's destructor.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return int(status)


if __name__ == "__main__":
    raise SystemExit(main())
