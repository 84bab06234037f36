"""`kvviz trace FILE`: check any kept file (a trace, a conversation, an evaluation, a sweep, a serving run, a server
session) and print its summary."""

from __future__ import annotations

import json
from pathlib import Path

from kvviz.errors import UsageError


def add_parser(subparsers) -> None:
    trace = subparsers.add_parser("trace", help="check a kvviz file (trace, evaluation, sweep, serving run, "
                                  "session) and print its summary")
    trace.add_argument("path", type=Path)
    trace.add_argument("--json", action="store_true", help="as JSON")


def command(args) -> int:
    from kvviz.attach.session import Session
    from kvviz.cli.attach import show_session
    from kvviz.cli.chat import show_conversation
    from kvviz.cli.choose import show_kept_sweep
    from kvviz.cli.eval import show_eval_run
    from kvviz.cli.run import print_summary
    from kvviz.cli.serve import show_serve_run
    from kvviz.files.conversation import ConversationTrace
    from kvviz.files.evaluation import EvalRun
    from kvviz.files.formats import read_kept
    from kvviz.files.jsonfile import KeptFileError
    from kvviz.files.serve_trace import ServeRun
    from kvviz.files.sweep import Sweep

    try:
        kept = read_kept(args.path)
    except KeptFileError as exc:
        raise UsageError(str(exc)) from None
    if isinstance(kept, EvalRun):
        show_eval_run(kept, args.path, args.json)
    elif isinstance(kept, ConversationTrace):
        show_conversation(kept, args.path, args.json)
    elif isinstance(kept, Sweep):
        show_kept_sweep(kept, args.path, args.json)
    elif isinstance(kept, ServeRun):
        show_serve_run(kept, args.path, args.json)
    elif isinstance(kept, Session):
        show_session(kept, kept.url, kept.model, args.json)
    elif args.json:
        print(json.dumps(kept.summary(), indent=2))
    else:
        print_summary(kept, kept.summary(), args.path)
    return 0
