"""`kvviz strategies`: every cache strategy, its options and whether it runs on this machine."""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    strategies = subparsers.add_parser("strategies", help="list the cache strategies and their options")
    strategies.add_argument("--json", action="store_true", help="as JSON")


def command(args) -> int:
    from kvviz.engine import strategies

    listing = [s.to_dict() for s in strategies.all_strategies()]
    if args.json:
        print(json.dumps(listing, indent=2))
        return 0
    width = max(len(s["name"]) for s in listing) + 2
    for s in listing:
        state = "" if s["available"] else f"  [unavailable: {s['reason']}]"
        print(f"{s['name']:<{width}}{s['description']}{state}\n{'':<{width}}follows {s['reference']}")
        for o in s["options"]:
            print(f"{'':<{width}}{o['name']}={o['default']}  {o['help']}")
    return 0
