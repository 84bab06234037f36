"""`kvviz chat`: a conversation with the cache kept across turns, from a script or typed at a prompt.

Each turn prints the reply (streamed) and a line of figures: tokens the turn fed and kept, time to first token,
decode speed, cache bytes, tokens evicted, and with --compare-reprefill a full prefill of the whole history
measured beside it. Ctrl-C or SIGTERM keeps every finished turn in the trace; with --trace each finished turn is
also journaled as it ends (FILE.journal), so that a chat killed without warning loses at most the turn in progress
(`kvviz trace FILE.journal` shows what it holds, and the window opens it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvviz import interrupts
from kvviz.cli import common
from kvviz.errors import OptionError, UsageError
from kvviz.present import conversation_turn

NEW_CHAT = "/new"  # a script line (or a typed one) that starts a new chat from the cached system prompt
REGENERATE = "/regenerate"  # typed: the last answer again


def add_parser(subparsers) -> None:
    chat = subparsers.add_parser("chat", help="a conversation with the cache kept across turns (a script or typed)")
    common.add_model_args(chat)
    common.add_strategy_args(chat)
    common.add_switch_arg(chat, "the conversation's step STEP: steps count every token generated, across all the "
                          "answers from the first on (mid-answer, or before the next turn when an answer ends there)")
    common.add_generation_args(chat, prompt=False, new_tokens_help="tokens each reply may have (default 128)")
    chat.add_argument("--script", type=Path, help="the user's messages: a text file with one message per line (blank "
                      f"lines skipped, a line {NEW_CHAT} starts a new chat from the cached system prompt), or a JSON "
                      'list of messages (strings, or {"role": "user", "content": ...}; a first {"role": "system"} '
                      "sets the system prompt). Without it, type the messages")
    chat.add_argument("--system", default="", help="the system prompt")
    chat.add_argument("--compare-reprefill", action="store_true",
                      help="after each turn, measure a full prefill of the whole history into a fresh cache (time to "
                      "first token without the kept cache, and how far its logits are from the kept cache's)")
    chat.add_argument("--trace", type=Path, help="write the conversation trace here (kvviz-conversation JSON; each "
                      "finished turn is journaled in FILE.journal meanwhile, which a kill leaves behind)")
    chat.add_argument("--json", action="store_true", help="print the turns as JSON on stdout at the end")
    chat.add_argument("--quiet", action="store_true", help="do not stream the replies")


def read_script(path: Path) -> tuple[str | None, list[str]]:
    """The script's system prompt (None: it sets none) and its lines: messages, or NEW_CHAT."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read the script {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"the script {path} is not UTF-8 text") from None
    if path.suffix.lower() != ".json":
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not any(line != NEW_CHAT for line in lines):
            raise UsageError(f"the script {path} has no message; write one message per line")
        return None, lines
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"the script {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                         "give a JSON list of messages, or a text file with one message per line") from None
    return _json_messages(data, path)


def _json_messages(data, path: Path) -> tuple[str | None, list[str]]:
    expected = 'a string or {"role": "user", "content": "..."}'
    if not isinstance(data, list) or not data:
        raise UsageError(f"the script {path} must be a JSON list of messages, each {expected}")
    system, messages = None, []
    for i, item in enumerate(data):
        if isinstance(item, dict) and item.get("role") == "system" and i == 0 and isinstance(item.get("content"), str):
            system = item["content"]
            continue
        if isinstance(item, dict) and item.get("role") == "user" and isinstance(item.get("content"), str):
            item = item["content"]
        if not isinstance(item, str):
            raise UsageError(f"the script {path}: message {i} is not {expected} (a system message may only come "
                             "first; the replies are the model's to write)")
        if not item.strip():
            raise UsageError(f"the script {path}: message {i} is empty; every message needs some text")
        messages.append(item)
    if not messages:
        raise UsageError(f"the script {path} has no user message")
    return system, messages


def _typed():
    """The user's messages typed at a prompt, until end of input."""
    print(f"kvviz: type a message and Enter; {NEW_CHAT} starts a new chat, {REGENERATE} answers the last message "
          "again, Ctrl-D ends", file=sys.stderr)
    while True:
        try:
            yield input("you> ")
        except EOFError:
            print(file=sys.stderr)
            return


def command(args) -> int:
    from kvviz.engine import models
    from kvviz.engine.conversation import Conversation

    choice = common.strategy_choice(args)
    switches = common.parse_switches(args.switch_at)
    settings = common.generation_settings(args)
    system, lines = read_script(args.script) if args.script else (None, None)
    if system is not None and args.system:
        raise UsageError(f"the script {args.script} sets a system prompt and so does --system; give one of them")
    system = system if system is not None else args.system
    if args.trace is not None:
        common.check_writable(args.trace, "--trace")
    loaded = models.load_model(args.model, dtype=args.dtype, device=args.device, progress=common.progress)
    common.check_switch_order(choice, switches, loaded.model)
    conversation = Conversation(loaded, choice, settings, system=system, notify=common.notice)
    journal = None
    if args.trace is not None:
        from kvviz.files.conversation import ConversationJournal

        journal = ConversationJournal(args.trace, conversation.trace)
    messages = lines if lines is not None else _typed()
    total = sum(line != NEW_CHAT for line in lines) if lines is not None else None
    stream = not (args.json or args.quiet)
    if not args.json:
        common.log(f"{loaded.card['name']}, {choice.label()}, turns written with {conversation.trace.template}")
    interrupted = refused = None
    try:
        for line in messages:
            if line.strip() == NEW_CHAT:
                conversation.new_chat()
                _say_new_chat(conversation)
                continue
            try:
                turn = conversation.regenerate() if line.strip() == REGENERATE else conversation.send(line)
            except OptionError as exc:
                if lines is not None:  # a script cannot go on past a turn it cannot take
                    conversation.trace.error = str(exc)
                    raise
                common.log(str(exc))
                continue
            if stream and lines is not None:
                print(f"you> {line}")
            for step in turn:
                if stream:
                    sys.stdout.write(step.token)
                    sys.stdout.flush()
                refused = refused or _switch_if_due(conversation, switches)
            if stream:
                print()
            if refused:  # the cache cannot become what --switch-at asks: the chat stops there, its turns kept
                conversation.trace.error = str(refused)
                break
            if args.compare_reprefill:
                conversation.reprefill(turn)
            if journal is not None:
                journal.update()
            if not args.json:
                common.log(conversation_turn(turn.record, total))
    except KeyboardInterrupt as exc:
        conversation.trace.cancelled = True
        interrupted = exc
    finally:
        if args.trace is not None:
            try:
                conversation.trace.save(args.trace)
            except OSError as exc:
                raise RuntimeError(f"cannot write the trace to {args.trace}: {exc.strerror or exc}") from None
            if journal.journal.problem:
                common.log(journal.journal.problem)
            journal.remove()
    if args.json:
        from dataclasses import asdict

        out = {"model": loaded.card["name"], "strategy": conversation.trace.strategy,
               "template": conversation.trace.template, **conversation.trace.summary(),
               "prefix": asdict(conversation.trace.prefix) if conversation.trace.prefix else None,
               "cancelled": conversation.trace.cancelled, "trace": str(args.trace) if args.trace else None,
               "turn_records": [asdict(t) for t in conversation.trace.turns]}
        print(json.dumps(out, indent=2))
    elif args.trace is not None:
        common.log(f"conversation trace: {args.trace}")
    if refused:
        raise refused
    return interrupts.exit_status(interrupted) if interrupted else 0


def _switch_if_due(conversation, switches: dict) -> OptionError | None:
    """Ask for the --switch-at switch due before the conversation's next step (mid-answer, or at the next turn
    when the answer ends here); its refusal, as `kvviz run` gives it, stops the answer after this step."""
    step = len(conversation.trace.steps)
    if step not in switches:
        return None
    try:
        conversation.request_switch(switches[step])
    except OptionError as exc:
        conversation.cancel()
        return OptionError(f"--switch-at {step}: {exc}")
    return None


def _say_new_chat(conversation) -> None:
    from kvviz.present import mib, ms

    prefix = conversation.trace.prefix
    if prefix is None:
        common.log("new chat: the chats share no prefix to cache, so it starts empty")
    else:
        copied = conversation.pending_copy_bytes
        common.log(f"new chat from the cached prefix: {prefix.tokens:,} tokens, {mib(prefix.cache_bytes)} kept, "
                   f"{mib(copied)} copied for this chat; saves its prefill ({ms(prefix.prefill_ms)})")


def show_conversation(trace, path, as_json: bool) -> None:
    """`kvviz trace FILE` for a kept conversation."""
    from dataclasses import asdict

    summary = trace.summary()
    if as_json:
        print(json.dumps({**summary, "turn_records": [asdict(t) for t in trace.turns]}, indent=2))
        return
    from kvviz.present import mib, ms, strategy_label

    print(f"{path}: a conversation of {trace.model.get('name', '?')} with {strategy_label(trace.strategy)}, "
          f"{summary['turns']} turns in {summary['chats']} chat(s), {summary['tokens_in_context']:,} tokens in context"
          + (" (cancelled)" if trace.cancelled else ""))
    print(f"  time to first token {ms(summary['ttft_ms_mean'])} mean; cache {mib(summary['final_cache_bytes'])} at "
          f"the end, {mib(summary['peak_cache_bytes'])} peak; {summary['evicted']:,} tokens evicted")
    for turn in trace.turns:
        print("  " + conversation_turn(turn, len(trace.turns)).replace("\n", "\n  "))
