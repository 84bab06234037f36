"""Help ▸ What the views show, for the Local run: one paragraph per view, with its units. {NAME}s are the cache map's
colours and the Runs table's statuses (kvviz.qt.help.words)."""

HELP = (
    (
        "Cache memory",
        "Bytes the cache holds after each step, in MiB, against the tokens in context (prompt plus generated). "
        "<b>Measured</b> (wide solid line) is what the cache's tensors really allocate (shared storages "
        "counted once, quantized tensors walked to their packed payload, scales and zero points). "
        "<b>Predicted</b> (thin dashed line on top) is what the model's config and the strategy's "
        "allocation rule alone say it should be; for the dynamic and static caches the two agree exactly. "
        "The dotted line marks the end of the prompt (prefill); a dash-dotted line marks a switch of strategy. "
        "A thin dotted line in the run's colour is the part that does not grow with the tokens generated: the "
        "fixed-size states of linear-attention and state-space layers, or an encoder-decoder's cross-attention keys "
        "and values of the prompt (the plot then starts at 0). Before the prompt's end, shaded under a dash-dotted "
        "line: the prefill's allocations, what it held beside the weights and what was there before it (activations, "
        "the logits, the cache it built), every tensor allocation counted by torch's profiler, over the prefill's "
        "time drawn across the prompt's tokens; the star is their peak, the Runs table's prefill peak MiB. A long "
        "prompt through a small cache shows the prefill, not the cache, setting the peak; the strategy's prefill "
        "chunk option reads the prompt a chunk at a time and lowers it.",
    ),
    (
        "Step latency",
        "Wall time of each decode step in milliseconds: one forward pass over one new token, with the "
        "cache's own work. The prefill (the whole prompt in one pass) is a star, kept off the scale; its time "
        "is in the legend above. The dashed line is each step's memory-bound floor: the time to read every "
        "weight and the whole KV cache once at this machine's measured memory bandwidth (measured once, kept "
        "in kvviz's cache folder; kvviz bench measures it again). No step can be faster. The KV cache's share "
        "of those bytes grows with the context, so a growing cache's floor rises while a sink, sliding or "
        "quantized cache's stays low: a smaller cache is faster because each step reads fewer bytes. The "
        "status bar and the Runs table give the share of that limit a run reached. One-time pauses (quanto's "
        "kernel build, torch.compile) are marked where they happened and are in no step's time. Dots: the part of a "
        "step its cache spent choosing what to keep (scoring), for a policy that compresses while decoding; the "
        "prefill's scoring (KVzip's reading the prompt again, a forward of its own) is beside the prefill's time in "
        "the legend.",
    ),
    (
        "Fidelity",
        "Shown for runs made with <i>Compare with the exact cache</i>: a full-precision DynamicCache "
        "reference runs in lockstep on the same tokens, and this plot shows KL(reference || run) of the "
        "next-token distributions at every step, in nats. 0 means the cache changed nothing; the Runs "
        "table adds the share of steps whose most likely token agrees (top-1 agree) and the first step "
        "where they differ. The reference's time is measured apart and not counted in tokens/s.",
    ),
    (
        "Cache map",
        "What each layer (rows) holds at each position (columns, one per token) after the latest step. "
        "{FULL}: full precision. {QUANTIZED}: quantized. {RESIDUAL}: residual buffer, the newest tokens a "
        "quantized cache keeps in full precision. {SINK}: attention sinks, the first tokens a sink cache keeps. "
        "{EVICTED}: evicted, the token was dropped. {PREALLOCATED}: allocated but not written yet (a static cache's "
        "preallocated slots). {UNSEEN}: not yet used. {STATE}: fixed-size state: a linear-attention or state-space "
        "layer (Mamba, gated DeltaNet) folds every token into a convolution and a recurrent state whose size never "
        "changes, so it holds no positions (hover for the shapes). {SHARED}: shares another layer's keys and values "
        "(Gemma 3n's KV-shared layers keep none of their own). With per-head eviction (H2O, SnapKV, key norm, "
        "AdaKV's adaptive=true, KVzip, ...) each KV head of a layer keeps its own positions: a position only some "
        "of them hold is a fainter {held}, the fainter the fewer heads hold it (hover a cell for the count). A "
        "dashed line across the layers marks each compression while decoding (decode_interval): a step after "
        "which the cache held fewer tokens than before it; hover near it for the sizes. The title names the run "
        "shown. A pinned span (Controls ▸ Pinned spans: words of the prompt selected, or the needle of a task item; "
        "or right-click words of the prompt in the Tokens panel) is outlined, its edges layer by layer green where "
        "every KV head holds all its tokens, yellow where some are held, and in the text's colour where none is; "
        "the title and the Runs table's needle held column say in how many layer-heads (layers x KV heads) all of "
        "it is held.",
    ),
    (
        "Attention",
        "The tab beside the cache map. Left: where the current token's attention goes, per layer (rows) over the "
        "positions (columns), averaged over the query heads, on a log scale; positions a layer no longer holds "
        "draw none and keep the evicted colour. Right: each layer's share of that attention on the first four "
        "positions (the attention sink), at every step, one line per layer and their mean. It is computed only "
        "while this tab is on screen: the map shows the last step computed, and trace files keep the shares, "
        "not the map.",
    ),
    (
        "Cache bytes per layer, now",
        "Bytes of keys and of values each layer holds after the latest step, in KiB (or MiB for large "
        "caches), each layer's bars centred on its number. Layers that share or skip their cache show it here. A "
        "third bar is what does not grow: a linear-attention or state-space layer's fixed-size state (yellow), or "
        "an encoder-decoder's cross-attention keys and values of the prompt (purple). Under multi-head latent "
        "attention (DeepSeek-V3) the two bars are the compressed latent and the rotary key part, what the cache "
        "stores in place of per-head keys and values.",
    ),
    (
        "Time per layer",
        "Mean wall time of each decoder layer's forward pass over the decode steps, in milliseconds, one "
        "line per run; measured with hooks on the layers from the first decode step on (a run under torch.compile "
        "does not measure it).",
    ),
)
