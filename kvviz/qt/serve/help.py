"""Help ▸ What the views show, for the Serve mode."""

HELP = (
    (
        "Serve",
        "Many requests through transformers' own continuous batching (model.init_continuous_batching), as an "
        "application serves several users: a scheduler batches them step by step over one pool of blocks, the paged "
        "cache. <b>Block map</b>: every block of the pool a cell, coloured by the request holding it; a number is "
        "how many requests share the block (the blocks of a common prefix); hatched: a complete block no request "
        "holds, kept for a later prefix (cached); plain: free. The map shows the pool at the last step. <b>Requests "
        "over time</b>: each request's row, waiting (sent, not yet scheduled), prefill, decode, and preempted (its "
        "blocks freed when the pool ran out, its prompt and answer so far computed again later). <b>Pool in use</b>: "
        "the blocks held at each step against the pool's size (dashed); a second run overlays the one before "
        "(dotted), to compare sharing on and off, or 64 blocks against 256. <b>Batch per step</b>: the prefill and "
        "decode tokens of each forward. Above: tokens per second from the first arrival to the last token, and the "
        "p50 / p90 / p99 of the time to first token (from each request's arrival) and per output token. Every "
        "answer is greedy and equals generate's of that prompt alone. File ▸ Save serving run keeps it as a "
        "kvviz-serve file; `kvviz serve` runs the same from the command line.",
    ),
)
