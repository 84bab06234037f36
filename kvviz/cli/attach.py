"""`kvviz attach URL`: watch a vLLM server's KV cache headlessly, optionally under a bounded load.

Polls /metrics in a background thread for the whole session, sends kvviz's own timed prompt, runs
the load (N requests at concurrency C within S seconds), keeps polling a few seconds more so usage
is seen falling back, then prints a summary (or JSON) and optionally writes a session file.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from kvviz.cli.common import log
from kvviz.errors import UsageError
from kvviz.present import UNKNOWN, ms, number, percent

DEFAULT_PROMPT = "Explain in three sentences what a key-value cache does in a transformer."


def add_parser(subparsers) -> None:
    attach = subparsers.add_parser(
        "attach", help="watch the KV cache of a running vLLM server (usage, prefix hits, latency)"
    )
    attach.add_argument("url", help="the server, e.g. http://127.0.0.1:8000, or a saved session file to open")
    attach.add_argument("--prompt", default=DEFAULT_PROMPT, help="kvviz's own timed prompt ('' to send none)")
    attach.add_argument("--max-tokens", type=int, default=64, help="tokens for each request (default 64)")
    attach.add_argument("--requests", type=int, default=0, help="load: this many extra requests (default 0)")
    attach.add_argument("--concurrency", type=int, default=4, help="load: requests in flight at once (default 4)")
    attach.add_argument("--duration", type=float, default=60.0, help="load: stop starting requests after S seconds")
    attach.add_argument("--shared-prefix", default="", metavar="TEXT", help="load: text every load prompt starts with")
    attach.add_argument("--interval", type=float, default=0.5, help="seconds between /metrics scrapes (default 0.5)")
    attach.add_argument("--settle", type=float, default=3.0, help="keep polling this long after the load (default 3)")
    attach.add_argument("--model-dir", type=Path, help="the served model's directory: predict KV bytes per token")
    attach.add_argument("--dtype", default="auto", help="the server's --dtype, for the prediction (default auto)")
    attach.add_argument("--out", type=Path, help="write the session to this file (kvviz-attach JSON)")
    attach.add_argument("--json", action="store_true", help="print the summary as JSON")


def _check_args(args) -> None:
    from kvviz.attach.load import validate

    try:
        validate(args.requests, args.concurrency, args.duration)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if not 0.05 <= args.interval <= 60:
        raise UsageError(f"--interval must be between 0.05 and 60 seconds, got {args.interval}")
    if not 0 <= args.settle <= 600:
        raise UsageError(f"--settle must be between 0 and 600 seconds, got {args.settle}")
    from kvviz.attach.session import kv_dtype_name

    try:
        kv_dtype_name(None, args.dtype, None)
    except ValueError as exc:
        raise UsageError(f"--dtype: {exc}") from None
    if args.model_dir is not None and not (args.model_dir / "config.json").is_file():
        raise UsageError(f"--model-dir {args.model_dir} has no config.json")
    if args.out is not None and not args.out.parent.is_dir():
        raise UsageError(f"cannot write {args.out}: the folder {args.out.parent} does not exist")


def command(args) -> int:
    import httpx

    from kvviz.attach.client import first_model, stream_completion
    from kvviz.attach.load import run_load
    from kvviz.attach.poller import Poller, base_url, scrape
    from kvviz.attach.session import Session, predict

    if args.url.endswith(".json") or Path(args.url).is_file():
        return _open_session(args)
    _check_args(args)
    url = base_url(args.url)
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"{args.url} is not an http(s) URL")
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        first = scrape(client, url)
        if not first.ok:
            raise RuntimeError(f"cannot attach to {url}: {first.error}.")
        model = first_model(client, url)
    session = Session(url=url, model=model, interval=args.interval, cache=dict(first.cache))
    if args.model_dir is not None:
        session.prediction = predict(args.model_dir, first.cache, args.dtype)
    log(f"attached to {url} (model {model}); polling /metrics every {args.interval:g} s")

    poller = Poller(url, interval=args.interval).start()
    cancel = threading.Event()
    interrupted = False
    try:
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            if args.prompt:
                record = stream_completion(client, url, model, args.prompt, max_tokens=args.max_tokens)
                session.requests.append(record)
                if record.error:
                    session.errors.append([time.time(), f"kvviz's own request: {record.error}"])
                else:
                    log(f"own request: {len(record.tokens)} tokens, first after {record.ttft:.3f} s")
        if args.requests:
            log(f"load: {args.requests} requests at concurrency {args.concurrency}, at most {args.duration:g} s")
            result = run_load(
                url,
                model,
                args.requests,
                args.concurrency,
                args.duration,
                args.shared_prefix,
                max_tokens=args.max_tokens,
                cancel=cancel,
            )
            session.load = result.summary()
            session.requests.extend(result.records)
        time.sleep(args.settle)
    except KeyboardInterrupt:
        cancel.set()
        interrupted = True
        log("interrupted; keeping what was collected")
    finally:
        poller.stop(timeout=max(5.0, 2 * args.interval))
        session.finished = time.time()
        session.snapshots = list(poller.snapshots)
        session.errors.extend([list(e) for e in poller.errors])
        session.events.extend([list(e) for e in poller.events])
    if args.out is not None:
        session.save(args.out)
        log(f"wrote {args.out}")
    show_session(session, url, model, args.json)
    return 130 if interrupted else 0


def _open_session(args) -> int:
    """`kvviz attach SESSION.json`: check a saved session and print its summary again."""
    from kvviz.attach import session as session_mod

    try:
        session = session_mod.load(args.url)
    except session_mod.SessionError as exc:
        raise UsageError(str(exc)) from None
    show_session(session, session.url, session.model, args.json)
    return 0


def show_session(session, url, model, as_json: bool) -> None:
    """The session's summary, as JSON on stdout or as lines for a person."""
    summary = session.summary()
    if not as_json:
        _print_summary(session, summary)
        return
    fields = {"url": url, "model": model, "cache": session.cache, "prediction": session.prediction}
    fields.update(summary=summary, load=session.load, errors=session.errors, events=session.events)
    print(json.dumps(fields, indent=2))


def _ms(seconds: float | None) -> str:
    return ms(None if seconds is None else seconds * 1000)


def _field(mapping: dict, key: str) -> str:
    value = mapping.get(key)
    return UNKNOWN if value is None else str(value)


def _print_summary(session, s: dict) -> None:
    cache = session.cache
    rows = [
        ("server", f"{session.url}  model {session.model}"),
        (
            "cache",
            f"{number(cache.get('kv_cache_size_tokens'), 0)} tokens in blocks of {_field(cache, 'block_size')}, "
            f"{number(cache.get('kv_cache_memory_bytes'), 0)} bytes, dtype {_field(cache, 'cache_dtype')}, "
            f"prefix caching {_field(cache, 'enable_prefix_caching')}",
        ),
        ("scrapes", f"{s['snapshots']} ({s['failed_scrapes']} failed), restarts seen {s['restarts']}"),
        (
            "usage peak",
            f"{percent(s['usage_peak'], 2)} = {number(s['usage_peak_tokens'], 0)} tokens = "
            f"{number(s['usage_peak_bytes'], 0)} bytes; final {percent(s['usage_final'], 2)}",
        ),
        ("requests", f"running peak {number(s['running_peak'], 0)}, waiting peak {number(s['waiting_peak'], 0)}"),
        (
            "prefix",
            f"{number(s['prefix_hits'], 0)} hits of {number(s['prefix_queries'], 0)} queried tokens "
            f"({percent(s['prefix_hit_rate'], 1)})",
        ),
        (
            "server tok/s",
            f"peak {number(s['tokens_per_s_peak'])}, {number(s['generation_tokens'], 0)} tokens generated",
        ),
        ("TTFT", "  ".join(f"{k} {_ms(v)}" for k, v in s["ttft"].items()) or UNKNOWN),
        ("ITL", "  ".join(f"{k} {_ms(v)}" for k, v in s["itl"].items()) or UNKNOWN),
        (
            "own request",
            f"{s['own_tokens']} tokens, TTFT {_ms(s['own_ttft_s'])}, "
            f"median gap {ms(s['own_itl_ms_median'])}",
        ),
    ]
    if session.load:
        load = session.load
        rows.append(
            (
                "load",
                f"{load['completed']}/{load['requested']} done, {load['failed']} failed, "
                f"{load['not_started']} not started, {load['wall_s']:.1f} s",
            )
        )
    if session.prediction:
        p = session.prediction
        ratio = f" (allocated / predicted = {p['ratio']:.4f})" if p.get("ratio") else ""
        rows.append(
            (
                "KV / token",
                f"predicted {p['predicted_bytes_per_token']:,} bytes ({p['dtype']}), "
                f"allocated {number(p['allocated_bytes_per_token'])}{ratio}",
            )
        )
    for key, value in rows:
        print(f"{key:>12}  {value}")
    for _, message in session.events:
        print(f"{'note':>12}  {message}")
    for _, message in session.errors:
        print(f"{'error':>12}  {message}")
