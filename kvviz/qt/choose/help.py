"""Help ▸ What the views show, for the Choose mode."""

HELP = (
    (
        "Choose",
        "Which cache should you use? Under Controls ▸ Choose, give the text, the tokens to measure, the context "
        "each sequence will reach (default: the model's maximum), how many sequences at once, the memory budget "
        "(4GiB, 512MiB, or free for the device's free memory) and the quality you accept (5% on perplexity, or "
        "kl=0.05 nats), and untick the configurations of the default grid you do not want. Choose reads the text "
        "through each, compared at every prediction with the exact cache (KL divergence, top-1 agreement), times a "
        "few decode steps with it alone, serves one request of the text's length through it up to its first token "
        "(the process's peak, every allocation counted, and the time to first token), and derives its memory at "
        "your target from its own size rule, beside that request's peak and time predicted there (pred.). Each "
        "configuration is a point: quality lost (perplexity change in %, or mean KL in nats) against cache bytes "
        "at the target, or (the chooser above the plot) the process's peak serving your sequences (log axis), "
        "coloured by decode speed; the line joins the frontier, the configurations no other beats on both. The "
        "dashed line is your tolerance, the dash-dotted one your budget (where it bounds what is drawn: the "
        "caches, or with budget covers the whole process, the process). Hover a point "
        "for its numbers; click it (or its row) for its running perplexity, KL and measured cache along the text. "
        "Above, the answer: the smallest cache within the tolerance and the best quality within the budget, with "
        "what they rest on. Stop keeps the finished configurations; File ▸ Save sweep writes the kvviz-sweep "
        "file, its CSV and the frontier picture. The sweep is journaled as each configuration finishes (in the "
        "folder Help ▸ About names, until the window closes): File ▸ Open of the journal a killed window or "
        "kvviz choose --out left continues it, as kvviz choose --resume does.",
    ),
    (
        "Answers",
        "Tick Ask questions too (Controls ▸ Choose) and every configuration is also asked questions, as kvviz "
        "choose --task or --qa asks them: items of the tasks ticked (RULER's needles and variable tracking, "
        "SCBench's key-value retrieval), written for the model at the length asked from the seed, or your own "
        "question file (JSONL with kvpress's columns, or a kept conversation), in the regimes ticked. Beside the "
        "frontier, the answers right (%) of each configuration per regime against the same memory axis, the exact "
        "cache's as a dashed line in the regime's colour; the answer names no configuration more than 5 points "
        "below the exact cache. The Answers tab below lists each question per configuration: right or wrong, the "
        "model's answer, what was expected and in how many layer-heads the needle was still held when it came.",
    ),
)
