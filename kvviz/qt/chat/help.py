"""Help ▸ What the views show, for the Chat mode."""

HELP = (
    (
        "Chat",
        "A conversation with one cache kept across its turns (the Controls pick the model, the strategy "
        "and the tokens each answer may have). Each message is rendered with the whole history by the chat "
        "template and only the tokens the cache does not hold yet are fed; where the rendered history differs "
        "from what the cache holds (a template that rewrites earlier turns, an answer whose text tokenizes "
        "differently), the cache is cropped at the first differing token, or prefilled again where it cannot be "
        "cropped (it has evicted or quantized), and the table's note says so. <b>Regenerate</b>: the last answer "
        "again from the cache cropped back to your message. <b>Edit…</b>: the selected turn's message into the "
        "box; Send replaces it and drops what came after. <b>New chat</b>: a deep copy of the cached system prompt "
        "(its bytes are counted twice). <b>Switch</b> converts the chat's cache between turns or mid-answer. The "
        "plots run over tokens in context, each turn's first token a dashed line; the cache map colours what the "
        "cache holds by role (shades alternate by turn) and what it evicted. The table gives per turn the tokens "
        "fed and kept, the time to first token, a full re-prefill of the history (measured when ticked), decode "
        "tokens/s, the cache at the turn's end and the tokens evicted during it. Closing the window (or Ctrl-C, "
        "SIGTERM) loses no finished turn: the chat is written again to the file File ▸ Save chat last "
        "wrote, or else to a new file in the folder About kvviz names; File ▸ Open reopens it.",
    ),
)
