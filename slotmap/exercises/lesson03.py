"""Lesson 03's exercises: the bounded-window gather.

* ``03.window_size``: BLOCK_TABLE_WINDOW_SIZE for a tile and a block size. A window that is
  too small is shown failing in the real production kernel.
* ``03.window_kernel``: the windowed gather inside a teaching kernel (the production kernel's
  plain case, with its argument names): min-reduction with the INT32_MAX sentinel, one
  contiguous window load, ``tl.gather``. The judge launches the learner's kernel itself.
* ``03.break_window``: an input that is valid in every way but the window precondition; the
  judge checks that the launcher rejects it and that the unvalidated kernel gets a slot wrong.
* ``03.float_gather``: gather int32 block numbers by relative index through float32 only
  (released triton-ascend's ``tl.gather`` takes floats), exact for every int32. Under the
  interpreter the judge sees each ``tl.gather``'s dtype; on a GPU it checks the values only.

The exercises use a tile of ``TILE = 8`` tokens (production: 1024) so that tiny batches already
have tiles that start in the middle of a block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor

from slotmap.backend import BACKEND, DEVICE
from slotmap.exercises.cases import (
    FLOAT32_EXACT,
    GUARD,
    INT32_MAX,
    INT32_MIN,
    POISON,
    SlotCase,
    checked_launch,
    explain_slot_mapping,
    float32_round,
    guarded_output,
    judge_slot_mapping,
    launch_learner_kernel,
    max_block_number_of,
    slot_cases,
    wrap_int32,
)
from slotmap.exercises.core import Exercise, Wrong, plural, register
from slotmap.i18n import N_, _, tr
from slotmap.kernels.slot_mapping import (
    _compute_slot_mapping_kernel,
    compute_slot_mapping,
    slot_mapping_args,
    window_kernel_constants,
)
from slotmap.layout import SlotLayout, cdiv, next_power_of_2, window_size
from slotmap.reference import slot_mapping_oracle
from slotmap.validate import WindowPreconditionError

TILE = 8  # tokens per tile in this lesson's exercises and figures


# ---------------------------------------------------------------------------------------------
# The production kernel with a window size of our choosing
# ---------------------------------------------------------------------------------------------
def launch_production_with_window(
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    block_size: int,
    *,
    window: int,
    tile_size: int = TILE,
    out: Tensor | None = None,
    window_trace: Tensor | None = None,
) -> Tensor:
    """The production kernel, unvalidated, with ``BLOCK_TABLE_WINDOW_SIZE = window`` instead of
    ``slotmap.window_size(tile_size, block_size)``: what a window without its +1 does.

    Grid ``(num_reqs + 1,)``, one program per request, as production launches it. Returns
    [num_tokens] int32 (or ``out``); ``window_trace`` as in ``slotmap.compute_slot_mapping``.
    """
    num_reqs = query_start_loc.numel() - 1
    num_tokens = int(query_start_loc[-1])
    if out is None:
        out = torch.empty(num_tokens, dtype=torch.int32, device=positions.device)
    # Production's constants for this batch, but the window we were given.
    constants = window_kernel_constants(SlotLayout.of(block_size), tile_size)
    constants["BLOCK_TABLE_WINDOW_SIZE"] = window
    args = slot_mapping_args(
        num_tokens, out.numel(), query_start_loc, positions, block_table, block_size, out
    )
    _compute_slot_mapping_kernel[(num_reqs + 1, 1)](
        *args,
        **constants,
        window_trace_ptr=window_trace,
        window_trace_width=0 if window_trace is None else window_trace.shape[1],
        TRACE_WINDOWS=window_trace is not None,
    )
    return out


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def blocks_touched(tile_size: int, block_size: int) -> int:
    """Most logical blocks a tile of ``tile_size`` contiguous positions can touch: when it
    starts on the last offset of a block."""
    return (block_size - 1 + tile_size - 1) // block_size + 1


# ---------------------------------------------------------------------------------------------
# 03.window_size
# ---------------------------------------------------------------------------------------------
def _window_size_cases() -> list[tuple[str, tuple[int, int]]]:
    return [
        (N_("tile 8, blocks of 4: a tile that starts mid-block touches 3 blocks"), (8, 4)),
        (N_("tile 16, blocks of 16"), (16, 16)),
        (N_("production: tile 1024, blocks of 128"), (1024, 128)),
        (N_("tile 8, blocks of 3"), (8, 3)),
        (N_("tile 16, blocks of 5"), (16, 5)),
        (N_("tile 8, blocks of 1"), (8, 1)),
        (N_("a block bigger than the tile: tile 8, blocks of 32"), (8, 32)),
    ]


def _window_size_strategy() -> st.SearchStrategy:
    tiles = st.sampled_from([2**k for k in range(11)])
    return st.tuples(tiles, st.integers(1, 300))


def _mid_block_failure(tile_size: int, block_size: int, window: int) -> str:
    """Run the production kernel with a too-small window on the worst tile; say what broke."""
    first = block_size - 1  # the tile starts on the last offset of block 0
    needed = blocks_touched(tile_size, block_size)
    row = [7 * b + 5 for b in range(needed)]  # distinct physical blocks
    positions = list(range(first, first + tile_size))
    qsl = torch.tensor([0, tile_size], dtype=torch.int32, device=DEVICE)
    pos = torch.tensor(positions, dtype=torch.int64, device=DEVICE)
    table = torch.tensor([row], dtype=torch.int32, device=DEVICE)
    got = launch_production_with_window(
        qsl, pos, table, block_size, window=window, tile_size=tile_size
    ).tolist()
    expected = slot_mapping_oracle(qsl, pos, table, block_size).tolist()
    for token, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g != e:
            return _(
                "; the production kernel launched with it gives position {positions} (logical "
                "block {value}) slot {g} instead of {e}"
            ).format(positions=positions[token], value=positions[token] // block_size, g=g, e=e)
    return ""


def judge_window_size(candidate: Callable[[int, int], int], case: tuple[int, int]) -> None:
    tile_size, block_size = case
    window = candidate(tile_size, block_size)
    if isinstance(window, Tensor) or not isinstance(window, int):
        try:
            window = int(window)
        except (TypeError, ValueError):
            raise Wrong(
                _(
                    "window_size({tile_size}, {block_size}) returned {window!r}, not an integer"
                ).format(tile_size=tile_size, block_size=block_size, window=window),
                hint=_("Return a Python int (triton.cdiv and triton.next_power_of_2 give ints)."),
            ) from None
    expected = window_size(tile_size, block_size)
    needed = blocks_touched(tile_size, block_size)
    if window < 1 or not _is_power_of_two(window):
        raise Wrong(
            _(
                "a window of {entrys} is not a power of two (tile {tile_size}, blocks of "
                "{block_size})"
            ).format(
                entrys=plural(window, N_("entry")), tile_size=tile_size, block_size=block_size
            ),
            expected,
            window,
            _("tl.arange needs a power-of-two length: round up with triton.next_power_of_2."),
        )
    if window < needed:
        raise Wrong(
            _(
                "a tile of {contiguous_positions} that starts at offset {value} of a block "
                "touches {logical_blocks}, but the window holds only {entrys}"
            ).format(
                contiguous_positions=plural(tile_size, N_("contiguous position")),
                value=block_size - 1,
                logical_blocks=plural(needed, N_("logical block")),
                entrys=plural(window, N_("entry")),
            )
            + _mid_block_failure(tile_size, block_size, window),
            expected,
            window,
            _(
                "A tile that starts on a block boundary touches {blocks} here; one that starts "
                "on the last offset of a block ({value}) touches the most. Count the blocks in "
                "that worst case."
            ).format(
                blocks=plural(cdiv(tile_size, block_size), N_("block")), value=block_size - 1
            ),
        )
    if window > expected:
        raise Wrong(
            _(
                "a window of {entrys} is larger than needed: every tile fits in {expected} (tile "
                "{tile_size}, blocks of {block_size})"
            ).format(
                entrys=plural(window, N_("entry")),
                expected=expected,
                tile_size=tile_size,
                block_size=block_size,
            ),
            expected,
            window,
            _(
                "Each tile loads the whole window: on Ascend it sits in the 192 KB Unified "
                "Buffer. Hold the blocks of the worst-placed tile, rounded up to a power of two, "
                "no more."
            ),
        )


register(
    Exercise(
        id="03.window_size",
        title=N_("BLOCK_TABLE_WINDOW_SIZE"),
        cases=_window_size_cases,
        strategy=_window_size_strategy,
        judge=judge_window_size,
        hint=N_(
            "A tile is tile_size contiguous positions. Where can its first position fall "
            "inside a block (on a boundary, or as late as the block's last offset)? Count "
            "the blocks the tile touches in the worst case; the window is a tl.arange, so "
            "its length is a power of two."
        ),
        max_examples=60,
    )
)


# ---------------------------------------------------------------------------------------------
# 03.window_kernel
# ---------------------------------------------------------------------------------------------
def _window_kernel_cases() -> list[tuple[str, SlotCase]]:
    return [
        (
            N_("one request, one tile starting on a block boundary"),
            SlotCase([0, 8], list(range(8)), [[5, 2]], 4),
        ),
        (
            N_("a tile that starts mid-block (3 blocks for 8 tokens: the +1)"),
            SlotCase([0, 8], list(range(2, 10)), [[5, 2, 9]], 4),
        ),
        (
            N_("masked lanes: a last tile of 3 tokens, far from block 0"),
            SlotCase([0, 11], list(range(20, 31)), [[30 + b for b in range(16)]], 2),
        ),
        (
            N_("two requests and a padding tail"),
            SlotCase(
                [0, 5, 13],
                [3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16],
                [[4, 8, 0, 0, 0], [6, 1, 3, 11, 2]],
                4,
                16,
            ),
        ),
        (
            N_("decode steps: one token per request, deep into its row"),
            SlotCase([0, 1, 2, 3], [13, 0, 7], [[9, 8, 7, 6], [2, 0, 0, 0], [1, 3, 0, 0]], 4),
        ),
        # An engine's block table holds any block whose slots fit int32: a window that goes
        # through float32 rounds the ones above 2^24.
        (
            N_("block numbers above 2^24: blocks of 4 numbered up to 2^29 - 1"),
            SlotCase(
                [0, 8], list(range(2, 10)), [[max_block_number_of(4), 16777217, 33554435]], 4
            ),
        ),
        (
            N_("block numbers above 2^24: blocks of 1 numbered up to 2^31 - 1"),
            SlotCase(
                [0, 3, 5],
                [0, 1, 2, 3, 4],
                [[INT32_MAX, 16777217, 2147483646, 0, 0], [16777219, 5, 7, 9, 268435459]],
                1,
            ),
        ),
        # The window starts at the smallest logical block of the tile's valid lanes, which
        # need not be the first lane's.
        (
            N_("positions out of order inside a tile: the first lane is not the smallest"),
            SlotCase(
                [0, 3, 11], [9, 10, 11, 6, 7, 4, 5, 0, 1, 2, 3], [[1, 7, 4, 0], [5, 2, 9, 0]], 4
            ),
        ),
    ]


def _window_kernel_strategy() -> st.SearchStrategy:
    return slot_cases(max_length=20, large_blocks=True)


def _gather_error(error: Exception) -> Wrong | None:
    """The interpreter raises on a gather outside the window (a GPU reads garbage instead)."""
    text = str(error)
    if "out of bounds" in text:
        return Wrong(
            _(
                "a lane gathered outside the window: its relative block index was negative or >= "
                "BLOCK_TABLE_WINDOW_SIZE ({value})"
            ).format(value=text.strip()[:160]),
            hint=_(
                "The window starts at the smallest logical block among the VALID lanes (masked "
                "lanes offer INT32_MAX to tl.min); masked lanes gather index 0."
            ),
        )
    return None


def window_entry_mistake(case: SlotCase, expected: list[int], got: list[int]) -> Wrong | None:
    """The first wrong slot whose physical block is another entry of its request's row, in a
    window's words: the tile's window was loaded from the wrong block, or the lane gathered
    the wrong index of it (a plain case, tiles of TILE tokens); None for any other mistake."""
    size = case.block_size
    for token in range(case.num_tokens):
        if got[token] == expected[token]:
            continue
        q, p = case.request_of(token), case.positions[token]
        row, (block, offset) = case.block_table[q], divmod(p, size)
        got_block, got_offset = divmod(got[token], size)
        if got_offset != offset or got_block not in row:
            return None
        entry = row.index(got_block)
        start, end = case.query_start_loc[q], case.query_start_loc[q + 1]
        first = start + (token - start) // TILE * TILE
        base = min(case.positions[t] // size for t in range(first, min(first + TILE, end)))
        lead = case.positions[first] // size
        where = _(
            "token {token} (request {q}, position {p}) should be in slot {expected}, got "
            "{got}: its physical block {got_block} is block_table[{q}][{entry}]"
        ).format(
            token=token,
            q=q,
            p=p,
            expected=expected[token],
            got=got[token],
            got_block=got_block,
            entry=entry,
        )
        hint = _(
            "The window starts at the smallest logical block among the tile's VALID lanes: "
            "tl.min(tl.where(mask, block_indices, INT32_MAX), axis=0)."
        )
        if entry == 0 < base and first + TILE > end:
            return Wrong(
                _(
                    "{where}, as if the window started at logical block 0: the tile's last "
                    "{lanes} "
                    "lie past the request's end and load position 0 (other=0); they must not "
                    "lower "
                    "the window's base (block {base}, the smallest of the VALID lanes): a masked "
                    "lane offers INT32_MAX to tl.min"
                ).format(where=where, lanes=plural(first + TILE - end, N_("lane")), base=base),
                _("slot {expected}").format(expected=expected[token]),
                _("slot {got}").format(got=got[token]),
                hint,
            )
        if entry == lead != base:
            return Wrong(
                _(
                    "{where}, the entry of the tile's first lane's logical block {lead}: the "
                    "window "
                    "starts at the first lane's block, but the tile's positions are out of order "
                    "and "
                    "its smallest logical block is {base}"
                ).format(where=where, lead=lead, base=base),
                _("slot {expected}").format(expected=expected[token]),
                _("slot {got}").format(got=got[token]),
                hint,
            )
        return Wrong(
            _(
                "token {token} (request {q}, position {p}) should be in slot {expected}, got "
                "{got}: its physical block {got_block} is block_table[{q}][{entry}], the entry "
                "of logical block {entry}, not of its own logical block {block}. Its tile's "
                "window starts at logical block {base} (the smallest of the tile's valid lanes), "
                "so the lane must gather window[{block} - {base}] = window[{value}]; it got the "
                "block at window index {value2} of that window: the window's base (where it is "
                "loaded) or the lane's relative index is wrong"
            ).format(
                token=token,
                q=q,
                p=p,
                expected=expected[token],
                got=got[token],
                got_block=got_block,
                entry=entry,
                block=block,
                base=base,
                value=block - base,
                value2=entry - base,
            ),
            _("slot {expected}").format(expected=expected[token]),
            _("slot {got}").format(got=got[token]),
            _(
                "Ask two questions of your kernel: which logical block does the window's first "
                "entry hold (lesson 03's min-reduction says), and how far from that entry is "
                "each lane's own block?"
            ),
        )
    return None


def judge_window_kernel(kernel, case: SlotCase) -> None:
    if not hasattr(kernel, "__getitem__"):
        raise Wrong(
            _("expected a @triton.jit kernel, got {name}").format(name=type(kernel).__name__),
            hint=_("Pass the kernel itself: check('03.window_kernel', window_kernel)."),
        )
    window = window_size(TILE, case.block_size)
    launcher = partial(
        launch_learner_kernel, kernel, tile_size=TILE, BLOCK_TABLE_WINDOW_SIZE=window
    )
    try:
        judge_slot_mapping(launcher, case)
    except Wrong as wrong:
        if wrong.kind == "slot":  # a wrong slot: the window's?
            qsl, positions, table = case.tensors()
            counts = {"num_tokens": case.num_tokens, "max_num_tokens": case.padded_length}
            expected = slot_mapping_oracle(qsl, positions, table, case.block_size, **counts)
            _buffer, out = guarded_output(case.padded_length, positions.device)
            launcher(qsl, positions, table, case.block_size, **counts, out=out)
            named = window_entry_mistake(case, expected.tolist(), out.tolist())
            if named is not None:
                raise named from None
        raise
    except Exception as error:
        wrong = _gather_error(error)
        if wrong is None:
            raise
        raise wrong from None


register(
    Exercise(
        id="03.window_kernel",
        title=N_("the windowed gather in a kernel"),
        cases=_window_kernel_cases,
        strategy=_window_kernel_strategy,
        judge=judge_window_kernel,
        hint=N_(
            "The window starts at the smallest logical block among the tile's valid lanes (a "
            "masked lane must not lower that minimum); load BLOCK_TABLE_WINDOW_SIZE entries "
            "from there, and gather each lane's entry by its index relative to that start."
        ),
        max_examples=30,
    )
)


# ---------------------------------------------------------------------------------------------
# 03.break_window
# ---------------------------------------------------------------------------------------------


def _break_case_name() -> str:
    return _("your input, with tiles of {tokens}").format(tokens=plural(TILE, N_("token")))


def _as_case(candidate: Any) -> SlotCase:
    case = candidate() if callable(candidate) else candidate
    if not isinstance(case, SlotCase):
        raise Wrong(
            _("expected a SlotCase (or a function returning one), got {name}").format(
                name=type(case).__name__
            ),
            hint=_("SlotCase(query_start_loc, positions, block_table, block_size)"),
        )
    if case.options:
        raise Wrong(
            _("this exercise is about the plain case: leave options empty, got {options}").format(
                options=case.options
            ),
            hint=_("No circular cache, no context parallelism: just positions and a block table."),
        )
    return case


def judge_break_window(candidate: Any, _label: Any = None) -> None:
    case = _as_case(candidate)
    qsl, positions, table = case.tensors("cpu")
    counts = {"num_tokens": case.num_tokens, "max_num_tokens": case.padded_length}
    try:
        expected = slot_mapping_oracle(qsl, positions, table, case.block_size, **counts)
    except ValueError as error:
        raise Wrong(
            _("your input is invalid for another reason than the window: {error}").format(
                error=error
            ),
            hint=_(
                "Only the window precondition may break: every position needs a block in its "
                "row, and query_start_loc must match the positions."
            ),
        ) from None
    device_args = case.tensors()
    try:
        compute_slot_mapping(*device_args, case.block_size, tile_size=TILE, **counts)
    except ValueError as error:
        if not isinstance(error, WindowPreconditionError):
            raise Wrong(
                _("the launcher rejected your input, but not for the window: {message}").format(
                    message=error
                ),
                hint=_("Only the window precondition may break."),
            ) from None
    else:
        raise Wrong(
            _(
                "the launcher accepted your input: in every tile of {tokens} the logical blocks "
                "fit in the window"
            ).format(tokens=plural(TILE, N_("token"))),
            _("ValueError (window precondition)"),
            _("no error"),
            _(
                "Put two positions whose logical blocks are at least BLOCK_TABLE_WINDOW_SIZE "
                "apart into one tile, e.g. positions far apart in one request."
            ),
        )
    buffer, out = guarded_output(case.padded_length, device_args[1].device)
    compute_slot_mapping(
        *device_args, case.block_size, tile_size=TILE, validate=False, out=out, **counts
    )
    wrong = explain_slot_mapping(case, expected.tolist(), buffer.tolist())
    if wrong is None:
        raise Wrong(
            _(
                "the launcher rejects your input, but the unvalidated kernel still gets every "
                "slot right (the out-of-window lanes happen to find the same physical block)"
            ),
            hint=_("Use distinct physical blocks in the block-table row."),
        )


register(
    Exercise(
        id="03.break_window",
        title=N_("an input that breaks the window precondition"),
        cases=lambda: [(_break_case_name(), _("the SlotCase you built"))],
        strategy=None,
        judge=judge_break_window,
        # A message is a literal: its 8 is TILE (a test keeps them equal).
        hint=N_(
            "Tiles hold 8 tokens: make one tile need two logical blocks at least "
            "BLOCK_TABLE_WINDOW_SIZE apart."
        ),
    )
)


# ---------------------------------------------------------------------------------------------
# 03.float_gather
# ---------------------------------------------------------------------------------------------
LANES = TILE  # lanes of the float-gather kernel


@dataclass(frozen=True)
class GatherCase:
    """A window of int32 entries (a block-table row's stretch) and each lane's index into it;
    lanes past ``len(relative)``, up to ``LANES``, are masked."""

    window: list[int]
    relative: list[int]

    def __str__(self) -> str:
        lanes = plural(len(self.relative), N_("lane"))
        return _("window={window}, relative={relative} ({lanes} of {total})").format(
            window=self.window, relative=self.relative, lanes=lanes, total=LANES
        )


def _inexact_half(entry: int, got: int) -> str:
    """Which half of ``entry`` float32 rounded, if ``got`` is ``entry`` split at some bit with
    one half rounded through float32; else ''."""
    for bit in range(1, 32):
        high, low = entry >> bit, entry & ((1 << bit) - 1)
        for name, half, high_back, low_back in (
            (N_("low"), low, high << bit, float32_round(low)),
            (N_("high"), high, float32_round(high) << bit, low),
        ):
            # Put back with + or with |: a rounded half can carry into the other's bits.
            put_back = {wrap_int32(high_back + low_back), wrap_int32(high_back | low_back)}
            if abs(half) > FLOAT32_EXACT and got in put_back:
                return _(
                    ": split at bit {bit}, its {name} half is {half}, above 2**24, and a float32 "
                    "holds integers exactly only up to 2**24"
                ).format(bit=bit, name=tr(name), half=half)
    return ""


def _halves_mistake(entry: int, got: int) -> str:
    """Which exact halves of a non-negative ``entry`` were put back wrong to give ``got``:
    overlapping halves added, or the high half put back at another bit than the split; else
    ''. The usual split bits are tried first (a value can fit several)."""
    if entry < 0:
        return ""
    usual = [16, 8, 24, 12, 20]
    for bit in usual + [b for b in range(1, 32) if b not in usual]:
        high, low = entry >> bit, entry & ((1 << bit) - 1)
        for kept in range(bit + 1, 32):
            if got == wrap_int32((high << bit) + (entry & ((1 << kept) - 1))):
                return _(
                    ": the high half starts at bit {bit} but the low half keeps {kept} bits, so "
                    "bits "
                    "{bit}..{value} are in both halves and + counts them twice"
                ).format(bit=bit, kept=kept, value=kept - 1)
        for back in range(1, 32):
            put_back = {wrap_int32((high << back) | low), wrap_int32((high << back) + low)}
            if back != bit and got in put_back:
                return _(
                    ": split at bit {bit} (high half {high}, low half {low}) but the high half "
                    "was "
                    "put back at bit {back}"
                ).format(bit=bit, high=high, low=low, back=back)
    return ""


def _float_gather_cases() -> list[tuple[str, GatherCase]]:
    return [
        (N_("small block numbers, one entry a lane"), GatherCase([5, 2, 9, 7], [0, 1, 2, 3])),
        (
            N_("2**24 + 1 = 16777217, the first integer a float32 cannot hold"),
            GatherCase([16777217, 16777216, 16777219, 5], [0, 1, 2, 3, 0]),
        ),
        (
            N_("the largest int32, 2**31 - 1, and entries on either side of 2**16"),
            GatherCase([2147483647, 65535, 65536, 131071], [0, 1, 2, 3]),
        ),
        (
            N_("a window of 3 entries in a load of 4, lanes that share an entry, 3 lanes masked"),
            GatherCase([33554433, 7, 16777217], [2, 2, 0, 1, 0]),
        ),
        (
            N_("negative entries: -1, -2**31 and -(2**24 + 1) (the sign sits in the high bits)"),
            GatherCase([-1, -2147483648, -16777217, 3], [3, 2, 1, 0]),
        ),
        (N_("one entry, one lane"), GatherCase([16777217], [0])),
    ]


_INTERESTING = [
    0,
    1,
    65535,
    65536,
    2**24 - 1,
    2**24,
    2**24 + 1,
    2**24 + 3,
    2**28 + 5,
    INT32_MAX,
    -1,
    INT32_MIN,
    -(2**24) - 1,
]


@st.composite
def _gather_case(draw: st.DrawFn) -> GatherCase:
    entry = st.one_of(st.integers(INT32_MIN, INT32_MAX), st.sampled_from(_INTERESTING))
    window = draw(st.lists(entry, min_size=1, max_size=16))
    index = st.integers(0, len(window) - 1)
    return GatherCase(window, draw(st.lists(index, min_size=1, max_size=LANES)))


def _float_gather_strategy() -> st.SearchStrategy:
    return _gather_case()


@contextmanager
def _watched_gathers() -> Iterator[list[Any] | None]:
    """The element type of each ``tl.gather``'s source while a kernel runs (None off the
    interpreter, where a compiled kernel cannot be watched)."""
    if not BACKEND.interpreted:
        yield None
        return
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    original = builder.create_gather
    seen: list[Any] = []

    def gather(src: Any, indices: Any, axis: int) -> Any:
        seen.append(src.dtype.scalar)
        return original(src, indices, axis)

    builder.create_gather = gather
    try:
        yield seen
    finally:
        del builder.create_gather


def _check_gather_types(seen: list[Any] | None) -> None:
    if seen is None:
        return
    if not seen:
        raise Wrong(
            _(
                "your kernel called no tl.gather: each lane must pick its entry from the loaded "
                "window on chip"
            ),
            _("float32 tl.gather calls"),
            _("none"),
            _("Load the window once, then gather from it by relative index (lesson 03)."),
        )
    for dtype in seen:
        if str(dtype) != "fp32":
            raise Wrong(
                _(
                    "tl.gather took a window of {dtype}: released triton-ascend's tl.gather takes "
                    "only floats, and this exercise gathers float32 only"
                ).format(dtype=dtype),
                _("fp32"),
                str(dtype),
                _(
                    "Gather values converted with .to(tl.float32), each small enough to stay "
                    "exact "
                    "in float32, and turn them back into int32 after the gather."
                ),
            )


def _explain_gather(case: GatherCase, buffer: list[int]) -> None:
    lanes = len(case.relative)
    outside = [i for i, v in enumerate(buffer) if not GUARD <= i < GUARD + lanes and v != POISON]
    if outside:
        where = outside[0] - GUARD
        raise Wrong(
            _("your kernel wrote out[{where}], outside the {valid_lanes}").format(
                where=where, valid_lanes=plural(lanes, N_("valid lane"))
            ),
            POISON,
            buffer[outside[0]],
            _("Store only the lanes of lane_mask."),
        )
    got = buffer[GUARD : GUARD + lanes]
    for lane, (index, value) in enumerate(zip(case.relative, got, strict=True)):
        entry = case.window[index]
        if value == entry:
            continue
        rounded = float32_round(entry)
        # Out of int32's range, the cast back wraps (the interpreter) or saturates (a GPU).
        if value in (wrap_int32(rounded), max(INT32_MIN, min(INT32_MAX, rounded))):
            reason = _(": a float32 holds integers exactly only up to 2**24")
            hint = _("Gather halves that are each exact in float32, and put them back together.")
        else:
            reason = _inexact_half(entry, value) or _halves_mistake(entry, value)
            hint = _("Split at one bit and put the halves back at that same bit; both halves ")
            hint += _("must stay within 2**24 in size.")
        if not reason and entry < 0:
            reason = _(": a negative entry, whose sign sits in its high bits")
            hint = _(
                "On an int32, >> keeps the sign (an arithmetic shift) and & 0xFFFF keeps the low "
                "16 bits without it; // and % round toward zero instead."
            )
        raise Wrong(
            _(
                "entry {entry} came back as {value}{reason} (lane {lane} gathers window[{index}])"
            ).format(entry=entry, value=value, reason=reason, lane=lane, index=index),
            entry,
            value,
            hint,
        )


def judge_float_gather(kernel: Any, case: GatherCase) -> None:
    if not hasattr(kernel, "__getitem__"):
        raise Wrong(
            _("expected a @triton.jit kernel, got {name}").format(name=type(kernel).__name__),
            hint=_("Pass the kernel itself: check('03.float_gather', float_gather_kernel)."),
        )
    length, lanes = len(case.window), len(case.relative)
    # The window sits in front of poison that no tensor argument covers: an unmasked window
    # load reads it, and checked_launch names that read.
    source = torch.full((length + GUARD,), POISON, dtype=torch.int32, device=DEVICE)
    source[:length] = torch.tensor(case.window, dtype=torch.int32)
    relative = torch.tensor(case.relative, dtype=torch.int32, device=DEVICE)
    buffer = torch.full((GUARD + lanes + GUARD,), POISON, dtype=torch.int32, device=DEVICE)
    window = next_power_of_2(length)
    try:
        with _watched_gathers() as seen:
            checked_launch(
                kernel,
                (1,),
                source[:length],
                length,
                relative,
                lanes,
                buffer[GUARD : GUARD + lanes],
                WINDOW=window,
                LANES=LANES,
            )
    except Wrong:
        raise
    except Exception as error:
        if "out of bounds" not in str(error):
            raise
        raise Wrong(
            _("a lane gathered outside the window of {entrys}").format(
                entrys=plural(window, N_("entry"))
            ),
            hint=_("Gather with each lane's relative index, as loaded: masked lanes hold 0."),
        ) from None
    _check_gather_types(seen)
    _explain_gather(case, buffer.tolist())


register(
    Exercise(
        id="03.float_gather",
        title=N_("an exact int32 gather through float32"),
        cases=_float_gather_cases,
        strategy=_float_gather_strategy,
        judge=judge_float_gather,
        hint=N_("Each value you gather as float32 must be an integer of at most 2**24 in size."),
        max_examples=30,
    )
)
