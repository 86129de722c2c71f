"""Input validation shared by every launcher and reference (docs/semantics.md §5).

Each check raises ``ValueError`` naming the offending request, token and value. The checks
that read tensor contents cost a device synchronisation, so launchers run them only with
``validate=True`` (the default); ``validate=False`` keeps just the shape checks that the
kernels rely on never to write outside their output. The integer configuration is checked
where it is built, in ``slotmap.layout.SlotLayout``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from slotmap.i18n import N_, _, tr
from slotmap.layout import (
    INT32_MAX,
    INT32_MIN,
    PAD_SLOT_ID,
    SlotLayout,
    as_int,
    check_pad_id,
    request_of_tokens,
    window_size,
)

OUT_DTYPES = (torch.int32, torch.int64)
IDX_MAPPING_DTYPES = (torch.int32, torch.int64)


class WindowPreconditionError(ValueError):
    """The window precondition broke (docs/semantics.md): a ValueError that a judge tells apart
    by its class, since its words are translated."""


def _fail(message: str, error: type[ValueError] = ValueError) -> None:
    raise error(message)


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_is_tensor(name: str, value: object) -> None:
    """A tensor argument is a torch.Tensor (not a list or a number): named before any use."""
    if not isinstance(value, Tensor):
        _fail(
            _("{name} must be a torch.Tensor, got {type}").format(
                name=name, type=type(value).__name__
            )
        )


def check_tensor(
    name: str,
    tensor: Tensor,
    dtypes: Sequence[torch.dtype],
    ndim: int,
    device: torch.device,
    anchor: str = N_("positions are"),
) -> None:
    """Type, rank, device and contiguity of one input tensor; ``device`` is that of the
    tensor the message names by ``anchor`` ("positions are", "key is": marked with ``N_``)."""
    check_is_tensor(name, tensor)
    if tensor.dtype not in dtypes:
        wanted = _(" or ").join(_dtype(d) for d in dtypes)
        _fail(
            _("{name} must be {wanted}, got {dtype}").format(
                name=name, wanted=wanted, dtype=_dtype(tensor.dtype)
            )
        )
    if tensor.dim() != ndim:
        _fail(
            _("{name} must have {ndim} dimension(s), got shape {shape}").format(
                name=name, ndim=ndim, shape=tuple(tensor.shape)
            )
        )
    if tensor.device != device:
        _fail(
            _("{name} is on {device} but {anchor} on {expected}: use one device").format(
                name=name, device=tensor.device, anchor=tr(anchor), expected=device
            )
        )
    if not tensor.is_contiguous():
        _fail(
            _("{name} must be contiguous (stride {stride}): call .contiguous()").format(
                name=name, stride=tuple(tensor.stride())
            )
        )


def resolve_counts(
    query_start_loc: Tensor,
    positions: Tensor,
    num_tokens: int | None,
    max_num_tokens: int | None,
    full: bool,
) -> tuple[int, int]:
    """Check query_start_loc and return (num_tokens, max_num_tokens)."""
    check_is_tensor("positions", positions)
    check_is_tensor("query_start_loc", query_start_loc)
    num_tokens = as_int("num_tokens", num_tokens, optional=True)
    max_num_tokens = as_int("max_num_tokens", max_num_tokens, optional=True)
    device = positions.device
    check_tensor("positions", positions, (torch.int64,), 1, device)
    check_tensor("query_start_loc", query_start_loc, (torch.int32,), 1, device)
    if query_start_loc.numel() < 1:
        _fail(_("query_start_loc needs num_reqs + 1 >= 1 entries, got 0"))
    if full:
        check_query_start_loc(query_start_loc)
    if num_tokens is None or full:
        last = int(query_start_loc[-1])
        if num_tokens is not None and num_tokens != last:
            _fail(
                _("num_tokens is {num_tokens} but query_start_loc ends at {last}").format(
                    num_tokens=num_tokens, last=last
                )
            )
        num_tokens = last
    if max_num_tokens is None:
        max_num_tokens = num_tokens
    if num_tokens < 0:
        _fail(_("num_tokens must be >= 0, got {num_tokens}").format(num_tokens=num_tokens))
    if num_tokens > max_num_tokens:
        _fail(
            _("num_tokens {num_tokens} exceeds max_num_tokens {max_num_tokens}").format(
                num_tokens=num_tokens, max_num_tokens=max_num_tokens
            )
        )
    if positions.numel() < num_tokens:
        _fail(
            _("too few positions: {count} for {num_tokens} tokens").format(
                count=positions.numel(), num_tokens=num_tokens
            )
        )
    return num_tokens, max_num_tokens


def check_query_start_loc(query_start_loc: Tensor) -> None:
    """query_start_loc starts at 0 and never decreases (so no entry is negative)."""
    starts = query_start_loc.to(torch.int64)
    first = int(starts[0])
    if first != 0:
        _fail(
            _(
                "query_start_loc[0] must be 0, got {first}: tokens before it belong to no request"
            ).format(first=first)
        )
    drops = (starts[1:] < starts[:-1]).nonzero()
    if drops.numel():
        q = int(drops[0, 0])
        _fail(
            _(
                "request {q}: query_start_loc is not monotone "
                "(query_start_loc[{q}] = {start} > query_start_loc[{next}] = {next_start})"
            ).format(q=q, start=int(starts[q]), next=q + 1, next_start=int(starts[q + 1]))
        )


def check_out(
    out: Tensor | None,
    shape: tuple[int, ...],
    device: torch.device,
    inputs: dict[str, Tensor | None] | None = None,
) -> None:
    """A caller's persistent output buffer must hold the whole output, and share no memory
    with the ``inputs`` the kernel reads (name -> tensor)."""
    if out is None:
        return
    check_tensor("out", out, OUT_DTYPES, len(shape), device)
    if tuple(out.shape) != shape:
        _fail(
            _("out has shape {shape}, expected {expected}").format(
                shape=tuple(out.shape), expected=shape
            )
        )
    for name, tensor in (inputs or {}).items():
        check_no_overlap("out", out, name, tensor)


def check_no_overlap(name: str, written: Tensor, other_name: str, other: Tensor | None) -> None:
    """A tensor a kernel writes shares no byte with one it reads: the kernel would read its
    own output (positions overwritten by slots halfway through). Both are contiguous here,
    so each is one byte range; attribute reads only, no device sync."""
    if other is None or other.device != written.device or written.is_meta:
        return  # a meta tensor has no memory to share
    if not written.numel() or not other.numel():
        return
    start, other_start = written.data_ptr(), other.data_ptr()
    end = start + written.numel() * written.element_size()
    other_end = other_start + other.numel() * other.element_size()
    if start < other_end and other_start < end:
        _fail(
            _("{name} shares memory with {other}: pass a separate output tensor").format(
                name=name, other=other_name
            )
        )


def check_tokens(
    layout: SlotLayout,
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    num_tokens: int,
    *,
    tile_size: int | None,
    rows: Tensor | None = None,
    group: int | None = None,
    out: Tensor | None = None,
) -> None:
    """Per-token checks: positions, block indices, slots and the window precondition.

    ``rows`` maps request -> block-table row (``idx_mapping``; -1: a dummy request, whose
    tokens have no slot and are not checked past int32); ``group`` only names the group
    in messages. ``tile_size`` None skips the window precondition (kernels without a window).
    Slots must fit the output's dtype (int32 when ``out`` is None).
    """
    where = _("group {group}, ").format(group=group) if group is not None else ""
    request = request_of_tokens(query_start_loc, num_tokens)
    pos = positions[:num_tokens]

    def name(token: int) -> str:
        return where + _("request {request}, token {token}").format(
            request=int(request[token]), token=token
        )

    def first(mask: Tensor) -> int | None:
        hits = mask.nonzero()
        return int(hits[0, 0]) if hits.numel() else None

    if (t := first((pos > INT32_MAX) | (pos < INT32_MIN))) is not None:
        _fail(
            _("{token}: position {position} does not fit in int32").format(
                token=name(t), position=int(pos[t])
            )
        )
    real = torch.ones_like(pos, dtype=torch.bool)
    if rows is not None:
        real = rows[request] >= 0
        pos = torch.where(real, pos, -1)  # a dummy token: no slot, checked no further
    if not layout.circular and (t := first(real & (pos < 0))) is not None:
        _fail(
            _(
                "{token}: position {position} is negative "
                "(only a circular cache pads negative positions)"
            ).format(token=name(t), position=int(pos[t]))
        )
    check_distinct_positions(request, pos, where)
    block, offset, has_slot = layout.locate(torch.where(real, pos, 0))
    has_slot = has_slot & real
    row_length = block_table.shape[1]
    if (t := first(has_slot & (block >= row_length))) is not None:
        _fail(
            _(
                "{token}: position {position} needs logical block {block}, "
                "outside the block-table row of {row_length} entries"
            ).format(
                token=name(t), position=int(pos[t]), block=int(block[t]), row_length=row_length
            )
        )
    table_row = request if rows is None else torch.where(real, rows[request], 0)
    physical = torch.zeros_like(block)
    read = has_slot.nonzero()[:, 0]  # only the entries the kernels read
    physical[read] = block_table[table_row[read], block[read]].to(torch.int64)
    if (t := first(has_slot & (physical < 0))) is not None:
        _fail(
            _(
                "{token}: block table entry [{row}, {block}] holds "
                "physical block {physical}, which is negative"
            ).format(
                token=name(t),
                row=int(table_row[t]),
                block=int(block[t]),
                physical=int(physical[t]),
            )
        )
    slots = physical * layout.block_size + offset
    wide = out is not None and out.dtype == torch.int64
    if not wide and (t := first(has_slot & (slots > INT32_MAX))) is not None:
        _fail(
            _(
                "{token}: slot {slot} (physical block {physical} * block_size "
                "{block_size} + {offset}) overflows int32 (an int64 out holds it)"
            ).format(
                token=name(t),
                slot=int(slots[t]),
                physical=int(physical[t]),
                block_size=layout.block_size,
                offset=int(offset[t]),
            )
        )
    if tile_size is not None:
        check_window(
            query_start_loc, request, block, has_slot, layout.block_size, tile_size, where
        )


def check_distinct_positions(request: Tensor, pos: Tensor, where: str = "") -> None:
    """No request holds one position twice: its two tokens would write one slot, and which
    one the cache keeps would depend on the order the programs run in. Checked on every CP
    rank alike (the position's owner is where they collide, and every rank must agree on
    the batch); in circular mode too. Negative positions (a circular cache's padded tail)
    have no slot and may repeat. Other requests may hold the same position (and share its
    physical block: prefix caching)."""
    tokens = (pos >= 0).nonzero()[:, 0]
    if tokens.numel() < 2:
        return
    # One sort of (request, position) pairs, packed into one int64: positions fit int32.
    keys = request[tokens].to(torch.int64) * 2**32 + pos[tokens].to(torch.int64)
    ordered, order = torch.sort(keys, stable=True)
    same = (ordered[1:] == ordered[:-1]).nonzero()
    if same.numel():
        i = int(same[0, 0])
        first, second = int(tokens[order[i]]), int(tokens[order[i + 1]])
        _fail(
            where
            + _(
                "request {request}, tokens {first} and {second}: both hold "
                "position {position}, so both would write one slot"
            ).format(
                request=int(request[first]), first=first, second=second, position=int(pos[first])
            )
        )


def check_window(
    query_start_loc: Tensor,
    request: Tensor,
    block: Tensor,
    has_slot: Tensor,
    block_size: int,
    tile_size: int,
    where: str = "",
) -> None:
    """The window precondition: in each tile, max(block) - min(block) < window size."""
    num_tokens = request.numel()
    if num_tokens == 0:
        return
    window = window_size(tile_size, block_size)
    starts = query_start_loc.to(torch.int64)
    lengths = starts[1:] - starts[:-1]
    # Number every tile of the batch: request q's tiles follow those of requests 0..q-1.
    tiles_per_request = (lengths + tile_size - 1) // tile_size
    tiles_before = torch.cumsum(tiles_per_request, 0) - tiles_per_request
    token = torch.arange(num_tokens, device=request.device)
    tile = tiles_before[request] + (token - starts[request]) // tile_size
    total = int(tiles_per_request.sum())
    low = torch.full((total,), INT32_MAX, dtype=torch.int64, device=request.device)
    high = torch.full((total,), -1, dtype=torch.int64, device=request.device)
    low.scatter_reduce_(0, tile, torch.where(has_slot, block, INT32_MAX), "amin")
    high.scatter_reduce_(0, tile, torch.where(has_slot, block, -1), "amax")
    bad = (high - low >= window) & (high >= 0)
    hits = bad.nonzero()
    if hits.numel():
        t_bad = int(hits[0, 0])
        in_tile = (tile == t_bad) & has_slot
        lo_token = int((in_tile & (block == low[t_bad])).nonzero()[0, 0])
        hi_token = int((in_tile & (block == high[t_bad])).nonzero()[0, 0])
        q = int(request[lo_token])
        _fail(
            where
            + _(
                "request {request}, tokens {first} and {second}: logical blocks "
                "{low} and {high} fall in one tile of {tile_size} tokens "
                "but the block-table window holds only {window} entries (window precondition: "
                "positions inside a tile must be near-contiguous; use the direct kernel)"
            ).format(
                request=q,
                first=lo_token,
                second=hi_token,
                low=int(low[t_bad]),
                high=int(high[t_bad]),
                tile_size=tile_size,
                window=window,
            ),
            WindowPreconditionError,
        )


def check_slot_mapping_inputs(
    layout: SlotLayout,
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    num_tokens: int,
    max_num_tokens: int,
    *,
    out: Tensor | None,
    full: bool,
    tile_size: int | None = None,
) -> None:
    """The checks of one group's slot mapping after ``resolve_counts``."""
    check_tensor("block_table", block_table, (torch.int32,), 2, positions.device)
    num_reqs = query_start_loc.numel() - 1
    if num_reqs > block_table.shape[0]:
        _fail(
            _("{num_reqs} requests but the block table has only {rows} rows").format(
                num_reqs=num_reqs, rows=block_table.shape[0]
            )
        )
    if block_table.shape[1] < 1:
        _fail(_("the block table has rows of 0 entries"))
    inputs = {"positions": positions, "query_start_loc": query_start_loc}
    check_out(out, (max_num_tokens,), positions.device, inputs | {"block_table": block_table})
    if full:
        check_tokens(
            layout,
            query_start_loc,
            positions,
            block_table,
            num_tokens,
            tile_size=tile_size,
            out=out,
        )


def resolve_group_counts(
    query_start_loc: Tensor,
    positions: Tensor,
    num_tokens: int | None,
    max_num_tokens: int | None,
    full: bool,
) -> tuple[int, int]:
    """``resolve_counts`` for the multi-group functions, whose ``num_tokens`` may be a padded
    count (vLLM's ``positions.shape[0]`` under CUDA graphs): checked to be at least the real
    count ``query_start_loc[num_reqs]`` rather than equal to it (docs/semantics.md §4)."""
    counts = resolve_counts(
        query_start_loc, positions, num_tokens, max_num_tokens, full and num_tokens is None
    )
    if full:
        check_padded_count(query_start_loc, counts[0])
    return counts


def check_padded_count(query_start_loc: Tensor, num_tokens: int) -> None:
    """query_start_loc is valid and ends at or before ``num_tokens`` (a padded count)."""
    check_query_start_loc(query_start_loc)
    actual = int(query_start_loc[-1])
    if num_tokens < actual:
        _fail(
            _(
                "num_tokens is {num_tokens} but query_start_loc ends at {last}: the batch's "
                "tokens do not fit"
            ).format(num_tokens=num_tokens, last=actual)
        )


def check_slot_mappings_inputs(
    layouts: Sequence[SlotLayout],
    query_start_loc: Tensor,
    positions: Tensor,
    block_tables: Sequence[Tensor | None],
    num_tokens: int,
    max_num_tokens: int,
    *,
    idx_mapping: Tensor | None,
    out: Tensor | None,
    full: bool,
    tile_size: int | None = None,
) -> None:
    """The checks of a multi-group slot mapping after ``resolve_group_counts``; ``layouts``
    from ``slotmap.layout.group_layouts``, one a block table.

    A disabled group's table is never read, so it is not checked (it may be None);
    ``idx_mapping[q] == -1`` marks a dummy request that reads no row, and anything below -1
    is rejected (docs/semantics.md §5).
    """
    num_reqs = query_start_loc.numel() - 1
    if len(block_tables) != len(layouts):
        _fail(
            _("{tables} block tables for {groups} groups").format(
                tables=len(block_tables), groups=len(layouts)
            )
        )
    read = [
        (g, layout, table)
        for g, (layout, table) in enumerate(zip(layouts, block_tables, strict=True))
        if layout.enabled
    ]
    for g, _layout, table in read:
        check_tensor(f"block_tables[{g}]", table, (torch.int32,), 2, positions.device)
        if table.shape[1] < 1:
            _fail(_("block_tables[{g}] has rows of 0 entries").format(g=g))
    min_rows = min((table.shape[0] for _g, _layout, table in read), default=None)
    rows = None
    if idx_mapping is not None:
        # vLLM <= 0.31 passes int32, vLLM >= 0.32 int64: both are a drop-in's input.
        check_tensor("idx_mapping", idx_mapping, IDX_MAPPING_DTYPES, 1, positions.device)
        if idx_mapping.numel() < num_reqs:
            _fail(
                _("idx_mapping has {entries} entries for {num_reqs} requests").format(
                    entries=idx_mapping.numel(), num_reqs=num_reqs
                )
            )
        if num_reqs and min_rows == 0:
            _fail(_("{num_reqs} requests but a block table has 0 rows").format(num_reqs=num_reqs))
        if full:
            rows = idx_mapping[:num_reqs].to(torch.int64)
            below = (rows < -1).nonzero()
            if below.numel():
                q = int(below[0, 0])
                _fail(
                    _(
                        "request {q}: idx_mapping[{q}] = {row} is below -1 (-1 marks a "
                        "dummy request; other rows are >= 0)"
                    ).format(q=q, row=int(rows[q]))
                )
            # Only enabled groups' tables are read, so only they bound the rows.
            if min_rows is not None and (bad := (rows >= min_rows).nonzero()).numel():
                q = int(bad[0, 0])
                _fail(
                    _(
                        "request {q}: idx_mapping[{q}] = {row} is not a row of every "
                        "block table (the smallest an enabled group reads has {rows} rows)"
                    ).format(q=q, row=int(rows[q]), rows=min_rows)
                )
    elif min_rows is not None and num_reqs > min_rows:
        _fail(
            _("{num_reqs} requests but a block table has only {rows} rows").format(
                num_reqs=num_reqs, rows=min_rows
            )
        )
    inputs = {
        "positions": positions,
        "query_start_loc": query_start_loc,
        "idx_mapping": idx_mapping,
    }
    inputs |= {f"block_tables[{g}]": table for g, _layout, table in read}
    check_out(out, (len(block_tables), max_num_tokens), positions.device, inputs)
    if full:
        actual = int(query_start_loc[-1])  # num_tokens may be a padded count
        for g, layout, table in read:
            check_tokens(
                layout,
                query_start_loc,
                positions,
                table,
                actual,
                tile_size=tile_size,
                rows=rows,
                group=g,
                out=out,
            )


def check_replay_inputs(
    slot_mappings: Tensor,
    query_start_loc: Tensor,
    positions: Tensor,
    replay_start: Tensor,
    window: int,
    prefix_cacheable: Sequence[bool],
    *,
    num_tokens: int | None,
    full: bool,
    pad_id: int = PAD_SLOT_ID,
) -> int:
    """Checks of replay padding; returns num_tokens."""
    check_pad_id(pad_id)
    window = as_int("window", window)
    num_tokens, _max = resolve_counts(query_start_loc, positions, num_tokens, None, full)
    check_tensor("slot_mappings", slot_mappings, OUT_DTYPES, 2, positions.device)
    check_tensor("replay_start", replay_start, (torch.int32,), 1, positions.device)
    num_reqs = query_start_loc.numel() - 1
    if replay_start.numel() < num_reqs:
        _fail(
            _("replay_start has {entries} entries for {num_reqs} requests").format(
                entries=replay_start.numel(), num_reqs=num_reqs
            )
        )
    if len(prefix_cacheable) != slot_mappings.shape[0]:
        _fail(
            _("{flags} prefix_cacheable flags for {rows} slot-mapping rows").format(
                flags=len(prefix_cacheable), rows=slot_mappings.shape[0]
            )
        )
    reads = {
        "query_start_loc": query_start_loc,
        "positions": positions,
        "replay_start": replay_start,
    }
    for name, tensor in reads.items():
        check_no_overlap("slot_mappings", slot_mappings, name, tensor)
    if slot_mappings.shape[1] < num_tokens:
        _fail(
            _("slot_mappings holds {held} tokens, fewer than {num_tokens}").format(
                held=slot_mappings.shape[1], num_tokens=num_tokens
            )
        )
    if window < 0:
        _fail(_("the replay window must be >= 0, got {window}").format(window=window))
    if full:
        starts = replay_start[:num_reqs].to(torch.int64)
        bad = (starts < 0).nonzero()
        if bad.numel():
            q = int(bad[0, 0])
            _fail(
                _("request {q}: replay_start {start} is negative").format(
                    q=q, start=int(starts[q])
                )
            )
        if (t := int(starts.max()) if num_reqs else 0) + window > INT32_MAX:
            _fail(
                _("replay_start {start} + window {window} does not fit in int32").format(
                    start=t, window=window
                )
            )
        pos = positions[:num_tokens]
        hits = ((pos > INT32_MAX) | (pos < INT32_MIN)).nonzero()
        if hits.numel():
            t = int(hits[0, 0])
            _fail(
                _("token {t}: position {position} does not fit in int32").format(
                    t=t, position=int(pos[t])
                )
            )
    return num_tokens
