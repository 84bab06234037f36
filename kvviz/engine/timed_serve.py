"""One timed serving of many requests in a fresh Python process: a side of `kvviz bench --serve`.

    echo '{"side": "kvviz" | "generate-batch" | "generate-each", "model": ..., "dtype": ..., "device": ...,
           "requests": N, "new_tokens": M, "page_size": P, "blocks": B, "max_batch_tokens": T,
           "concurrency": C or null}' | python -m kvviz.engine.timed_serve

prints one JSON line: the wall time from the first request sent to the last answer, the tokens answered, and the
answers' tokens (every side must answer alike). Side "kvviz" is `kvviz serve` (`kvviz.engine.serve`, its hooks on
every step); "generate-batch" is transformers' own `model.generate_batch` of the same requests with the same pool,
as a user's script would call it; "generate-each" is plain `model.generate` of one request after another. Each side
serves two requests of a few tokens first (the allocator's first pages, the kernels).
"""

from __future__ import annotations

import json
import sys
import time

import torch

from kvviz.engine import models
from kvviz.engine.decode import encode_prompt
from kvviz.engine.serve import builtin_prompts, sdpa_for_the_run, serve, serving_configs
from kvviz.files.serve_trace import ServeSettings

WARM_UP_TOKENS = 4


def kvviz_answers(loaded, prompts, settings: ServeSettings) -> list[list[int]]:
    return [r.tokens for r in serve(loaded, prompts, settings).requests]


def batch_answers(loaded, prompts, settings: ServeSettings) -> list[list[int]]:
    generation, batching = serving_configs(loaded.model, settings)
    with sdpa_for_the_run(loaded.model):
        outputs = loaded.model.generate_batch([ids for _, ids in prompts], generation_config=generation,
                                              continuous_batching_config=batching, progress_bar=False)
    return [list(outputs[f"req_{i}"].generated_tokens) for i in range(len(prompts))]


def each_answers(loaded, prompts, settings: ServeSettings) -> list[list[int]]:
    generation, _ = serving_configs(loaded.model, settings)
    answers = []
    for _, ids in prompts:
        tensor = torch.tensor([ids], device=loaded.model.device)
        out = loaded.model.generate(tensor, attention_mask=torch.ones_like(tensor), generation_config=generation)
        answers.append(out[0, len(ids):].tolist())
    return answers


SIDES = {"kvviz": kvviz_answers, "generate-batch": batch_answers, "generate-each": each_answers}


def main(request: dict) -> dict:
    loaded = models.load_model(request["model"], dtype=request["dtype"], device=request["device"])
    texts = builtin_prompts(request["requests"])
    prompts = [(text, encode_prompt(loaded.tokenizer, text, raw=False)) for text in texts]
    settings = ServeSettings(max_new_tokens=request["new_tokens"], page_size=request["page_size"],
                             blocks=request["blocks"], max_batch_tokens=request["max_batch_tokens"],
                             concurrency=request.get("concurrency"))
    answer = SIDES[request["side"]]
    with torch.inference_mode():
        answer(loaded, prompts[:2], ServeSettings(**{**vars(settings), "max_new_tokens": WARM_UP_TOKENS}))
        started = time.perf_counter()
        answers = answer(loaded, prompts, settings)
        wall_s = time.perf_counter() - started
    tokens = sum(len(a) for a in answers)
    return {"side": request["side"], "wall_s": wall_s, "tokens": tokens, "tokens_per_s": tokens / wall_s,
            "answers": answers, "threads": torch.get_num_threads()}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.stdin.read()))))
