"""Start the kvviz window: `main()` is what `kvviz` with no arguments runs."""

from __future__ import annotations

import argparse
import os
import sys

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from kvviz import resources
from kvviz.qt import theme, unsaved
from kvviz.qt.log_file import keep_log
from kvviz.qt.quit_signals import QuitSignals


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvviz", description="Open the kvviz window.")
    parser.add_argument("--model", default=None, help="model to load at start (default: the last one that loaded)")
    parser.add_argument("--theme", choices=theme.THEMES, default=None, help="colour theme")
    parser.add_argument("--no-load", action="store_true", help="do not load a model at start")
    parser.add_argument(
        "--open", action="append", default=[], metavar="FILE", help="open a trace or server session file (repeatable)"
    )
    parser.add_argument(
        "--connect", metavar="URL", help="attach to a vLLM server at start (no local model loads unless --model)"
    )
    parser.add_argument(
        "--smoke-test",
        action="store_true",
        help="open the window, generate 4 tokens (model tiny unless --model), close; exit status 0 if all worked",
    )
    parser.add_argument(
        "--quit-after", type=float, default=None, metavar="SECONDS", help=argparse.SUPPRESS
    )  # smoke tests: close the window after this many seconds
    args, _qt_args = parser.parse_known_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    """Create the application, show the window (the model loads in the background), run the loop."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.environ.get("QT_QPA_PLATFORM")):
        if not args.smoke_test:
            print(
                "kvviz: error: no display to open the window on (neither DISPLAY nor WAYLAND_DISPLAY is set). "
                "Run it in a desktop session, under Xvfb (xvfb-run kvviz), or offscreen with "
                "QT_QPA_PLATFORM=offscreen; `kvviz run ...` works without a display.",
                file=sys.stderr,
            )
            return 1
        os.environ["QT_QPA_PLATFORM"] = "offscreen"  # a smoke test needs no screen
    keep_log()
    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "kvviz", *argv])
    app.setApplicationName("kvviz")
    app.setOrganizationName("kvviz")
    app.setDesktopFileName(resources.APP_ID)  # lets Wayland match the window to its launcher entry
    app.setWindowIcon(QIcon(str(resources.icon_path(256))))

    from kvviz.qt.main_window import MainWindow  # after QApplication: pyqtgraph reads its config

    if args.smoke_test:
        # never touch the user's settings; a temporary INI file instead
        import tempfile

        ini = os.path.join(tempfile.mkdtemp(prefix="kvviz-smoke-"), "kvviz.ini")
        settings = QSettings(ini, QSettings.Format.IniFormat)
        spec = args.model or "tiny"
    else:
        settings = QSettings("kvviz", "kvviz")
        spec = args.model or str(settings.value("model/spec", "default"))
    if args.theme:
        settings.setValue("view/theme", args.theme)
    skip_load = (args.no_load or (args.connect and not args.model)) and not args.smoke_test
    window = MainWindow(settings=settings)
    if not skip_load:
        load_at_start(window, spec, remembered=args.model is None and not args.smoke_test)
    problems = open_kept_files(window, args.open)
    if args.connect:
        window.modes["server"].connect_requested(args.connect)
    window.show()
    unsaved.clean()  # what windows that ended left, beyond the rule Help ▸ About says
    window.say_left_behind()
    if args.quit_after is not None:
        QTimer.singleShot(int(args.quit_after * 1000), window.close)
    outcome = {"status": 0 if not problems else 1}
    if args.smoke_test:
        _smoke(window, outcome)
    quit_signals = QuitSignals(app)  # Ctrl-C in the terminal, or SIGTERM: closed as by its close button
    quit_signals.sigReceived.connect(window.close)
    try:
        status = app.exec()
    finally:
        quit_signals.restore()
        if not window.closing:  # the loop ended some other way (an exception): still stop the worker
            window.save_settings()
            window.shutdown()
    if args.smoke_test or problems:  # an --open file that could not be read: status 1, as the message said
        status = outcome["status"]
    return int(quit_signals.exit_status() or status)


FALLBACK_SPEC = "default"


def load_at_start(window, spec: str, remembered: bool) -> None:
    """Load the model a start asks for. A remembered model that no longer loads (a folder moved or deleted)
    gives way to the default model, and the window says so once that one has loaded."""
    if remembered and spec != FALLBACK_SPEC:

        def loaded(loaded_spec: str, ok: bool) -> None:
            window.sigModelReady.disconnect(loaded)
            if ok:
                return
            reason = window.last_error

            def fallen_back(fallback_spec: str, fallback_ok: bool) -> None:
                window.sigModelReady.disconnect(fallen_back)
                if fallback_ok:  # its own failure speaks for itself otherwise
                    window.show_error(f"{reason}. The model used last did not load, so the {FALLBACK_SPEC} model "
                                      "is loaded instead.")

            window.sigModelReady.connect(fallen_back)
            window.load_model(FALLBACK_SPEC)

        window.sigModelReady.connect(loaded)
    window.load_model(spec)


def open_kept_files(window, paths: list[str]) -> list[str]:
    """`--open FILE ...`: each kvviz file shown in the window; the messages of those that could not be read."""
    from kvviz.files.formats import read_kept
    from kvviz.files.jsonfile import KeptFileError

    problems = []
    for path in paths:
        try:
            window.show_kept(read_kept(path))
        except KeptFileError as exc:
            problems.append(str(exc))
            window.show_error(str(exc))
            print(f"kvviz: error: {exc}", file=sys.stderr)
    return problems


def _smoke(window, outcome: dict, timeout_s: float = 300.0) -> None:
    """Load, run 4 tokens through the window's own controls, then close (status 1 on any failure)."""

    def fail(message: str) -> None:
        print(f"kvviz smoke test failed: {message}", file=sys.stderr)
        outcome["status"] = 1
        window.close()

    def loaded(spec: str, ok: bool) -> None:
        if not ok:
            fail(window.last_error)
            return
        window.controls.settings_panel.max_new_tokens.setValue(4)
        if window.start_run() is None:
            fail(window.last_error or "the Run button was not enabled")

    def done(run_id: int, status: str) -> None:
        if status != "finished":
            fail(f"run ended as {status}: {window.last_error}")
            return
        window.close()

    window.sigModelReady.connect(loaded)
    window.sigRunDone.connect(done)
    QTimer.singleShot(int(timeout_s * 1000), lambda: fail(f"no result after {timeout_s:.0f} s"))


if __name__ == "__main__":
    raise SystemExit(main())
