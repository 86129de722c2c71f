"""The reference: what every kernel, test, exercise check and figure compares against.

Two versions of the same semantics (docs/semantics.md §2):

* the *oracle* (``token_slot`` and the ``*_oracle`` functions): plain Python, one token at a
  time, written to be read in one sitting. It is the definition.
* the *torch* version (``*_torch``): the same formula on whole tensors
  (``SlotLayout.locate``), fast enough for big tests and benchmarks. The tests check it
  against the oracle.

Every public function here takes the same arguments as the launcher of the same job in
``slotmap.kernels`` and returns the same thing, so a test or a notebook swaps one for another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from slotmap.layout import PAD_SLOT_ID, SlotLayout, group_layouts, request_of_tokens
from slotmap.validate import (
    check_replay_inputs,
    check_slot_mapping_inputs,
    check_slot_mappings_inputs,
    resolve_counts,
    resolve_group_counts,
)


@dataclass(frozen=True)
class CPSteps:
    """The context-parallel steps for one position (docs/semantics.md §2), every
    intermediate value named."""

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
        position=position,
        virtual_block_size=virtual_block_size,
        virtual_block=virtual_block,
        virtual_offset=virtual_offset,
        segment=segment,
        owner=segment % world_size,
        local_offset=local_offset,
        block=virtual_block * blocks_per_kv_block + local_offset // block_size,
        offset=local_offset % block_size,
    )


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
    layout = SlotLayout.of(
        block_size, kv_cache_block_size, cp_world_size, cp_rank, cp_interleave, circular, pad_id
    )
    num_tokens, max_num_tokens = resolve_counts(
        query_start_loc, positions, num_tokens, max_num_tokens, validate
    )
    check_slot_mapping_inputs(
        layout,
        query_start_loc,
        positions,
        block_table,
        num_tokens,
        max_num_tokens,
        out=out,
        full=validate,
    )
    slots = _oracle_slots(layout, query_start_loc, positions, block_table.tolist(), max_num_tokens)
    return _emit(slots, out, positions.device)


def _oracle_slots(
    layout: SlotLayout,
    query_start_loc: Tensor,
    positions: Tensor,
    table: list[list[int]],
    max_num_tokens: int,
) -> list[int]:
    # Request q's tokens read row q of ``table``; the padding tail keeps pad_id.
    starts = query_start_loc.tolist()
    pos = positions.tolist()
    result = [layout.pad_id] * max_num_tokens
    for request in range(len(starts) - 1):
        for token in range(starts[request], starts[request + 1]):
            result[token] = token_slot(pos[token], table[request], **layout.fields())
    return result


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
    layout = SlotLayout.of(
        block_size, kv_cache_block_size, cp_world_size, cp_rank, cp_interleave, circular
    )
    where = layout.fields()
    del where["pad_id"]
    starts = query_start_loc.tolist()
    pos = positions.tolist()
    bases = []
    for request in range(len(starts) - 1):
        request_bases = []
        for tile_start in range(starts[request], starts[request + 1], tile_size):
            tile_end = min(tile_start + tile_size, starts[request + 1])
            located = [
                token_block_and_offset(pos[t], **where) for t in range(tile_start, tile_end)
            ]
            request_bases.append(min((b[0] for b in located if b is not None), default=0))
        bases.append(request_bases)
    return bases


def slot_mappings_oracle(
    query_start_loc: Tensor,
    positions: Tensor,
    block_tables: Sequence[Tensor | None],
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
    kernel_block_sizes: Sequence[int] | None = None,
    slot_mapping_enabled: Sequence[bool] | None = None,
    dcp_sharded: Sequence[bool] | None = None,
    out: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    """Multi-group slot mapping: row ``g`` is group ``g``'s slot mapping (docs/semantics.md §4).

    Group ``g`` has its own block table ``block_tables[g]``, allocation block size
    ``block_sizes[g]``, kernel block size ``kernel_block_sizes[g]`` (the unit its table
    counts; None: the allocation block) and circular flag. Request ``q`` reads row
    ``idx_mapping[q]`` of every block table (row ``q`` when ``idx_mapping`` is None); -1 marks
    a dummy request: its tokens get ``pad_id`` and no row is read.
    ``slot_mapping_enabled[g]`` False: every token of group ``g`` gets ``pad_id`` and its
    table (which may be None) is never read. ``dcp_sharded[g]`` False: context parallelism
    leaves group ``g`` alone (every token maps locally). Both None: every group on, sharded.
    ``num_tokens`` may be a padded count: tokens from ``query_start_loc[num_reqs]`` on get
    ``pad_id``. Returns [num_groups, max_num_tokens] int32 (or ``out``).
    """
    layouts, num_tokens, max_num_tokens = _check_groups(
        query_start_loc,
        positions,
        block_tables,
        block_sizes,
        circular,
        idx_mapping,
        num_tokens,
        max_num_tokens,
        cp_world_size,
        cp_rank,
        cp_interleave,
        pad_id,
        out,
        validate,
        kernel_block_sizes=kernel_block_sizes,
        slot_mapping_enabled=slot_mapping_enabled,
        dcp_sharded=dcp_sharded,
    )
    starts = query_start_loc.tolist()
    rows = _rows(query_start_loc, idx_mapping).tolist()
    pos = positions[:num_tokens].tolist()
    groups = []
    for layout, table in zip(layouts, block_tables, strict=True):
        result = [layout.pad_id] * max_num_tokens
        for request, row in enumerate(rows):
            if not layout.enabled or row < 0:
                continue  # a disabled group or a dummy request: no slot, no row read
            entries = table[row].tolist()
            # Up to the real token count: a padded num_tokens adds no token.
            for token in range(starts[request], min(starts[request + 1], num_tokens)):
                result[token] = token_slot(pos[token], entries, **layout.fields())
        # int64 until the output's width: an int64 out holds slots past int32.
        groups.append(torch.tensor(result, dtype=torch.int64))
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
        slot_mappings,
        query_start_loc,
        positions,
        replay_start,
        window,
        prefix_cacheable,
        num_tokens=num_tokens,
        full=validate,
        pad_id=pad_id,
    )
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
    layout = SlotLayout.of(
        block_size, kv_cache_block_size, cp_world_size, cp_rank, cp_interleave, circular, pad_id
    )
    num_tokens, max_num_tokens = resolve_counts(
        query_start_loc, positions, num_tokens, max_num_tokens, validate
    )
    check_slot_mapping_inputs(
        layout,
        query_start_loc,
        positions,
        block_table,
        num_tokens,
        max_num_tokens,
        out=out,
        full=validate,
    )
    if out is None:
        out = torch.empty(max_num_tokens, dtype=torch.int32, device=positions.device)
    rows = request_of_tokens(query_start_loc, num_tokens)
    return _torch_slots(layout, positions, block_table, rows, num_tokens, out)


def _torch_slots(
    layout: SlotLayout,
    positions: Tensor,
    table: Tensor,
    rows: Tensor,
    num_tokens: int,
    out: Tensor,
) -> Tensor:
    # Token t reads row rows[t] of ``table``; the tail of ``out`` gets pad_id.
    block, offset, has_slot = layout.locate(positions[:num_tokens])
    physical = table[rows, block].to(torch.int64)
    slots = torch.where(has_slot, physical * layout.block_size + offset, layout.pad_id)
    out[:num_tokens] = slots.to(out.dtype)
    out[num_tokens:] = layout.pad_id
    return out


def slot_mappings_torch(
    query_start_loc: Tensor,
    positions: Tensor,
    block_tables: Sequence[Tensor | None],
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
    kernel_block_sizes: Sequence[int] | None = None,
    slot_mapping_enabled: Sequence[bool] | None = None,
    dcp_sharded: Sequence[bool] | None = None,
    out: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    """Vectorised ``slot_mappings_oracle``: same arguments, same result."""
    layouts, num_tokens, max_num_tokens = _check_groups(
        query_start_loc,
        positions,
        block_tables,
        block_sizes,
        circular,
        idx_mapping,
        num_tokens,
        max_num_tokens,
        cp_world_size,
        cp_rank,
        cp_interleave,
        pad_id,
        out,
        validate,
        kernel_block_sizes=kernel_block_sizes,
        slot_mapping_enabled=slot_mapping_enabled,
        dcp_sharded=dcp_sharded,
    )
    # The real token count, not a padded num_tokens: the tail after it gets pad_id.
    real = min(int(query_start_loc[-1]), num_tokens)
    request = request_of_tokens(query_start_loc, int(query_start_loc[-1]))[:real]
    rows = _rows(query_start_loc, idx_mapping)[request]
    if out is None:
        out = torch.empty(len(layouts), max_num_tokens, dtype=torch.int32, device=positions.device)
    for g, (layout, table) in enumerate(zip(layouts, block_tables, strict=True)):
        out[g] = layout.pad_id
        if not layout.enabled:
            continue  # its table is never read
        mapped = rows >= 0  # a dummy request's tokens read no row
        block, offset, has_slot = layout.locate(torch.where(mapped, positions[:real], 0))
        has_slot = has_slot & mapped
        read = has_slot.nonzero()[:, 0]
        physical = table[rows[read], block[read]].to(torch.int64)
        slots = torch.full_like(block, layout.pad_id)
        slots[read] = physical * layout.block_size + offset[read]
        out[g, :real] = slots.to(out.dtype)
    return out


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
        slot_mappings,
        query_start_loc,
        positions,
        replay_start,
        window,
        prefix_cacheable,
        num_tokens=num_tokens,
        full=validate,
        pad_id=pad_id,
    )
    start = replay_start.to(torch.int64)[request_of_tokens(query_start_loc, num_tokens)]
    pos = positions[:num_tokens].to(torch.int64)
    replayed = (start > 0) & (pos >= start) & (pos < start + window)
    for g, cacheable in enumerate(prefix_cacheable):
        if cacheable:
            slot_mappings[g, :num_tokens].masked_fill_(replayed, pad_id)
    return slot_mappings


# ---------------------------------------------------------------------------------------------
def _check_groups(
    query_start_loc: Tensor,
    positions: Tensor,
    block_tables: Sequence[Tensor | None],
    block_sizes: Sequence[int],
    circular: Sequence[bool] | None,
    idx_mapping: Tensor | None,
    num_tokens: int | None,
    max_num_tokens: int | None,
    cp_world_size: int,
    cp_rank: int,
    cp_interleave: int,
    pad_id: int,
    out: Tensor | None,
    validate: bool,
    **per_group: Sequence | None,
) -> tuple[tuple[SlotLayout, ...], int, int]:
    # The multi-group references' checks, as the fused launcher makes them; ``per_group``:
    # kernel_block_sizes, slot_mapping_enabled, dcp_sharded.
    layouts = group_layouts(
        len(block_tables),
        block_sizes,
        circular,
        cp_world_size=cp_world_size,
        cp_rank=cp_rank,
        cp_interleave=cp_interleave,
        pad_id=pad_id,
        **per_group,
    )
    num_tokens, max_num_tokens = resolve_group_counts(
        query_start_loc, positions, num_tokens, max_num_tokens, validate
    )
    check_slot_mappings_inputs(
        layouts,
        query_start_loc,
        positions,
        block_tables,
        num_tokens,
        max_num_tokens,
        idx_mapping=idx_mapping,
        out=out,
        full=validate,
    )
    return layouts, num_tokens, max_num_tokens


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
        return stacked.to(torch.int32)
    out.copy_(stacked)
    return out
