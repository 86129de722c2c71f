"""Constants and small layout helpers shared by the reference, the kernels and the lessons.

Glossary (used everywhere, code and prose): a *position* is a token's index inside its own
request's sequence; the *logical block* is ``position // block_size`` and the *block offset*
``position % block_size``; the *block table* maps (request, logical block) to a *physical
block*; the *slot* is ``physical_block * block_size + block_offset``. A *tile* is the group
of tokens one Triton program handles at once; the *window* is the run of block-table entries
a tile loads. Under context parallelism a *rank* owns the positions of every
*interleave*-sized segment whose index is congruent to it modulo the world size.
"""

from __future__ import annotations

import torch

PAD_SLOT_ID = -1  # "no slot": vLLM's PAD_SLOT_ID, passed to kernels as PAD_ID
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
PRODUCTION_TILE = 1024  # TILE_BLOCK_SIZE in vLLM and vllm-ascend


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def next_power_of_2(value: int) -> int:
    """Smallest power of two >= value (1 for value <= 1)."""
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def window_size(tile_size: int, block_size: int) -> int:
    """BLOCK_TABLE_WINDOW_SIZE: block-table entries a tile of contiguous positions can touch.

    A tile of ``tile_size`` contiguous positions spans at most ``cdiv(tile_size, block_size)``
    blocks when it starts on a block boundary, and one more when it starts in the middle of a
    block: hence the ``+ 1``. Rounded up to a power of two because Triton tensor shapes must
    be powers of two.
    """
    return next_power_of_2(cdiv(tile_size, block_size) + 1)


def expand_block_table(block_table: torch.Tensor, blocks_per_kv_block: int) -> torch.Tensor:
    """Hybrid blocks: turn a table of physical KV blocks into a table of attention blocks.

    One physical block of ``kv_cache_block_size = blocks_per_kv_block * block_size`` tokens
    holds ``blocks_per_kv_block`` attention ("kernel") blocks of ``block_size`` tokens; physical
    block ``k`` holds attention blocks ``k * blocks_per_kv_block + j``. The slot-mapping
    kernels index the expanded table with attention-block indices.

    block_table: [rows, n] int32  ->  [rows, n * blocks_per_kv_block] int32
    """
    if blocks_per_kv_block < 1:
        raise ValueError(f"blocks_per_kv_block must be >= 1, got {blocks_per_kv_block}")
    if block_table.numel():
        # k * B + B - 1 must fit the table's dtype: a wrapped-around number would be a small,
        # valid-looking block of some other request, which no later check can catch.
        largest = int(block_table.max())
        limit = torch.iinfo(block_table.dtype).max
        if largest * blocks_per_kv_block + blocks_per_kv_block - 1 > limit:
            raise ValueError(
                f"block_table holds physical block {largest}: its attention blocks "
                f"{largest} * {blocks_per_kv_block} + j pass {str(block_table.dtype)[6:]}'s "
                f"largest value {limit}"
            )
    j = torch.arange(blocks_per_kv_block, dtype=block_table.dtype, device=block_table.device)
    expanded = block_table.unsqueeze(-1) * blocks_per_kv_block + j
    rows, entries = block_table.shape
    return expanded.reshape(rows, entries * blocks_per_kv_block).contiguous()
