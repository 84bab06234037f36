"""Help ▸ What the views show, for the vLLM server mode."""

HELP = (
    (
        "vLLM server",
        "Polled from the server's /metrics. <b>KV-cache usage</b>: the share of the server's cache blocks "
        "in use, or that many tokens, or MiB. <b>Requests</b>: running and waiting. <b>Server latency "
        "percentiles</b>: time to first token (TTFT) and inter-token latency (ITL), p50 solid, p90 dashed, "
        "p99 dotted, in ms on a log scale, from the server's histograms. <b>Throughput</b>: generated "
        "tokens/s. <b>Prefix-cache hit rate</b>: the share of prompt tokens found in the cache, per poll "
        "interval (dots) and since attach (line), in %. <b>Per-token latency</b>: kvviz's own requests, "
        "timed on arrival, next to local runs.",
    ),
)
