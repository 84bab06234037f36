"""Make the README screenshots from real runs: `python -m kvviz.qt.tools.screenshot docs/`.

Runs the default model twice through the window (a growing dynamic cache, then an attention-sink
cache whose window evicts the middle), overlays both, and saves `QWidget.grab()` of the window at each
size and theme asked for: by default docs/screenshot-window.png (1600x1000, dark) and
docs/screenshot-<width>x<height>-<theme>.png at 1280x720 and 1920x1080 in both themes. Then
docs/screenshot-eviction.png: about 400 tokens of Alice in Wonderland decoded with a dynamic cache that
switches live to H2O, the cache map showing what each layer's KV heads kept. Then docs/screenshot-hybrid.png
(1920x1080, dark): a random model of Qwen3-Next's shape (gated DeltaNet layers with a fixed-size state, every fourth
layer full attention), run with a dynamic and then a sliding-window cache, state layers and attention layers side by
side. `--only hybrid` makes that one alone; `--hybrid-sizes` adds it at 1280x720 and in the light theme (for checking
the layout; the README shows the first).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvviz.qt.tools import drive

PROMPT = (
    "Write a detailed, step by step explanation of how a transformer language model generates text one "
    "token at a time, and why it keeps a key-value cache while it does so."
)
MAIN = ("screenshot-window.png", (1600, 1000), "dark")  # the README's and the AppStream metainfo's picture
SIZES = ((1280, 720), (1920, 1080))
EVICTION = ("screenshot-eviction.png", (1600, 1000), "dark")
EVICTION_PROMPT_CHARS = 1500  # of Alice in Wonderland's first chapter: about 400 tokens
EVICTION_SWITCH = ("h2o", {"budget": 96})
HYBRID = ("screenshot-hybrid.png", (1920, 1080), "dark")
HYBRID_CHECKS = (("screenshot-hybrid-1280x720-dark.png", (1280, 720), "dark"),
                 ("screenshot-hybrid-1920x1080-light.png", (1920, 1080), "light"))
HYBRID_RUNS = (("dynamic", {}), ("sliding", {"window": 48}))


def shots(folder: str | os.PathLike) -> list[tuple[Path, tuple[int, int], str]]:
    """(path, size, theme) of every screenshot the README references."""
    folder = Path(folder)
    name, size, theme_name = MAIN
    wanted = [(folder / name, size, theme_name)]
    for width, height in SIZES:
        for theme_name in ("dark", "light"):
            wanted.append((folder / f"screenshot-{width}x{height}-{theme_name}.png", (width, height), theme_name))
    return wanted


def open_window(size: tuple[int, int], model: str):
    """`drive.scratch_window` with `model` loaded, offscreen (a picture never depends on the desktop it is made on)."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    return drive.scratch_window("kvviz-screenshot", size, model)


def grab(app, window, path: Path, size: tuple[int, int], theme_name: str) -> Path:
    window.resize(*size)
    window.reset_layout()  # every picture as a first start at that size looks
    window.set_theme(theme_name)
    drive.pause(0.3)  # layout, then the redraw the theme asked for
    window.redraw()
    for _ in range(10):
        app.processEvents()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not window.grab().save(str(path)):
        raise OSError(f"could not write {path}")
    return path


def make(wanted: list[tuple[Path, tuple[int, int], str]], model: str = "default", tokens: int = 96) -> list[Path]:
    saved = []
    with open_window(wanted[0][1], model) as (app, window):
        window.controls.prompt_panel.set_text(PROMPT)
        runs = []
        for strategy, options in (("dynamic", {}), ("sink", {"sink_tokens": 4, "window": 60})):
            drive.choose(window, strategy, options)
            runs.append(drive.run(window, tokens))
        window.runs_table.select_runs(runs)
        for path, size, theme_name in wanted:
            saved.append(grab(app, window, path, size, theme_name))
    return saved


def make_eviction(folder: str | os.PathLike, model: str = "default", tokens: int = 64) -> Path:
    """The eviction picture: a dynamic cache switched live to H2O halfway through `tokens` new tokens."""
    from kvviz.files.documents import builtin

    name, size, theme_name = EVICTION
    with open_window(size, model) as (app, window):
        text = builtin("alice").text
        start = text.index("Alice was beginning")
        window.controls.prompt_panel.set_text(text[start : start + EVICTION_PROMPT_CHARS])
        drive.choose(window, "dynamic")
        window.controls.settings_panel.max_new_tokens.setValue(tokens)
        run_id = window.start_run({"stop_at_eos": False})
        if run_id is None:
            raise RuntimeError(window.last_error)
        drive.wait(lambda: window.store.runs[run_id].n >= tokens // 2, 600)
        drive.choose(window, *EVICTION_SWITCH)
        window.switch_strategy()
        drive.wait(lambda: window.store.generating is None, 900)
        return grab(app, window, Path(folder) / name, size, theme_name)


def hybrid_model(folder: Path) -> Path:
    """A model of Qwen3-Next's shape with seeded random weights (8 layers: gated DeltaNet linear attention, every
    fourth layer full attention), saved in `folder` with the default model's tokenizer, as a model folder the window
    loads like any other. Random weights write nonsense, but the cache is the shape's own."""
    import transformers

    from kvviz.engine.model_cache import default_tokenizer
    from kvviz.engine.model_files import quiet_transformers
    from kvviz.engine.models import build_random_model

    tokenizer = default_tokenizer()
    special = dict(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                   pad_token_id=tokenizer.eos_token_id)
    config = transformers.Qwen3NextConfig(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32,
        linear_value_head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, max_position_embeddings=4096, **special)
    with quiet_transformers():
        build_random_model(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return folder


def make_hybrid(folder: str | os.PathLike, tokens: int = 96, checks: bool = False) -> list[Path]:
    """The hybrid picture (and with `checks` the same window at 1280x720 and in the light theme)."""
    import tempfile

    wanted = [HYBRID, *(HYBRID_CHECKS if checks else ())]
    with tempfile.TemporaryDirectory(prefix="kvviz-hybrid-") as scratch:
        model = hybrid_model(Path(scratch) / "qwen3-next-shape-random")
        with open_window(wanted[0][1], str(model)) as (app, window):
            window.controls.prompt_panel.set_text(PROMPT)
            runs = []
            for strategy, options in HYBRID_RUNS:
                drive.choose(window, strategy, options)
                runs.append(drive.run(window, tokens))
            window.runs_table.select_runs(runs)
            return [grab(app, window, Path(folder) / name, size, theme_name) for name, size, theme_name in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="docs")
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--only", choices=("hybrid",), help="make only this picture")
    parser.add_argument("--hybrid-sizes", action="store_true",
                        help="also the hybrid picture at 1280x720 and in the light theme")
    args = parser.parse_args(argv)
    if args.only is None:
        for path in make(shots(args.folder), args.model, args.tokens):
            print(path)
        print(make_eviction(args.folder, args.model))
    for path in make_hybrid(args.folder, args.tokens, args.hybrid_sizes):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
