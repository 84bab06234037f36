"""Help ▸ What the views show, for the Evaluate mode."""

HELP = (
    (
        "Evaluate",
        "How well the model reads a long document through each strategy's cache (StreamingLLM's evaluation). "
        "Each strategy in the list reads the document one token at a time through its own cache, and the "
        "model's prediction of every next token is scored: its negative log-likelihood (NLL, natural log). "
        "Strategies that keep every token exactly (dynamic, static) read a chunk of tokens per forward, with "
        "the same result. <b>Log-perplexity</b>: the mean NLL of the last 64 predictions at each position, "
        "in nats (fewer at the very start; the y range leaves the first 16 out, the start of any text is hard "
        "to predict); lower reads the text better, and a rise after a strategy's first eviction (dashed line) "
        "is what dropping tokens costs. <b>Cache memory</b>: measured (solid) and predicted (dashed) after each "
        "prediction, in MiB (dots: measured once per chunk). The table gives per strategy the perplexity (exp "
        "of the mean NLL) over all predictions and over their second half, the cache at the end, predictions "
        "per second, and the first position predicted after the cache dropped a token. Strategies are named "
        "by the options they set away from their defaults; hover for all of them. Longer documents are cut at "
        "the model's context, and the line above the plots says so. File: save the evaluation (a kvviz-eval "
        "file per strategy and summary.csv, as <i>kvviz eval --out</i>), export its summary as CSV, open kept "
        "evaluation files.",
    ),
)
