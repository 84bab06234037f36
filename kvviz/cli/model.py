"""`kvviz model`: load a model and print its card; `--verify` hashes the default model's converted copy."""

from __future__ import annotations

import json
import sys

from kvviz.cli import common
from kvviz.errors import UsageError


def add_parser(subparsers) -> None:
    model = subparsers.add_parser("model", help="load a model and print its card")
    common.add_model_args(model)
    model.add_argument("--json", action="store_true", help="as JSON")
    model.add_argument(
        "--verify", action="store_true", help="hash the default model's converted copy in full; rebuild it if damaged"
    )


def command(args) -> int:
    from kvviz.engine import model_cache, models
    from kvviz.present import model_card_rows

    if args.verify:
        if args.model != "default":
            raise UsageError(f"--verify checks the converted copy of the default model; --model {args.model} has none")
        print(model_cache.verify_default_model(common.progress), file=sys.stderr if args.json else sys.stdout)
    loaded = models.load_model(args.model, dtype=args.dtype, device=args.device, progress=common.progress)
    if args.json:
        print(json.dumps(loaded.card, indent=2))
        return 0
    for key, value in model_card_rows(loaded.card):
        print(f"{key:>14}  {value}")
    return 0
