"""The reference: what every kernel, test, exercise check and figure compares against.

Two versions of the same semantics (SPEC.md section 2):

* the *oracle* (``token_slot`` and the ``*_oracle`` functions): plain Python, one token at a
  time, written to be read in one sitting. It is the definition.
* the *torch* version (``*_torch``): the same formula on whole tensors, fast enough for big
  tests and benchmarks. The tests check it against the oracle.

Every public function here takes the same arguments as the launcher of the same job in
``slotmap.kernels`` and returns the same thing, so a test or a notebook swaps one for another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from slotmap.layout import PAD_SLOT_ID
from slotmap.validate import (
    check_replay_inputs,
    check_slot_mapping_inputs,
    check_slot_mappings_inputs,
)


@dataclass(frozen=True)
class CPSteps:
    """SPEC §2's context-parallel steps for one position, every intermediate value named."""

    position: int
    virtual_block_size: int  # 1. V = kv_cache_block_size * W: one physical block per rank
    virtual_block: int  #       vb = p // V
    virtual_offset: int  #      vo = p % V
    segment: int  # 2.          vo // I
    owner: int  #               segment % W: the rank that stores p
    local_offset: int  # 3.     lo = (vo // (W * I)) * I + vo % I: the owner's segments, packed
    block: int  # 4.            b = vb * BLOCKS_PER_KV_BLOCK + lo // block_size
    offset: int  #              o = lo % block_size


def cp_steps(
    position: int, block_size: int, kv_cache_block_size: int, world_size: int, interleave: int
) -> CPSteps:
    """Steps 1-4 of context parallelism for one position >= 0 (step 5, the slot, needs the
    owner's block table). ``token_block_and_offset`` answers with these on the owner."""
    blocks_per_kv_block = kv_cache_block_size // block_size
    virtual_block_size = kv_cache_block_size * world_size
    virtual_block, virtual_offset = divmod(position, virtual_block_size)
    segment = virtual_offset // interleave
    local_offset = (
        virtual_offset // (world_size * interleave) * interleave + virtual_offset % interleave
    )
    return CPSteps(
        position, virtual_block_size, virtual_block, virtual_offset, segment,
        segment % world_size, local_offset,
        virtual_block * blocks_per_kv_block + local_offset // block_size,
        local_offset % block_size,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The oracle: one token at a time.
# ---------------------------------------------------------------------------------------------
def token_block_and_offset(
    position: int,
    block_size: int,
    *,
    kv_cache_block_size: int,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    circular: bool = False,
) -> tuple[int, int] | None:
    """(logical block, block offset) of one position, or None when this rank stores no slot.

    Positions are non-negative here except in circular mode, so Python's floor ``//`` and
    ``%`` agree with the truncating ones of C and Triton.
    """
    if circular:
        # A ring buffer of one block: every position wraps into block 0. Negative positions
        # are the padded tail of a sliding window and have no slot.
        if position < 0:
            return None
        return 0, position % block_size
    if cp_world_size == 1:
        # Common case: context parallelism is not used.
        return position // block_size, position % block_size
    # Context parallelism: the five steps.
    steps = cp_steps(position, block_size, kv_cache_block_size, cp_world_size, cp_interleave)
    if steps.owner != cp_rank:
        return None
    return steps.block, steps.offset


def token_slot(
    position: int,
    block_table_row: Sequence[int],
    block_size: int,
    *,
    kv_cache_block_size: int | None = None,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    circular: bool = False,
    pad_id: int = PAD_SLOT_ID,
) -> int:
    """The slot of one token: ``block_table_row[block] * block_size + offset``, or ``pad_id``."""
    found = token_block_and_offset(
        position,
        block_size,
        kv_cache_block_size=block_size if kv_cache_block_size is None else kv_cache_block_size,
        cp_world_size=cp_world_size,
        cp_rank=cp_rank,
        cp_interleave=cp_interleave,
        circular=circular,
    )
    if found is None:
        return pad_id
    block, offset = found
    return int(block_table_row[block]) * block_size + offset  # 5.


def slot_mapping_oracle(
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    block_size: int,
    *,
    num_tokens: int | None = None,
    max_num_tokens: int | None = None,
    kv_cache_block_size: int | None = None,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    circular: bool = False,
    pad_id: int = PAD_SLOT_ID,
    out: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    """Slot of every batch token, one token at a time.

    query_start_loc: [num_reqs + 1] int32; positions: [>= num_tokens] int64;
    block_table: [max_num_reqs, max_num_blocks_per_req] int32.
    Returns [max_num_tokens] int32 (or ``out``): slots of tokens ``[0, num_tokens)``, then
    ``pad_id`` up to ``max_num_tokens``.
    """
    if kv_cache_block_size is None:
        kv_cache_block_size = block_size
    num_tokens, max_num_tokens = check_slot_mapping_inputs(
        query_start_loc, positions, block_table, block_size,
        num_tokens=num_tokens, max_num_tokens=max_num_tokens,
        kv_cache_block_size=kv_cache_block_size, cp_world_size=cp_world_size, cp_rank=cp_rank,
        cp_interleave=cp_interleave, circular=circular, out=out, full=validate, pad_id=pad_id,
    )  # fmt: skip
    starts = query_start_loc.tolist()
    pos = positions.tolist()
    table = block_table.tolist()
    result = [pad_id] * max_num_tokens  # the padding tail keeps pad_id
    for request in range(len(starts) - 1):
        for token in range(starts[request], starts[request + 1]):
            result[token] = token_slot(
                pos[token], table[request], block_size,
                kv_cache_block_size=kv_cache_block_size, cp_world_size=cp_world_size,
                cp_rank=cp_rank, cp_interleave=cp_interleave, circular=circular, pad_id=pad_id,
            )  # fmt: skip
    return _emit(result, out, positions.device)


def window_bases_oracle(
    query_start_loc: Tensor,
    positions: Tensor,
    block_size: int,
    *,
    tile_size: int,
    kv_cache_block_size: int | None = None,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    circular: bool = False,
) -> list[list[int]]:
    """Where the window kernel's window starts, for every tile of every request.

    Tile t of request q covers tokens ``[qsl[q] + t * tile_size, ...)``; its window starts at
    the smallest logical block among the tile's tokens that have a slot here, or at 0 when no
    token has one. This is what ``compute_slot_mapping(..., window_trace=...)`` records.
    """
    if kv_cache_block_size is None:
        kv_cache_block_size = block_size
    starts = query_start_loc.tolist()
    pos = positions.tolist()
    bases = []
    for request in range(len(starts) - 1):
        request_bases = []
        for tile_start in range(starts[request], starts[request + 1], tile_size):
            tile_end = min(tile_start + tile_size, starts[request + 1])
            blocks = [
                located[0]
                for token in range(tile_start, tile_end)
                if (
                    located := token_block_and_offset(
                        pos[token], block_size, kv_cache_block_size=kv_cache_block_size,
                        cp_world_size=cp_world_size, cp_rank=cp_rank,
                        cp_interleave=cp_interleave, circular=circular,
                    )
                )
                is not None
            ]  # fmt: skip
            request_bases.append(min(blocks, default=0))
        bases.append(request_bases)
    return bases


def slot_mappings_oracle(
    query_start_loc: Tensor,
    positions: Tensor,
    block_tables: Sequence[Tensor],
    block_sizes: Sequence[int],
    *,
    circular: Sequence[bool] | None = None,
    idx_mapping: Tensor | None = None,
    num_tokens: int | None = None,
    max_num_tokens: int | None = None,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    pad_id: int = PAD_SLOT_ID,
    out: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    """Multi-group slot mapping: row ``g`` is group ``g``'s slot mapping.

    Group ``g`` has its own block table ``block_tables[g]``, block size ``block_sizes[g]`` and
    circular flag. Request ``q`` reads row ``idx_mapping[q]`` of every block table (row ``q``
    when ``idx_mapping`` is None). Returns [num_groups, max_num_tokens] int32 (or ``out``).
    """
    circular = list(circular) if circular is not None else [False] * len(block_tables)
    num_tokens, max_num_tokens = check_slot_mappings_inputs(
        query_start_loc, positions, block_tables, block_sizes,
        circular=circular, idx_mapping=idx_mapping, num_tokens=num_tokens,
        max_num_tokens=max_num_tokens, cp_world_size=cp_world_size, cp_rank=cp_rank,
        cp_interleave=cp_interleave, out=out, full=validate, pad_id=pad_id,
    )  # fmt: skip
    rows = _rows(query_start_loc, idx_mapping)
    groups = []
    for g, (table, size) in enumerate(zip(block_tables, block_sizes, strict=True)):
        groups.append(
            slot_mapping_oracle(
                query_start_loc,
                positions,
                table[rows],
                size,
                num_tokens=num_tokens,
                max_num_tokens=max_num_tokens,
                cp_world_size=cp_world_size,
                cp_rank=cp_rank,
                cp_interleave=cp_interleave,
                circular=circular[g],
                pad_id=pad_id,
                validate=False,
            )  # fmt: skip
        )
    return _emit_groups(groups, out, positions.device)


def replay_padding_oracle(
    slot_mappings: Tensor,
    query_start_loc: Tensor,
    positions: Tensor,
    replay_start: Tensor,
    window: int,
    prefix_cacheable: Sequence[bool],
    *,
    num_tokens: int | None = None,
    pad_id: int = PAD_SLOT_ID,
    validate: bool = True,
) -> Tensor:
    """Prefix-cache replay: pad the replayed positions of every prefix-cacheable group.

    A request ``q`` with ``replay_start[q] > 0`` recomputes positions
    ``[replay_start[q], replay_start[q] + window)`` whose KV already sits in shared cached
    blocks; writing them again would put different bytes into blocks other requests read, so
    their slot becomes ``pad_id`` in each group ``g`` with ``prefix_cacheable[g]``. Other
    groups keep their slots. Modifies ``slot_mappings`` [num_groups, >= num_tokens] in place
    and returns it.
    """
    num_tokens = check_replay_inputs(
        slot_mappings, query_start_loc, positions, replay_start, window, prefix_cacheable,
        num_tokens=num_tokens, full=validate, pad_id=pad_id,
    )  # fmt: skip
    starts = query_start_loc.tolist()
    pos = positions.tolist()
    replay = replay_start.tolist()
    for request in range(len(starts) - 1):
        first = replay[request]
        if first <= 0:
            continue
        for token in range(starts[request], starts[request + 1]):
            if first <= pos[token] < first + window:
                for g, cacheable in enumerate(prefix_cacheable):
                    if cacheable:
                        slot_mappings[g, token] = pad_id
    return slot_mappings


# ---------------------------------------------------------------------------------------------
# The torch version: the same formula on whole tensors.
# ---------------------------------------------------------------------------------------------
def block_and_offset_torch(
    positions: Tensor,
    block_size: int,
    *,
    kv_cache_block_size: int,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    circular: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Vectorised ``token_block_and_offset``: (logical block, offset, has_slot), int64/bool.

    Positions that have no slot (negative in circular mode, another rank's under CP) get
    block 0 and offset 0, so the result can always index a block table.
    """
    pos = positions.to(torch.int64)
    if circular:
        has_slot = pos >= 0
        # Guard before the arithmetic: torch's % floors, C's truncates; neither may see p < 0.
        safe = torch.where(has_slot, pos, 0)
        return torch.zeros_like(pos), safe % block_size, has_slot
    if cp_world_size == 1:
        return pos // block_size, pos % block_size, torch.ones_like(pos, dtype=torch.bool)
    blocks_per_kv_block = kv_cache_block_size // block_size
    virtual_block_size = kv_cache_block_size * cp_world_size
    virtual_block, virtual_offset = pos // virtual_block_size, pos % virtual_block_size
    has_slot = (virtual_offset // cp_interleave) % cp_world_size == cp_rank
    local_offset = (
        virtual_offset // (cp_world_size * cp_interleave) * cp_interleave
        + virtual_offset % cp_interleave
    )
    block = virtual_block * blocks_per_kv_block + local_offset // block_size
    offset = local_offset % block_size
    return torch.where(has_slot, block, 0), torch.where(has_slot, offset, 0), has_slot


def request_of_tokens(query_start_loc: Tensor, num_tokens: int) -> Tensor:
    """[num_tokens] int64: the request each batch token belongs to."""
    lengths = (query_start_loc[1:] - query_start_loc[:-1]).to(torch.int64)
    requests = torch.arange(lengths.numel(), device=query_start_loc.device)
    return torch.repeat_interleave(requests, lengths, output_size=num_tokens)


def slot_mapping_torch(
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    block_size: int,
    *,
    num_tokens: int | None = None,
    max_num_tokens: int | None = None,
    kv_cache_block_size: int | None = None,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    circular: bool = False,
    pad_id: int = PAD_SLOT_ID,
    out: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    """Vectorised ``slot_mapping_oracle``: same arguments, same result."""
    if kv_cache_block_size is None:
        kv_cache_block_size = block_size
    num_tokens, max_num_tokens = check_slot_mapping_inputs(
        query_start_loc, positions, block_table, block_size,
        num_tokens=num_tokens, max_num_tokens=max_num_tokens,
        kv_cache_block_size=kv_cache_block_size, cp_world_size=cp_world_size, cp_rank=cp_rank,
        cp_interleave=cp_interleave, circular=circular, out=out, full=validate, pad_id=pad_id,
    )  # fmt: skip
    device = positions.device
    if out is None:
        out = torch.empty(max_num_tokens, dtype=torch.int32, device=device)
    request = request_of_tokens(query_start_loc, num_tokens)
    block, offset, has_slot = block_and_offset_torch(
        positions[:num_tokens], block_size,
        kv_cache_block_size=kv_cache_block_size, cp_world_size=cp_world_size, cp_rank=cp_rank,
        cp_interleave=cp_interleave, circular=circular,
    )  # fmt: skip
    physical = block_table[request, block].to(torch.int64)
    slots = torch.where(has_slot, physical * block_size + offset, pad_id)
    out[:num_tokens] = slots.to(out.dtype)
    out[num_tokens:max_num_tokens] = pad_id
    return out


def slot_mappings_torch(
    query_start_loc: Tensor,
    positions: Tensor,
    block_tables: Sequence[Tensor],
    block_sizes: Sequence[int],
    *,
    circular: Sequence[bool] | None = None,
    idx_mapping: Tensor | None = None,
    num_tokens: int | None = None,
    max_num_tokens: int | None = None,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    pad_id: int = PAD_SLOT_ID,
    out: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    """Vectorised ``slot_mappings_oracle``: same arguments, same result."""
    circular = list(circular) if circular is not None else [False] * len(block_tables)
    num_tokens, max_num_tokens = check_slot_mappings_inputs(
        query_start_loc, positions, block_tables, block_sizes,
        circular=circular, idx_mapping=idx_mapping, num_tokens=num_tokens,
        max_num_tokens=max_num_tokens, cp_world_size=cp_world_size, cp_rank=cp_rank,
        cp_interleave=cp_interleave, out=out, full=validate, pad_id=pad_id,
    )  # fmt: skip
    rows = _rows(query_start_loc, idx_mapping)
    groups = [
        slot_mapping_torch(
            query_start_loc,
            positions,
            table[rows],
            size,
            num_tokens=num_tokens,
            max_num_tokens=max_num_tokens,
            cp_world_size=cp_world_size,
            cp_rank=cp_rank,
            cp_interleave=cp_interleave,
            circular=circular[g],
            pad_id=pad_id,
            validate=False,
        )  # fmt: skip
        for g, (table, size) in enumerate(zip(block_tables, block_sizes, strict=True))
    ]
    return _emit_groups(groups, out, positions.device)


def replay_padding_torch(
    slot_mappings: Tensor,
    query_start_loc: Tensor,
    positions: Tensor,
    replay_start: Tensor,
    window: int,
    prefix_cacheable: Sequence[bool],
    *,
    num_tokens: int | None = None,
    pad_id: int = PAD_SLOT_ID,
    validate: bool = True,
) -> Tensor:
    """Vectorised ``replay_padding_oracle``: same arguments, same result (in place)."""
    num_tokens = check_replay_inputs(
        slot_mappings, query_start_loc, positions, replay_start, window, prefix_cacheable,
        num_tokens=num_tokens, full=validate, pad_id=pad_id,
    )  # fmt: skip
    start = replay_start.to(torch.int64)[request_of_tokens(query_start_loc, num_tokens)]
    pos = positions[:num_tokens].to(torch.int64)
    replayed = (start > 0) & (pos >= start) & (pos < start + window)
    for g, cacheable in enumerate(prefix_cacheable):
        if cacheable:
            slot_mappings[g, :num_tokens].masked_fill_(replayed, pad_id)
    return slot_mappings


# ---------------------------------------------------------------------------------------------
def _rows(query_start_loc: Tensor, idx_mapping: Tensor | None) -> Tensor:
    num_reqs = query_start_loc.numel() - 1
    if idx_mapping is None:
        return torch.arange(num_reqs, device=query_start_loc.device)
    return idx_mapping[:num_reqs].to(torch.int64)


def _emit(values: list[int], out: Tensor | None, device: torch.device) -> Tensor:
    result = torch.tensor(values, dtype=torch.int64, device=device)
    if out is None:
        return result.to(torch.int32)
    out[: len(values)] = result.to(out.dtype)
    return out


def _emit_groups(groups: list[Tensor], out: Tensor | None, device: torch.device) -> Tensor:
    stacked = torch.stack(groups).to(device)  # validation guarantees at least one group
    if out is None:
        return stacked
    out.copy_(stacked)
    return out
