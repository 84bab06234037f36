"""The command line: one module per command in this package, each with `add_parser(subparsers)` and
`command(args) -> int`; this module builds the parser and runs a command.

Exit status: 0 success, 1 runtime failure, 2 usage or option error, 130 interrupted (Ctrl-C) and
143 terminated (SIGTERM), both after writing what was measured. Errors print one paragraph;
``--debug`` adds the traceback. Only commands that run a model import torch: reading files,
listing strategies and attaching to a server start without it (each command module imports its
heavy parts inside `command`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

from kvviz import __version__, interrupts
from kvviz.cli import (
    answer_bench,
    attach,
    bench,
    chat,
    chat_bench,
    choose,
    compare,
    demo,
    model,
    run,
    serve,
    strategies,
    trace,
)
from kvviz.cli import eval as evaluate
from kvviz.errors import ModelError, OptionError, UsageError

# In the order `kvviz --help` lists them.
COMMANDS = {
    "run": run,
    "chat": chat,
    "compare": compare,
    "attach": attach,
    "serve": serve,
    "eval": evaluate,
    "choose": choose,
    "demo": demo,
    "strategies": strategies,
    "model": model,
    "trace": trace,
    "bench": bench,
    "chat-bench": chat_bench,
    "answer-bench": answer_bench,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvviz",
        description="See the key-value cache of a transformer language model while it generates. "
        "Without a command, opens the window.",
        epilog="window: kvviz [--model SPEC] [--theme dark|light] [--no-load] [--open FILE ...] [--connect URL] "
        "[--smoke-test]  (--connect attaches the window to a vLLM server; --smoke-test opens the window, runs 4 "
        "tokens on the tiny model and exits 0 on success)",
    )
    parser.add_argument("--version", action="version", version=f"kvviz {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def _tolerant_output() -> None:
    """Characters the terminal's encoding cannot show are replaced, never fatal (the run and its trace matter more)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")


def main(argv: list[str] | None = None) -> int:
    _tolerant_output()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    _log_tracebacks(args.debug)
    with interrupts.caught():
        try:
            return COMMANDS[args.command].command(args)
        except (UsageError, OptionError) as exc:
            _report(args, exc)
            return 2
        except KeyboardInterrupt as exc:
            return interrupts.said(exc)
        except Exception as exc:
            if isinstance(exc, (ModelError, RuntimeError, OSError)):
                _report(args, exc)
            else:  # a failure inside torch/transformers: still one readable paragraph
                _report(args, f"{type(exc).__name__}: {exc} (run with --debug for the traceback)", exc)
            return 1


def _log_tracebacks(debug: bool) -> None:
    """kvviz's log (a failure's traceback, kvviz.errors.failure) goes to stderr with --debug, nowhere without."""
    logger = logging.getLogger("kvviz")
    for handler in [h for h in logger.handlers if getattr(h, "kvviz_cli", False)]:
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr) if debug else logging.NullHandler()
    handler.kvviz_cli = True
    handler.setFormatter(logging.Formatter("kvviz: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)


def _report(args, message, exc: BaseException | None = None) -> None:
    exc = exc or message
    if args.debug:
        traceback.print_exception(exc)
    print(f"kvviz: error: {message}", file=sys.stderr)
