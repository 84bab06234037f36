"""What several commands share: the model and generation arguments, the prompt, strategy lists and stderr."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvviz.errors import OptionError, UsageError

MODEL_HELP = "default (SmolLM2-135M-Instruct, the default), tiny, a model directory, a .gguf file or a hub id"


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help=MODEL_HELP)
    parser.add_argument("--dtype", default="auto", help="auto (float32 on CPU, the default), float32, bfloat16 or "
                        "float16")
    parser.add_argument("--device", default="auto", help="auto (the default), cpu, cuda or cuda:N")


def add_strategy_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", default="dynamic", metavar="NAME[:KEY=VALUE...]",
                        help="cache strategy, with its options if any, e.g. sink:window=60 (default: dynamic; see "
                        "`kvviz strategies`)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a strategy option (repeatable)"
    )


def strategy_choice(args):
    """`--strategy NAME[:KEY=VALUE...]` with any `--set KEY=VALUE` added, checked (a StrategyChoice)."""
    from kvviz.engine import strategies

    name, *pairs = args.strategy.split(":")
    return strategies.choose(name.strip(), strategies.parse_assignments(pairs + args.set))


def add_switch_arg(parser: argparse.ArgumentParser, steps: str = "step STEP") -> None:
    """`--switch-at STEP:NAME[:KEY=VALUE...]`, repeatable; `steps` says which steps STEP counts."""
    parser.add_argument("--switch-at", action="append", default=[], metavar="STEP:NAME[:KEY=VALUE...]",
                        help=f"switch the live cache to another strategy before {steps}, e.g. "
                        "64:quantized:backend=hqq (repeatable)")


def parse_switches(specs: list[str]) -> dict[int, object]:
    """``["64:quantized:backend=hqq"]`` -> {64: StrategyChoice}; validated before any work. Commas after the name
    (``64:quantized,backend=hqq``, the older form) are accepted too."""
    from kvviz.engine import strategies

    switches = {}
    for spec in specs:
        step, sep, rest = spec.partition(":")
        if not sep or not step.strip().isdigit() or int(step) < 1 or not rest:
            raise UsageError(f"--switch-at expects STEP:NAME[:KEY=VALUE...] with STEP >= 1, got {spec!r}")
        switches[int(step)] = strategies.parse_spec(rest.replace(",", ":"))
    return dict(sorted(switches.items()))


def check_switch_order(first, switches, model) -> None:
    """Refuse, before the run, a switch that cannot convert whatever the cache holds (the rest: at the switch)."""
    from kvviz.engine.convert import refusal

    current = first
    for step, choice in switches.items():
        problem = refusal(current, choice, model, evicted=None)
        if problem:
            raise OptionError(f"--switch-at {step}: cannot switch from {current.name!r} to {choice.name!r}: {problem}")
        current = choice


def add_generation_args(parser: argparse.ArgumentParser, prompt: bool = True,
                        new_tokens_help: str = "tokens to generate at most (default 128)") -> None:
    """The generation settings, and the prompt unless `prompt` is False (a chat's messages come otherwise)."""
    if prompt:
        given = parser.add_mutually_exclusive_group()
        given.add_argument("--prompt", help="the prompt text")
        given.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    parser.add_argument("--max-new-tokens", type=int, default=128, help=new_tokens_help)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (1 = off)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    parser.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    parser.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")


def read_prompt(args) -> str:
    if args.prompt_file is not None:
        try:
            return args.prompt_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read the prompt file {args.prompt_file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise UsageError(f"the prompt file {args.prompt_file} is not UTF-8 text") from None
    if args.prompt is None:
        raise UsageError("give a prompt with --prompt TEXT or --prompt-file FILE")
    return args.prompt


def check_writable(path: Path, flag: str) -> None:
    """Refuse, before any work, a file path a command could not write (so that a finished run is never lost)."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder; give a file name such as {path / 'run.json'}")
    if not folder.is_dir():
        raise UsageError(f"cannot write the trace to {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"cannot write the trace to {path}: the folder {folder} is not writable")


def generation_settings(args):
    """The run's GenerationSettings from the generation arguments, checked."""
    from kvviz.engine.decode import GenerationSettings

    settings = GenerationSettings(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        raw=args.raw,
        stop_at_eos=not args.ignore_eos,
    )
    settings.check()
    return settings


def strategy_list(text: str) -> list:
    """`--strategies`: comma-separated NAME or NAME:KEY=VALUE:KEY=VALUE, each checked (StrategyChoice list)."""
    from kvviz.engine import strategies

    return strategies.parse_list([spec for spec in text.split(",") if spec.strip()])


def log(message: str) -> None:
    print(f"kvviz: {message}", file=sys.stderr, flush=True)


def notice(message: str) -> None:
    if message:
        print(f"\nkvviz: {message}", file=sys.stderr, flush=True)


def progress(message: str, fraction: float | None) -> None:
    pct = "" if fraction is None else f" [{fraction * 100:3.0f}%]"
    print(f"kvviz:{pct} {message}", file=sys.stderr, flush=True)


def document(args):
    """The text `--text FILE` or `--builtin NAME` names, checked."""
    from kvviz.files import documents

    try:
        return documents.builtin(args.builtin) if args.builtin is not None else documents.from_file(args.text)
    except documents.DocumentError as exc:
        raise UsageError(str(exc)) from None


def out_folder(out: Path | None) -> Path | None:
    """The output folder, created and checked before any work so that what is measured is never lost to it."""
    if out is None:
        return None
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for the files it writes")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the folder {out}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK):
        raise UsageError(f"cannot write into the folder {out}: it is not writable")
    return out
