"""`kvviz demo`: the scripted tour of the window (kvviz.qt.tools.demo), optionally recorded."""

from __future__ import annotations

from pathlib import Path

from kvviz.errors import UsageError


def add_parser(subparsers) -> None:
    demo = subparsers.add_parser("demo", help="a scripted tour of the window, sized for a 1080p screen recording")
    demo.add_argument("--record", type=Path, default=None, help="record it to this MP4 (or GIF) file")
    demo.add_argument("--model", default="default", help="model for the tour (default: default)")
    demo.add_argument("--tokens", type=int, default=64, help="tokens per step of the tour (default 64)")


def command(args) -> int:
    if args.record is not None and args.record.suffix.lower() not in (".mp4", ".gif"):
        raise UsageError(f"--record writes .mp4 or .gif files, not {args.record.name!r}")
    from kvviz.qt.tools.demo import run_demo

    return run_demo(args.record, model=args.model, tokens=args.tokens)
