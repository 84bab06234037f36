"""transformers' paged cache as kvviz reads it: the one module that touches the internals of continuous batching.

`generate(cache_implementation="paged")` and `model.init_continuous_batching` keep every request's keys and values
in one pool of blocks (`PagedAttentionCache`): a flat uint8 tensor cut into sectors, one allocator per group of
layers (full attention, sliding attention), each with a block table per request and a ledger of the blocks that
several requests share by prefix, and of the complete blocks that no request holds any more but a later prefix may
take again (cached). These are internals, moved between releases (the allocator was redesigned in 5.2x), so they are
probed once (`probe`) against what this module reads, and a transformers that lacks any of it is refused by name.
"""

from __future__ import annotations

from kvviz.errors import OptionError
from kvviz.files.serve_trace import Group, PoolState

TESTED = "5.24"  # the transformers whose layout this module reads

# What is read, by the object it is read from.
NEEDED = {
    "manager": ("warmup", "start", "stop", "add_request", "get_result", "is_running", "batch_processor"),
    "batch processor": ("prepare_next_batch", "update_batch", "cache", "scheduler", "offloading_manager",
                        "inputs_and_outputs"),
    "cache": ("cache_tensor", "num_sectors", "num_blocks", "cache_allocators", "pool", "search_prefix_match"),
    "allocator": ("block_table", "tokens_per_page", "layer_indices", "ledger", "cache_tensor", "num_blocks",
                  "blocks_per_sector"),
    "ledger": ("shared_ref_counts", "cached_blocks"),
    "offloading manager": ("offload_requests",),
    "inputs and outputs": ("requests_in_batch",),
}


def probe(manager) -> None:
    """Refuse a transformers whose continuous batching lacks what kvviz reads (before any request is sent)."""
    import transformers

    processor = manager.batch_processor
    cache = getattr(processor, "cache", None)
    allocators = list(getattr(cache, "cache_allocators", {}).values())
    objects = {"manager": [manager], "batch processor": [processor], "cache": [cache], "allocator": allocators,
               "ledger": [getattr(a, "ledger", None) for a in allocators],
               "offloading manager": [getattr(processor, "offloading_manager", None)],
               "inputs and outputs": [getattr(processor, "inputs_and_outputs", None)]}
    first = {kind: found[0] if found else None for kind, found in objects.items()}
    missing = [f"{kind}.{name}" for kind, names in NEEDED.items() for name in names if not hasattr(first[kind], name)]
    if missing:
        raise OptionError(
            f"kvviz serve reads transformers' continuous batching as transformers {TESTED} lays it out; this "
            f"transformers ({transformers.__version__}) lacks {', '.join(missing[:4])}"
            f"{' and more' if len(missing) > 4 else ''}: install transformers=={TESTED}.*"
        )


def groups(manager) -> list[Group]:
    """The pool's groups, their bytes per block read from the pool's own tensors: an allocator's typed view of the
    pool is [tokens, 2, KV heads, head dim] in the cache's dtype, one row per token and layer for keys and values, so
    a block is page x layers of its rows."""
    cache = manager.batch_processor.cache
    found = []
    for name, allocator in cache.cache_allocators.items():
        row_bytes = allocator.cache_tensor[0].nbytes
        found.append(Group(name, len(allocator.layer_indices), allocator.tokens_per_page,
                           row_bytes * allocator.tokens_per_page * len(allocator.layer_indices), allocator.num_blocks,
                           first_block=2 * allocator.blocks_per_sector))  # the pool's first two sectors: padding
    return found


def pool_state(manager) -> PoolState:
    """Read on the manager's thread (its hooks), where the tables are consistent."""
    allocators = manager.batch_processor.cache.cache_allocators
    return PoolState(
        tables={name: {rid: list(blocks) for rid, blocks in a.block_table.items()} for name, a in allocators.items()},
        shared={name: {str(block): n for block, n in a.ledger.shared_ref_counts.items()}
                for name, a in allocators.items()},
        cached={name: sorted(a.ledger.cached_blocks) for name, a in allocators.items()},
    )


def pool_blocks(manager) -> int:
    """The pool's size in blocks of every layer (what `num_blocks` asks for): a group whose layers are half the model's
    has twice as many blocks of its own."""
    return manager.batch_processor.cache.num_blocks


def pool_bytes(manager) -> int:
    """The whole pool tensor's bytes, its two reserved sectors included."""
    return manager.batch_processor.cache.cache_tensor.nbytes
