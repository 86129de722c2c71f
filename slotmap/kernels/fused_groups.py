"""Multi-group (fused) slot mapping: every KV-cache group in one launch.

A model with several KV-cache groups (full attention beside sliding-window attention, say)
needs one slot mapping per group. Launching one kernel per group costs one launch each; this
kernel does them all in one, on a grid of ``(num_groups, num_reqs + 1, parallel_tiles)``:
program ``(g, q, p)`` handles tiles ``p, p + P, p + 2P, ...`` of request ``q`` in group ``g``,
so one long request is spread over ``P`` programs; ``q == num_reqs`` programs pad the tail.

Each group brings its own block table, block sizes (the kernel block its table counts and the
allocation block that context parallelism splits), circular flag and two switches: enabled (a
Mamba state group maps no token) and sharded (context parallelism splits this group's cache).
The kernel finds them in a small table of per-group metadata (``group_metadata``); the
production kernels pass a table of base addresses too. A disabled group, a dummy request
(``idx_mapping`` -1) and the padding after the real token count ``query_start_loc[num_reqs]``
write PAD_ID without forming a block-table address (docs/semantics.md §4).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from slotmap.backend import BACKEND
from slotmap.i18n import _
from slotmap.kernels.common import _block_and_offset, _fill_pad, _gather_from_window
from slotmap.kernels.launch import (
    MAX_PARALLEL_PROGRAMS,
    LaunchKnobs,
    Plan,
    check_grid,
    check_int32_extent,
    check_launch_device,
    fast_launch,
    hot_plan,
    remember_plan,
    warps_option,
)
from slotmap.kernels.slot_mapping import _pad_outside_requests, _real_token_count
from slotmap.kernels.token_grid import (
    _fill_token_grid_pad,
    _token_grid_entries,
    _token_grid_requests,
    token_launch_shape,
    use_token_grid,
)
from slotmap.layout import (
    PAD_SLOT_ID,
    PRODUCTION_TILE,
    SlotLayout,
    cdiv,
    group_layouts_of,
    window_size,
)
from slotmap.validate import check_padded_count, check_slot_mappings_inputs, resolve_counts

SMALL_TILE = 16  # the tile the adaptive choice gives a batch of short requests
SHORT_REQUESTS = 2  # mean tokens a request at or under which a batch counts as short


# Columns of the per-group metadata (``group_metadata``), in order.
META_COLUMNS = ("table", "stride", "kernel_block", "circular", "kv_block", "enabled", "sharded")
_META_WIDTH: tl.constexpr = tl.constexpr(len(META_COLUMNS))


@triton.jit
def _load_group_meta(group_meta_ptr, group_idx):
    # One group's row of the metadata table: scalars the whole program uses.
    meta_ptr = group_meta_ptr + group_idx * _META_WIDTH
    block_table_ptr = tl.load(meta_ptr).to(tl.pointer_type(tl.int32))
    block_table_stride = tl.load(meta_ptr + 1).to(tl.int32)
    block_size = tl.load(meta_ptr + 2).to(tl.int32)
    is_circular = tl.load(meta_ptr + 3) != 0
    kv_block_size = tl.load(meta_ptr + 4).to(tl.int32)
    is_enabled = tl.load(meta_ptr + 5)  # 0 or 1: an int, to combine with `|`
    is_sharded = tl.load(meta_ptr + 6) != 0
    return (
        block_table_ptr,
        block_table_stride,
        block_size,
        is_circular,
        kv_block_size,
        is_enabled,
        is_sharded,
    )


@triton.jit
def _group_block_and_offset(
    pos,  # [TILE] int32 positions
    block_size,  # int: this group's kernel block (its block table's unit)
    kv_block_size,  # int: this group's allocation block (a multiple of block_size)
    is_circular,  # bool: this group is a ring buffer
    is_sharded,  # bool: context parallelism splits this group's cache
    TOTAL_CP_WORLD_SIZE: tl.constexpr,
    TOTAL_CP_RANK: tl.constexpr,
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
):
    # _block_and_offset for one group, whose flags and sizes are runtime values here.
    if is_circular:
        block_indices, slot_offsets, has_slot = _block_and_offset(
            pos, block_size, block_size, 1, 1, 0, 1, True
        )
    elif is_sharded:
        # CP splits allocation blocks: locate in kv blocks, then in the kernel blocks inside.
        kv_blocks, kv_offsets, has_slot = _block_and_offset(
            pos,
            kv_block_size,
            kv_block_size,
            1,
            TOTAL_CP_WORLD_SIZE,
            TOTAL_CP_RANK,
            CP_KV_CACHE_INTERLEAVE_SIZE,
            False,
        )
        inner = kv_offsets // block_size
        block_indices = kv_blocks * (kv_block_size // block_size) + inner
        slot_offsets = kv_offsets - inner * block_size  # not %: a scalar fallback on Ascend
    else:
        # Not split: every position maps here, in kernel blocks.
        block_indices, slot_offsets, has_slot = _block_and_offset(
            pos, block_size, block_size, 1, 1, 0, 1, False
        )
    return block_indices, slot_offsets, has_slot


@triton.jit(
    do_not_specialize=["num_tokens", "max_num_tokens", "num_reqs", "num_rows", "parallel_tiles"]
)
def _compute_slot_mappings_kernel(
    num_tokens,  # int: tokens in the batch, or a padded count (query_start_loc says the real)
    max_num_tokens,  # int: length of each output row
    num_reqs,  # int: requests (a runtime argument: tl.num_programs is slow on Ascend)
    query_start_loc_ptr,  # [num_reqs + 1], int32
    positions_ptr,  # [>= num_tokens], int64
    idx_mapping_ptr,  # [num_reqs], int32/int64: batch index -> table row (if HAS_IDX_MAPPING)
    num_rows,  # int: rows of the smallest enabled group's table (idx_mapping's must be below)
    group_meta_ptr,  # [num_groups, len(META_COLUMNS)], int64: group_metadata
    slot_mappings_ptr,  # [num_groups, max_num_tokens], int32
    slot_mappings_stride,  # int: elements between two groups' rows
    TOTAL_CP_WORLD_SIZE: tl.constexpr,
    TOTAL_CP_RANK: tl.constexpr,
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
    BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,  # fits the smallest linear enabled kernel block
    parallel_tiles,  # int: programs per request along grid axis 2 (runtime: one compile)
    HAS_IDX_MAPPING: tl.constexpr,
    GATHER_AS_FLOAT: tl.constexpr = False,
    LANE_LOADS: tl.constexpr = False,  # GPU: one block-table load a lane, not the window
):
    # slot_mappings[g, t] = block_tables[g][row(q), b] * bs_g + o (b, o: pos in g's blocks)
    group_idx = tl.program_id(0)
    req_idx = tl.program_id(1)
    part = tl.program_id(2)
    slot_mapping_ptr = slot_mappings_ptr + group_idx * slot_mappings_stride

    if req_idx == num_reqs:
        # Padding programs share the tail, from the real token count, tile by tile.
        _pad_outside_requests(
            slot_mapping_ptr,
            query_start_loc_ptr,
            num_reqs,
            num_tokens,
            max_num_tokens,
            part,
            parallel_tiles,
            PAD_ID,
            TILE_BLOCK_SIZE,
        )
        return

    (
        block_table_ptr,
        block_table_stride,
        block_size,
        is_circular,
        kv_block_size,
        is_enabled,
        is_sharded,
    ) = _load_group_meta(group_meta_ptr, group_idx)
    if HAS_IDX_MAPPING:
        row_idx = tl.load(idx_mapping_ptr + req_idx)
    else:
        row_idx = req_idx
    # Both inside [0, num_tokens] whatever int32 query_start_loc holds (unvalidated): the
    # tiles then address only the batch's tokens.
    start_idx = tl.minimum(tl.maximum(tl.load(query_start_loc_ptr + req_idx), 0), num_tokens)
    end_idx = tl.minimum(tl.maximum(tl.load(query_start_loc_ptr + req_idx + 1), 0), num_tokens)
    # A disabled group, a dummy request (-1) or an unvalidated row outside the tables: PAD_ID
    # for the request's tokens, and no block-table address is formed.
    if (is_enabled == 0) | (row_idx < 0) | (row_idx >= num_rows):
        _fill_pad(
            slot_mapping_ptr,
            start_idx + part * TILE_BLOCK_SIZE,
            end_idx,
            parallel_tiles,
            PAD_ID,
            TILE_BLOCK_SIZE,
        )
        return
    # Inside [0, num_rows) now: int32 whatever idx_mapping's width (int64 from vLLM >= 0.32).
    block_table_row_ptr = block_table_ptr + row_idx.to(tl.int32) * block_table_stride

    for tile_start in range(
        start_idx + part * TILE_BLOCK_SIZE, end_idx, parallel_tiles * TILE_BLOCK_SIZE
    ):
        offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offsets < end_idx
        pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
        block_indices, slot_offsets, has_slot = _group_block_and_offset(
            pos,
            block_size,
            kv_block_size,
            is_circular,
            is_sharded,
            TOTAL_CP_WORLD_SIZE,
            TOTAL_CP_RANK,
            CP_KV_CACHE_INTERLEAVE_SIZE,
        )
        valid = mask & has_slot
        if LANE_LOADS:
            # GPU: each lane loads its own entry (coalesced, the row cached in L2), with no
            # min-reduction across the tile and no gather through shared memory. On an NPU
            # a per-lane load is a scalar load: the window is the design there.
            in_row = valid & (block_indices >= 0) & (block_indices < block_table_stride)
            block_numbers = tl.load(block_table_row_ptr + block_indices, mask=in_row, other=0)
        else:
            block_numbers, _ = _gather_from_window(
                block_table_row_ptr,
                block_table_stride,
                block_indices,
                valid,
                BLOCK_TABLE_WINDOW_SIZE,
                GATHER_AS_FLOAT,
            )
        # In the output's width: an int64 output holds slots past 2**31 without wrapping.
        slot_ids = block_numbers.to(slot_mapping_ptr.dtype.element_ty) * block_size + slot_offsets
        slot_ids = tl.where(has_slot, slot_ids, PAD_ID)
        tl.store(slot_mapping_ptr + offsets, slot_ids, mask=mask)


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens", "num_reqs", "num_rows"])
def _compute_slot_mappings_tokens_kernel(
    num_tokens,  # int: tokens in the batch, or a padded count (query_start_loc says the real)
    max_num_tokens,  # int: length of each output row
    num_reqs,  # int: requests
    query_start_loc_ptr,  # [num_reqs + 1], int32
    positions_ptr,  # [>= num_tokens], int64
    idx_mapping_ptr,  # [num_reqs], int32/int64: batch index -> table row (if HAS_IDX_MAPPING)
    num_rows,  # int: rows of the smallest enabled group's table (idx_mapping's must be below)
    group_meta_ptr,  # [num_groups, len(META_COLUMNS)], int64: group_metadata
    slot_mappings_ptr,  # [num_groups, max_num_tokens], int32
    slot_mappings_stride,  # int: elements between two groups' rows
    TOTAL_CP_WORLD_SIZE: tl.constexpr,
    TOTAL_CP_RANK: tl.constexpr,
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
    HAS_IDX_MAPPING: tl.constexpr,
    REQ_LANES: tl.constexpr,  # a power of two >= num_reqs
    PAD_TILE_SIZE: tl.constexpr,  # padding entries a padding program writes
    EARLY_ENDS: tl.constexpr = True,  # sample the request ends before the guess is checked
):
    # The token grid (GPU), as the direct kernel's: program (g, i) maps batch tokens
    # [i*TILE, (i+1)*TILE) in group g. A tile may span several requests, so each lane loads its
    # own block-table entry (no window). A dummy request's lanes (idx_mapping -1) load no
    # entry (``_load_row_entries``) and get PAD_ID.
    group_idx = tl.program_id(0)
    tile_idx = tl.program_id(1)
    slot_mapping_ptr = slot_mappings_ptr + group_idx * slot_mappings_stride
    token_tiles = tl.cdiv(num_tokens, TILE_BLOCK_SIZE)
    if tile_idx >= token_tiles:
        _fill_token_grid_pad(
            slot_mapping_ptr,
            tile_idx,
            token_tiles,
            max_num_tokens,
            PAD_ID,
            TILE_BLOCK_SIZE,
            PAD_TILE_SIZE,
        )
        return

    (
        block_table_ptr,
        block_table_stride,
        block_size,
        is_circular,
        kv_block_size,
        is_enabled,
        is_sharded,
    ) = _load_group_meta(group_meta_ptr, group_idx)
    tile_start = tile_idx * TILE_BLOCK_SIZE
    offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
    mask = offsets < num_tokens
    pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
    # As the direct token kernel: answer each lane's request at once, load, check off the
    # chain, and load again only where the answer was wrong.
    req_idx, likely, lane_ok, one = _token_grid_requests(
        query_start_loc_ptr, num_reqs, num_tokens, tile_start, TILE_BLOCK_SIZE, EARLY_ENDS
    )
    # The real token count masks the lanes, not the loads above: past it, a padded host
    # count's lanes get PAD_ID and read no block table. Branching on it here would put its
    # load ahead of every other.
    real = offsets < _real_token_count(query_start_loc_ptr, num_reqs, num_tokens)
    if is_enabled == 0:
        # A disabled group: PAD_ID, no block-table address.
        tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=offsets < max_num_tokens)
        return
    mask = mask & real
    block_indices, slot_offsets, has_slot = _group_block_and_offset(
        pos,
        block_size,
        kv_block_size,
        is_circular,
        is_sharded,
        TOTAL_CP_WORLD_SIZE,
        TOTAL_CP_RANK,
        CP_KV_CACHE_INTERLEAVE_SIZE,
    )
    in_row = mask & has_slot & (block_indices >= 0) & (block_indices < block_table_stride)
    block_numbers, row_ok = _token_grid_entries(
        query_start_loc_ptr,
        num_reqs,
        num_tokens,
        tile_start,
        block_table_ptr,
        block_table_stride,
        idx_mapping_ptr,
        num_rows,
        block_indices,
        in_row,
        req_idx,
        likely,
        lane_ok,
        one,
        TILE_BLOCK_SIZE,
        REQ_LANES,
        EARLY_ENDS,
        HAS_IDX_MAPPING,
    )
    # In the output's width: an int64 output holds slots past 2**31 without wrapping.
    slot_ids = block_numbers.to(slot_mapping_ptr.dtype.element_ty) * block_size + slot_offsets
    slot_ids = tl.where(mask & has_slot & row_ok, slot_ids, PAD_ID)
    tl.store(slot_mapping_ptr + offsets, slot_ids, mask=offsets < max_num_tokens)


def choose_tiling(num_tokens: int, num_reqs: int) -> tuple[int, int]:
    """Adaptive (tile size, parallel tiles) from the mean request length, without a sync.

    A batch of short requests (decode: two tokens a request or fewer on average) gets the
    small tile, so no program masks off most of a 1024-lane tile. Any other batch gets the
    production 1024 tile, each request spread over ``cdiv(mean, 1024)`` programs, and over at
    least 2 once the batch holds more than one tile: in a skewed batch (a few long prefills
    among many decodes) the mean says nothing about the long requests, and a tile sized by
    the mean made them walk dozens of tiles one after another (docs/performance.md).
    """
    mean = cdiv(num_tokens, max(num_reqs, 1))
    if mean <= SHORT_REQUESTS:
        return SMALL_TILE, 1
    tile = PRODUCTION_TILE
    parallel_tiles = cdiv(mean, tile)
    if num_tokens > tile:
        parallel_tiles = max(parallel_tiles, 2)
    budget = max(MAX_PARALLEL_PROGRAMS // (num_reqs + 1), 1)
    return tile, min(parallel_tiles, budget)


def use_lane_loads(lane_loads: bool | None, gather_as_float: bool | None) -> bool:
    """Whether the request grid loads one block-table entry a lane instead of gathering from
    the window: as asked, else (None) on the GPU unless ``gather_as_float`` asks for the
    window: faster on the H200 on every measured shape (docs/performance.md). The NPU (a
    per-lane load is a scalar load there) and the interpreter (which runs the lessons) keep
    production's window gather."""
    if lane_loads and gather_as_float is not None:
        raise ValueError(_("gather_as_float belongs to the window gather: not with lane_loads"))
    if lane_loads is None:
        return BACKEND.policy == "cuda" and gather_as_float is None
    return bool(lane_loads)


_META_CACHE: OrderedDict[tuple, Tensor] = OrderedDict()
_META_CACHE_SIZE = 32


def group_metadata(
    block_tables: Sequence[Tensor | None],
    layouts: Sequence[SlotLayout],
    device: torch.device | None = None,
) -> Tensor:
    """[num_groups, len(META_COLUMNS)] int64 on the enabled tables' device (META_COLUMNS:
    table address, row stride, kernel block size, circular, allocation block size, enabled,
    sharded). A disabled group's table (never read) may be None: its row holds address 0
    and stride 0. ``device``: where the kernel runs (None: the first enabled table's).

    Cached by the tables' addresses: serving engines keep persistent block tables, so after
    the first step this is a dictionary lookup and no host-to-device copy (which also keeps
    the launch capturable in a graph).
    """
    # A disabled group's table is never read: only a 2-D tensor's address goes in its row.
    read = [
        (t, layout)
        if layout.enabled or (isinstance(t, Tensor) and t.dim() == 2)
        else (None, layout)
        for t, layout in zip(block_tables, layouts, strict=True)
    ]
    if device is None:
        device = next((t.device for t, x in read if t is not None and x.enabled), None)
    key = (
        device,
        tuple((0, 0) if t is None else (t.data_ptr(), t.stride(0)) for t, _ in read),
        tuple(layouts),
    )
    meta = _META_CACHE.get(key)
    if meta is None:
        rows = [
            [
                0 if t is None else t.data_ptr(),
                0 if t is None else t.stride(0),
                layout.block_size,
                int(layout.circular),
                layout.kv_cache_block_size,
                int(layout.enabled),
                int(layout.cp_world_size > 1),
            ]
            for t, layout in read
        ]
        meta = torch.tensor(rows, dtype=torch.int64, device=device)
        _META_CACHE[key] = meta
        if len(_META_CACHE) > _META_CACHE_SIZE:
            _META_CACHE.popitem(last=False)
    else:
        _META_CACHE.move_to_end(key)
    return meta


def compute_slot_mappings(
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
    tile_size: int | None = None,
    parallel_tiles: int | None = None,
    gather_as_float: bool | None = None,
    num_warps: int | None = None,
    token_parallel: bool | None = None,
    lane_loads: bool | None = None,
) -> Tensor:
    """Slot mappings of all KV-cache groups in one launch.

    Same arguments and result as ``slotmap.slot_mappings_oracle`` (docs/semantics.md §4):
    group g has its own block table, allocation and kernel block sizes, circular flag,
    ``slot_mapping_enabled`` and ``dcp_sharded`` switches; ``idx_mapping`` -1 marks a dummy
    request; the padding starts at the real token count ``query_start_loc[num_reqs]``, so
    ``num_tokens`` may be a padded count. Returns [num_groups, max_num_tokens] int32, or
    writes ``out``. ``validate`` as ``compute_slot_mapping``'s; ``tile_size``,
    ``parallel_tiles``, ``num_warps``, ``gather_as_float``, ``token_parallel`` (the direct
    kernels' token grid) and ``lane_loads`` (one block-table load a lane on the request grid)
    force a launch choice; None lets ``choose_tiling``, ``use_token_grid`` and
    ``use_lane_loads`` choose.
    """
    tables = tuple(block_tables)
    switches = (kernel_block_sizes, slot_mapping_enabled, dcp_sharded)
    layouts = group_layouts_of(
        len(tables),
        block_sizes,
        circular,
        *switches,
        cp_world_size=cp_world_size,
        cp_rank=cp_rank,
        cp_interleave=cp_interleave,
        pad_id=pad_id,
    )
    knobs = LaunchKnobs.of(
        tile_size, parallel_tiles, num_warps, gather_as_float, token_parallel, lane_loads
    )
    key = ("fused", layouts, knobs, num_tokens, max_num_tokens, idx_mapping is None)
    read = read_tables(tables, layouts, positions)
    tensors = (query_start_loc, positions, read, idx_mapping, out)
    plan = None if validate else hot_plan(key, num_tokens, max_num_tokens, tensors)
    if plan is None:
        counts = (num_tokens, max_num_tokens)
        plan, num_tokens, max_num_tokens = plan_slot_mappings(
            layouts, knobs, *tensors[:2], tables, idx_mapping, *counts, out, validate
        )
        if out is None:
            out = torch.empty(
                len(tables), max_num_tokens, dtype=torch.int32, device=positions.device
            )
        check_int32_extent("out", out)
        remember_plan(key, plan, (*tensors[:4], out))
    if plan.meta is None:  # the tables' rows and addresses, until the tables change
        plan.meta = (
            enabled_rows(tables, layouts),
            group_metadata(tables, layouts, positions.device),
        )
    args = (
        num_tokens,
        max_num_tokens or num_tokens,
        query_start_loc.shape[0] - 1,  # num_reqs
        query_start_loc,
        positions,
        idx_mapping if idx_mapping is not None else query_start_loc,
        *plan.meta,  # num_rows, group_meta
        out,
        out.stride(0),
    )
    if not fast_launch(plan, args):  # Triton's C launcher, else its JIT
        plan.kernel[plan.grid](*args, **plan.constants, **plan.runtime)
    return out


def read_tables(
    tables: tuple[Tensor | None, ...], layouts: tuple[SlotLayout, ...], stand_in: Tensor
) -> tuple[Tensor, ...]:
    """The tables as the plan cache's structural checks see them: a disabled group's table
    (never read, may be None) stands in as the first enabled one, or as ``stand_in``."""
    # ``is``, not ``in``: ``None in tables`` would compare tensors with ``==``.
    if all(_enabled(layouts)) and not any(t is None for t in tables):
        return tables
    enabled = [t for t, layout in zip(tables, layouts, strict=True) if layout.enabled]
    first = enabled[0] if enabled else stand_in
    return tuple(t if layout.enabled else first for t, layout in zip(tables, layouts, strict=True))


@functools.lru_cache(maxsize=64)
def _enabled(layouts: tuple[SlotLayout, ...]) -> tuple[bool, ...]:
    return tuple(layout.enabled for layout in layouts)


def enabled_rows(tables: tuple[Tensor | None, ...], layouts: tuple[SlotLayout, ...]) -> int:
    """Rows of the smallest enabled group's table: 0 when none is (every row is outside)."""
    rows = (t.shape[0] for t, layout in zip(tables, layouts, strict=True) if layout.enabled)
    return min(rows, default=0)


def plan_slot_mappings(
    layouts: tuple[SlotLayout, ...],
    knobs: LaunchKnobs,
    query_start_loc: Tensor,
    positions: Tensor,
    tables: tuple[Tensor | None, ...],
    idx_mapping: Tensor | None,
    num_tokens: int | None,
    max_num_tokens: int | None,
    out: Tensor | None,
    validate: bool,
) -> tuple[Plan, int, int]:
    """The fused launcher's full way: every check, then the kernel, grid and constants
    (``bench`` launches the same plan raw). Returns (plan, num_tokens, max_num_tokens)."""
    # As validate.resolve_group_counts: num_tokens may be a padded count.
    full_counts = validate and num_tokens is None
    num_tokens, max_num_tokens = resolve_counts(
        query_start_loc, positions, num_tokens, max_num_tokens, full_counts
    )
    if validate:
        check_padded_count(query_start_loc, num_tokens)
    num_reqs = query_start_loc.numel() - 1
    # The window's precondition is checked where the plan will gather from a window.
    tokens = use_token_grid(num_tokens, num_reqs, knobs.token_parallel, knobs.parallel_tiles)
    tile = knobs.tile_size or choose_tiling(num_tokens, num_reqs)[0]
    check_slot_mappings_inputs(
        layouts,
        query_start_loc,
        positions,
        tables,
        num_tokens,
        max_num_tokens,
        idx_mapping=idx_mapping,
        out=out,
        full=validate,
        tile_size=None if tokens else tile,
    )
    check_launch_device(positions)
    for g, (table, layout) in enumerate(zip(tables, layouts, strict=True)):
        if layout.enabled:
            check_int32_extent(f"block_tables[{g}]", table)
    capacity = enabled_rows(tables, layouts) if idx_mapping is None else idx_mapping.numel()
    plan = fused_plan(
        layouts, knobs, num_tokens, max_num_tokens, num_reqs, idx_mapping is not None, capacity
    )
    return plan, num_tokens, max_num_tokens


def fused_plan(
    layouts: tuple[SlotLayout, ...],
    knobs: LaunchKnobs,
    num_tokens: int,
    max_num_tokens: int,
    num_reqs: int,
    has_idx_mapping: bool,
    req_capacity: int,
) -> Plan:
    """The fused kernels' launch for a batch: arithmetic only, no tensor read (the launcher,
    ``SlotMapper`` and warm-up). ``req_capacity``: idx_mapping's entries, else the smallest
    enabled table's rows."""
    tokens = use_token_grid(num_tokens, num_reqs, knobs.token_parallel, knobs.parallel_tiles)
    lane_loads = use_lane_loads(knobs.lane_loads, knobs.gather_as_float)
    tile, parallel = choose_tiling(num_tokens, num_reqs)
    tile = tile if knobs.tile_size is None else knobs.tile_size
    parallel = parallel if knobs.parallel_tiles is None else knobs.parallel_tiles
    # The batch's CP, from a sharded group (unsharded and disabled groups have none).
    cp = next((layout for layout in layouts if layout.cp_world_size > 1), layouts[0])
    constants = dict(
        TOTAL_CP_WORLD_SIZE=cp.cp_world_size,
        TOTAL_CP_RANK=cp.cp_rank,
        CP_KV_CACHE_INTERLEAVE_SIZE=cp.cp_interleave,
        PAD_ID=cp.pad_id,
        HAS_IDX_MAPPING=has_idx_mapping,
    )
    if tokens:
        # The token grid, one row of programs a group: token tiles, then padding programs.
        kernel = _compute_slot_mappings_tokens_kernel
        tile, (programs,), options = token_launch_shape(
            num_tokens,
            max_num_tokens,
            num_reqs,
            knobs.tile_size,
            knobs.num_warps,
            req_capacity=req_capacity,
        )
        del options["num_reqs"]  # a positional argument of this kernel
        grid = (len(layouts), programs)
        runtime = {}
    else:
        # The request grid: program (g, q, p) maps tiles p, p + P, ... of request q in group
        # g; q == num_reqs pads the tail. The window fits the smallest kernel block of a
        # linear group that maps tokens.
        kernel = _compute_slot_mappings_kernel
        grid = (len(layouts), num_reqs + 1, parallel)
        runtime = {"parallel_tiles": parallel}
        linear = [x.block_size for x in layouts if x.enabled and not x.circular]
        options = dict(
            BLOCK_TABLE_WINDOW_SIZE=window_size(tile, min(linear)) if linear else 2,
            GATHER_AS_FLOAT=knobs.window_gather_as_float,
            LANE_LOADS=lane_loads,
            **warps_option(tile, knobs.num_warps),
        )
    constants = constants | options | {"TILE_BLOCK_SIZE": tile}
    return Plan(kernel, check_grid(grid), constants, runtime)
