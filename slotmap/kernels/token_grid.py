"""The token grid: the direct kernels' GPU launch, where program i maps batch tokens
``[i * TILE, (i + 1) * TILE)``, whichever requests they belong to.

Each program finds its tokens' requests itself (``_token_grid_requests``, then
``_token_grid_entries``); the programs after the last token tile write the padding tail,
PAD_TILE entries each. On a decode batch the chain of dependent loads shrinks from
query_start_loc -> position -> block table -> store to position -> block table -> store, on a
few programs instead of one a request (docs/performance.md). No lesson teaches it; the lessons
teach production's request grid.
"""

from __future__ import annotations

import triton
import triton.language as tl

from slotmap.i18n import _
from slotmap.kernels.common import INT32_MAX_SENTINEL
from slotmap.kernels.launch import POLICY, check_tile, warps_option
from slotmap.layout import next_power_of_2

MAX_TOKEN_GRID_REQS = 4096  # a tile the first answer does not settle loads every end
MAX_TOKEN_GRID_TOKENS = 1 << 16  # larger: bandwidth-bound, where the request grid is as fast
MAX_TOKEN_GRID_MEAN = 64  # longer requests on average: the request grid's tiles are as fast
TOKENS_PER_GRID = 256  # the tile spreads a batch over about this many programs (>= 32 lanes)
PAD_TILE = 1024  # entries of the padding tail a padding program writes


@triton.jit
def _guess_requests(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    num_tokens,  # int: real tokens in the batch
    tile_start,  # int: first batch token of the tile
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # The token grid's fast case: the tile is a run of one-token (decode) requests, token t
    # being request t at the batch's front or request t - (num_tokens - num_reqs) at its
    # back. Returns each lane's guessed request; ``likely``, from two scalar loads: the guess
    # starts at the tile's first token and its last lane's request ends after the tile's last
    # token (qsl[g_0] == t_0, qsl[g_0 + n] == t_0 + n; a branch on it waits for no
    # reduction); and ``lane_ok``, each lane's own end (qsl[g_i + 1] == t_i + 1), which
    # ``_guess_is_right`` folds after the block-table load. The loads wait for nothing, so
    # they fly together with the positions.
    lane = tl.arange(0, TILE_BLOCK_SIZE)
    offsets = tile_start + lane
    real = offsets < num_tokens
    shift = num_tokens - num_reqs
    first_guess = tl.where(tile_start >= shift, tile_start - shift, tile_start)
    guess = first_guess + lane
    stops = tl.load(query_start_loc_ptr + guess + 1, mask=real & (guess < num_reqs), other=-1)
    n = tl.minimum(num_tokens - tile_start, TILE_BLOCK_SIZE)  # real lanes, >= 1
    start = tl.load(query_start_loc_ptr + first_guess, mask=first_guess < num_reqs, other=-1)
    stop = tl.load(
        query_start_loc_ptr + first_guess + n, mask=first_guess + n <= num_reqs, other=-1
    )
    likely = (start == tile_start) & (stop == tile_start + n)
    return guess, likely.to(tl.int32), (stops == offsets + 1) | ~real


@triton.jit
def _guess_is_right(likely, lane_ok):
    # The whole check of ``_guess_requests``'s guess: the first start and every lane's end.
    return likely & tl.min(lane_ok.to(tl.int32), 0)  # 1: right


@triton.jit
def _request_ends(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    REQ_LANES: tl.constexpr,  # a power of two >= num_reqs
):
    # Every request's end, query_start_loc[1..num_reqs], in one load; INT32_MAX past them.
    j = tl.arange(0, REQ_LANES)
    return tl.load(query_start_loc_ptr + 1 + j, mask=j < num_reqs, other=INT32_MAX_SENTINEL)


@triton.jit
def _sample_request_ends(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # The first and the last TILE / 2 request ends, one a lane (every end when num_reqs <=
    # TILE), INT32_MAX past them; the first end of the back half; and how many ends lie
    # between the halves, sampled by neither.
    half: tl.constexpr = TILE_BLOCK_SIZE // 2
    lane = tl.arange(0, TILE_BLOCK_SIZE)
    middle = tl.maximum(num_reqs - TILE_BLOCK_SIZE, 0)
    j = tl.where(lane < half, lane, lane + middle)
    ends = tl.load(query_start_loc_ptr + 1 + j, mask=j < num_reqs, other=INT32_MAX_SENTINEL)
    back_first = tl.load(
        query_start_loc_ptr + 1 + half + middle,
        mask=half + middle < num_reqs,
        other=INT32_MAX_SENTINEL,
    )
    return ends, back_first, middle


@triton.jit
def _sampled_request(
    ends,  # [TILE] int32: _sample_request_ends's sample
    back_first,  # int: its back half's first end
    middle,  # int: ends between its halves
    num_reqs,  # int: requests in the batch
    num_tokens,  # int: real tokens in the batch
    tile_start,  # int: first batch token of the tile
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # The request of the tile's first token, and whether the whole tile lies inside it, from
    # the sample alone (one reduction, no further load). The request is the number of ends
    # at or below the token: every middle end is once the back half's first end is. Exact,
    # and the answer settled, where that request's own end was sampled (one of the first
    # TILE / 2 requests or of the last TILE / 2 - 1; any request when num_reqs <= TILE) and
    # no sampled end falls inside the tile; otherwise the caller falls back to the histogram.
    half: tl.constexpr = TILE_BLOCK_SIZE // 2
    last = tl.minimum(tile_start + TILE_BLOCK_SIZE, num_tokens) - 1
    # Both counts in one sum: ends at or below the first token in the low 16 bits, ends
    # inside the tile (after the first token, at or below the last) in the high ones.
    packed = tl.where(ends <= tile_start, 1, tl.where(ends <= last, 1 << 16, 0))
    counts = tl.sum(packed, 0)
    req = (counts & 0xFFFF) + tl.where(back_first <= tile_start, middle, 0)
    sampled_end = (req < half) | (req >= half + middle)
    settled = sampled_end & (req < num_reqs) & ((counts >> 16) == 0)
    return req, settled.to(tl.int32)


@triton.jit
def _histogram_requests(
    ends,  # [REQ_LANES] int32: _request_ends
    tile_start,  # int: first batch token of the tile
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # Any tile: a token's request is the number of request ends at or below it. A histogram
    # of where the ends fall in the tile and its running sum count them for every lane
    # without a [TILE, num_reqs] compare. Empty requests share an end with the next one and
    # are skipped by the count.
    lane = tl.arange(0, TILE_BLOCK_SIZE)
    rel = ends - tile_start  # <= 0: ended before the tile, counts for every lane
    past = rel >= TILE_BLOCK_SIZE  # ends after the tile: counts for no lane
    bins = tl.minimum(tl.maximum(rel, 0), TILE_BLOCK_SIZE - 1)
    req_idx = tl.cumsum(tl.histogram(bins, TILE_BLOCK_SIZE), 0)
    # The ends past the tile went to the last bin, which only the last lane sums.
    past_count = tl.sum(past.to(tl.int32), 0)
    return req_idx - tl.where(lane == TILE_BLOCK_SIZE - 1, past_count, 0)


@triton.jit
def _token_grid_requests(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    num_tokens,  # int: real tokens in the batch
    tile_start,  # int: first batch token of the tile
    TILE_BLOCK_SIZE: tl.constexpr,
    EARLY_ENDS: tl.constexpr,  # the batch cannot be all decode: sample the request ends now
):
    # The token grid's first answer to "which request is each lane's token in", for the
    # block-table load to use at once; ``_token_grid_settle`` checks it after that load.
    # A likely decode run takes the guess; any other tile of a batch that cannot be all
    # decode takes its first token's request (right for a long request's tiles), counted on
    # a sample of the request ends: one load a lane and one reduction, not a load of every
    # end (faster on mixed batches: docs/performance.md). Only a tile that the answer does not
    # settle loads every end, after the block-table load.
    req_idx, likely, lane_ok = _guess_requests(
        query_start_loc_ptr, num_reqs, num_tokens, tile_start, TILE_BLOCK_SIZE
    )
    one = likely * 0  # the tile lies inside one request, as sampled
    if EARLY_ENDS:
        ends, back_first, middle = _sample_request_ends(
            query_start_loc_ptr, num_reqs, TILE_BLOCK_SIZE
        )
        first_req, one = _sampled_request(
            ends, back_first, middle, num_reqs, num_tokens, tile_start, TILE_BLOCK_SIZE
        )
        req_idx = tl.where(likely == 1, req_idx, first_req)
    return req_idx, likely, lane_ok, one


@triton.jit
def _token_grid_settle(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    num_tokens,  # int: real tokens in the batch
    tile_start,  # int: first batch token of the tile
    req_idx,  # [TILE] int32: _token_grid_requests's answer
    likely,  # int: _token_grid_requests's
    lane_ok,  # [TILE] bool: _token_grid_requests's
    one,  # int: _token_grid_requests's
    TILE_BLOCK_SIZE: tl.constexpr,
    REQ_LANES: tl.constexpr,  # a power of two >= num_reqs
    EARLY_ENDS: tl.constexpr,
):
    # After the first block-table load, off its chain: was ``req_idx`` right? Returns
    # (1, req_idx) if so, else (0, every lane's request by a histogram of all the request
    # ends), which the kernel loads again. Only tiles across requests that are not a decode
    # run, tiles of a request in the batch's middle, or batches that break the guess's
    # pattern pay for that.
    settled = _guess_is_right(likely, lane_ok)
    if EARLY_ENDS:
        settled = tl.where(likely == 1, settled, one)
    if settled == 0:
        ends = _request_ends(query_start_loc_ptr, num_reqs, REQ_LANES)
        req_idx = _histogram_requests(ends, tile_start, TILE_BLOCK_SIZE)
    return settled, req_idx


@triton.jit
def _load_row_entries(
    block_table_ptr,  # this group's block table, int32
    block_table_stride,  # int: entries per row
    idx_mapping_ptr,  # [num_reqs], int32/int64: batch index -> table row (if HAS_IDX_MAPPING)
    num_rows,  # int: rows of the block table (idx_mapping's entries must be below it)
    req_idx,  # [TILE] int32: each lane's request
    num_reqs,  # int: requests in the batch
    block_indices,  # [TILE] int32: each lane's logical block
    in_row,  # [TILE] bool: lanes with an entry to load
    HAS_IDX_MAPPING: tl.constexpr,
):
    # block_table[row(q), b] for every lane, each lane its own load (the token grid: a
    # tile may span requests), and whether the lane's row exists. Lanes of no request
    # (q >= num_reqs) load nothing, nor lanes of a dummy request (idx_mapping -1) or whose
    # unvalidated idx_mapping row is outside [0, num_rows): their tokens get PAD_ID.
    in_batch = in_row & (req_idx < num_reqs)
    if HAS_IDX_MAPPING:
        # Every lane of a request reads its row number, its block inside the row or not: a
        # dummy request's token gets PAD_ID whatever its stale position.
        row_idx = tl.load(idx_mapping_ptr + req_idx, mask=req_idx < num_reqs, other=0)
        row_ok = (row_idx >= 0) & (row_idx < num_rows)
        row_idx = tl.where(row_ok, row_idx, 0).to(tl.int32)  # -1 forms no address
    else:
        row_idx = req_idx
        row_ok = req_idx == req_idx
    entries = tl.load(
        block_table_ptr + row_idx * block_table_stride + block_indices,
        mask=in_batch & row_ok,
        other=0,
    )
    return entries, row_ok


@triton.jit
def _token_grid_entries(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    num_tokens,  # int: real tokens in the batch
    tile_start,  # int: first batch token of the tile
    block_table_ptr,  # this group's block table, int32
    block_table_stride,  # int: entries per row
    idx_mapping_ptr,  # [num_reqs], int32 (if HAS_IDX_MAPPING)
    num_rows,  # int: rows of the block table
    block_indices,  # [TILE] int32: each lane's logical block
    in_row,  # [TILE] bool: lanes with an entry to load
    req_idx,  # [TILE] int32: _token_grid_requests's answer
    likely,  # int: _token_grid_requests's
    lane_ok,  # [TILE] bool: _token_grid_requests's
    one,  # int: _token_grid_requests's
    TILE_BLOCK_SIZE: tl.constexpr,
    REQ_LANES: tl.constexpr,
    EARLY_ENDS: tl.constexpr,
    HAS_IDX_MAPPING: tl.constexpr,
):
    # Both token kernels' block-table entries (and _load_row_entries's row_ok): load with the
    # first answer at once, then settle it (off the load's chain) and load again only where
    # it was wrong.
    block_numbers, row_ok = _load_row_entries(
        block_table_ptr,
        block_table_stride,
        idx_mapping_ptr,
        num_rows,
        req_idx,
        num_reqs,
        block_indices,
        in_row,
        HAS_IDX_MAPPING,
    )
    settled, req_idx = _token_grid_settle(
        query_start_loc_ptr,
        num_reqs,
        num_tokens,
        tile_start,
        req_idx,
        likely,
        lane_ok,
        one,
        TILE_BLOCK_SIZE,
        REQ_LANES,
        EARLY_ENDS,
    )
    if settled == 0:
        block_numbers, row_ok = _load_row_entries(
            block_table_ptr,
            block_table_stride,
            idx_mapping_ptr,
            num_rows,
            req_idx,
            num_reqs,
            block_indices,
            in_row,
            HAS_IDX_MAPPING,
        )
    return block_numbers, row_ok


@triton.jit
def _fill_token_grid_pad(
    slot_mapping_ptr,  # output row
    tile_idx,  # int: this program's index on the token grid (>= token_tiles)
    token_tiles,  # int: programs that map tokens, cdiv(num_tokens, TILE)
    max_num_tokens,  # int: length of the output row
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
    PAD_TILE_SIZE: tl.constexpr,
):
    # The token grid's padding programs: the tail after the last token tile (whose own lanes
    # past num_tokens it pads itself), PAD_TILE_SIZE entries a program.
    first = token_tiles * TILE_BLOCK_SIZE + (tile_idx - token_tiles) * PAD_TILE_SIZE
    offsets = first + tl.arange(0, PAD_TILE_SIZE)
    tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=offsets < max_num_tokens)


def use_token_grid(
    num_tokens: int, num_reqs: int, token_parallel: bool | None, parallel_tiles: int | None
) -> bool:
    """Whether a direct launch takes the token grid: as asked, else (``token_parallel``
    None) the GPU's and the interpreter's choice for a batch of short requests: at most
    MAX_TOKEN_GRID_MEAN tokens a request on average, MAX_TOKEN_GRID_TOKENS tokens and
    MAX_TOKEN_GRID_REQS requests, and no ``parallel_tiles`` given. Never by default on the
    NPU, where production's request grid is the design (a per-lane block-table load is a
    scalar load there, and ``tl.histogram`` has not run on triton-ascend)."""
    if token_parallel is None:
        return (
            POLICY != "npu"
            and parallel_tiles is None
            and num_reqs <= MAX_TOKEN_GRID_REQS
            and num_tokens <= MAX_TOKEN_GRID_TOKENS
            and num_tokens <= MAX_TOKEN_GRID_MEAN * max(num_reqs, 1)
        )
    if token_parallel and parallel_tiles is not None:
        raise ValueError(_("parallel_tiles belongs to the request grid: not with token_parallel"))
    if token_parallel and num_reqs > MAX_TOKEN_GRID_REQS:
        raise ValueError(
            _("token_parallel takes at most {most} requests, got {num_reqs}").format(
                most=MAX_TOKEN_GRID_REQS, num_reqs=num_reqs
            )
        )
    return bool(token_parallel)


def token_launch_shape(
    num_tokens: int,
    max_num_tokens: int,
    num_reqs: int,
    tile_size: int | None,
    num_warps: int | None,
    req_capacity: int = 0,
) -> tuple[int, tuple[int], dict]:
    """(tile, grid, launch options) of a token-grid launch; None picks, a number is taken.

    * tile: on the GPU ``next_power_of_2(num_tokens / TOKENS_PER_GRID)`` within 32..1024; the
      interpreter takes the lessons' 1024. Small tiles on one warp win on decode and mixed
      batches (no cross-warp reduction; swept on the H200, docs/performance.md);
    * warps: one up to 64 lanes, 4 above;
    * the kernel's ``num_reqs``, ``REQ_LANES`` (request ends a miss loads: sized for
      ``req_capacity``, the block table's rows, so that a serving loop whose batch grows and
      shrinks compiles one kernel, not one per power of two of requests) and
      ``PAD_TILE_SIZE``, and ``EARLY_ENDS``: a batch that cannot be all decode
      (``num_tokens != num_reqs``) samples the request ends up front, beside the positions;
      a possible decode batch loads them only when its guess misses.
    """
    if tile_size is None:
        if POLICY == "cpu":
            tile_size = 1024
        else:
            wanted = next_power_of_2(-(-num_tokens // TOKENS_PER_GRID))
            tile_size = min(max(wanted, 32), 1024)
    else:
        check_tile(tile_size)
    if num_warps is None and POLICY != "npu":
        num_warps = 1 if tile_size <= 64 else 4
    token_tiles = -(-num_tokens // tile_size)
    pad_programs = -(-max(max_num_tokens - token_tiles * tile_size, 0) // PAD_TILE)
    options = warps_option(tile_size, num_warps)
    options.update(
        num_reqs=num_reqs,
        REQ_LANES=next_power_of_2(max(num_reqs, min(req_capacity, MAX_TOKEN_GRID_REQS))),
        PAD_TILE_SIZE=PAD_TILE,
        EARLY_ENDS=num_tokens != num_reqs,
    )
    return tile_size, (max(token_tiles + pad_programs, 1),), options
