"""`kvviz compare`: one prompt through several strategies, headless, and a report of the results.

Writes into the output folder: one trace per strategy, `summary.csv`, and `report.md` with PNG
figures drawn offscreen by the window's own plot widgets (kvviz.qt.tools.figures).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from kvviz import present
from kvviz.cli import common
from kvviz.files import report
from kvviz.files.trace import Trace

Log = Callable[[str, "float | None"], None]


def add_parser(subparsers) -> None:
    compare = subparsers.add_parser("compare", help="run one prompt through several strategies and write a report")
    common.add_model_args(compare)
    compare.add_argument(
        "--strategies",
        default="dynamic,static,quantized,sink",
        help="comma-separated NAME or NAME:KEY=VALUE:KEY=VALUE, e.g. dynamic,quantized:backend=hqq:nbits=2 "
        "(default: dynamic,static,quantized,sink)",
    )
    common.add_generation_args(compare)
    compare.add_argument("--no-reference", action="store_true", help="skip the fidelity reference (faster)")
    compare.add_argument("--out", type=Path, required=True, help="folder for traces, summary.csv and report.md")


def command(args) -> int:
    prompt = common.read_prompt(args)
    choices = common.strategy_list(args.strategies)
    settings = common.generation_settings(args)
    path = compare(
        args.model, choices, settings, prompt, args.out, reference=not args.no_reference,
        dtype=args.dtype, device=args.device, log=common.progress,
    )
    print(f"kvviz: wrote {path}, {args.out / 'summary.csv'} and one trace per strategy", file=sys.stderr)
    return 0


def run_all(loaded, choices, settings, prompt: str, reference: bool, log: Log) -> list[Trace]:
    """Each strategy's run of the prompt (LoadedModel, StrategyChoice list, GenerationSettings), in order."""
    from kvviz.engine import decode

    # validate every strategy against the model before generating anything
    decoders = [decode.Decoder(loaded, c, settings, prompt, reference=reference) for c in choices]
    traces = []
    for i, decoder in enumerate(decoders):
        log(f"{decoder.choice.label()} ({i + 1}/{len(decoders)})", i / len(decoders))
        if decoder.prompt_note:
            log(decoder.prompt_note, None)
        for _ in decoder:
            pass
        traces.append(decoder.trace)
    return traces


def write_report(traces: list[Trace], out: Path, figures: dict[str, Path]) -> Path:
    rows = [present.run_row(f"#{i + 1}", t) for i, t in enumerate(traces)]
    report.write_csv(rows, out / "summary.csv")
    first = traces[0]
    lines = [
        "# kvviz comparison",
        "",
        f"Model **{first.model.get('name')}** ({first.model.get('architecture')}, {first.model.get('dtype')} on "
        f"{first.model.get('device')}), prompt of {first.prompt_tokens} tokens, "
        f"{first.settings.get('max_new_tokens')} new tokens per run.",
        "",
        "## At a glance",
        "",
        report.markdown_table(
            rows,
            ["run", "strategy", "options", "final_cache_mib", "peak_cache_mib", "decode_tokens_per_s",
             "top1_agreement", "mean_kl", "first_divergence"],
        ),
        "",
        "Memory is the cache's real allocation; speed is decode tokens/s without the prefill; fidelity compares "
        "each step's next-token distribution with a full-precision DynamicCache reference run on the same tokens "
        "(top-1 agreement 1 and KL 0 mean identical).",
        "",
    ]
    for title, path in figures.items():
        lines += [f"## {title}", "", f"![{title}]({path.name})", ""]
    lines += ["## All numbers", "", report.markdown_table(rows, [k for k, _ in report.COLUMNS]), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def compare(
    model_spec: str,
    choices: list,
    settings,
    prompt: str,
    out: Path,
    reference: bool = True,
    dtype: str = "auto",
    device: str = "auto",
    log: Log = lambda message, fraction: None,
) -> Path:
    from kvviz.engine import models

    out.mkdir(parents=True, exist_ok=True)
    loaded = models.load_model(model_spec, dtype=dtype, device=device, progress=log)
    traces = run_all(loaded, choices, settings, prompt, reference, log)
    for i, trace in enumerate(traces):
        trace.save(out / f"trace-{i + 1}-{trace.strategy['name']}.json")
    from kvviz.qt.tools.figures import render_comparison  # Qt only here, and only to draw

    figures = render_comparison(traces, out)
    return write_report(traces, out, figures)
