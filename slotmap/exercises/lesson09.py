"""The capstone's exercises: the fused multi-group slot-mapping kernel, written by the learner.

* ``09.group_window``: ``group_window_size(tile_size, block_sizes, circular)``, the one
  BLOCK_TABLE_WINDOW_SIZE that a launch for every group needs: it must fit the smallest
  block size among the groups that are not circular (a ring reads entry 0 of its row only).
* ``09.fused_groups``: the kernel, on grid ``(num_groups, num_reqs + 1)``: program
  ``(g, q)`` maps request ``q``'s tokens with group ``g``'s block table, block size and
  circular flag into row ``g`` of the output; program ``(g, num_reqs)`` writes row ``g``'s
  padding tail. The judge launches it (``launch_fused_kernel``, every load bounds-checked
  under the interpreter by ``cases.checked_launch``) into poisoned rows with poisoned gaps
  between them and poisoned guards around them, and compares every element exactly with
  ``slotmap.slot_mappings_oracle``.
* ``09.fused_groups_time``: on an NVIDIA GPU, the same kernel timed in a CUDA graph and
  compared with lesson 08's model, ``max(floor, bytes / bandwidth)``, the floor and the
  bandwidth measured on the same card in the same call. Elsewhere it says in one line that
  it needs a GPU (after one correctness run, so that an unfinished kernel still fails).

The judges name the classic mistakes: the padding program forgotten, one group's block size
used for every group, the window without its +1, a circular group's negative positions not
guarded, every group writing row 0, rows assumed ``max_num_tokens`` apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from slotmap.backend import BACKEND, DEVICE
from slotmap.exercises.cases import (
    GUARD,
    POISON,
    SlotCase,
    checked_launch,
    explain_slot_mapping,
    max_block_number_of,
)
from slotmap.exercises.core import Exercise, Skipped, Wrong, register
from slotmap.exercises.lesson03 import _gather_error, _is_power_of_two, _mid_block_failure
from slotmap.i18n import N_, _
from slotmap.layout import PAD_SLOT_ID, cdiv, next_power_of_2, window_size
from slotmap.reference import slot_mappings_oracle

TILE = 8  # tokens per tile in the capstone's checks, as in lesson 03's
ROW_GAP = 3  # poisoned entries after each output row: the rows are not max_num_tokens apart


# ---------------------------------------------------------------------------------------------
# 09.group_window
# ---------------------------------------------------------------------------------------------
def group_window(tile_size: int, block_sizes: Sequence[int], circular: Sequence[bool]) -> int:
    """BLOCK_TABLE_WINDOW_SIZE for one launch over every group: lesson 03's window for the
    smallest block size of a group that is not circular; 1 when every group is circular
    (each lane of a ring reads entry 0 of its row)."""
    linear = [size for size, ring in zip(block_sizes, circular, strict=True) if not ring]
    return window_size(tile_size, min(linear)) if linear else 1


WINDOW_HINT = N_(
    "The window must hold every block a tile of any group can touch: the group with "
    "the smallest blocks among those that are not circular sets the worst case, as "
    "in exercise 03.window_size; a circular group reads entry 0 only (1 when all are "
    "circular)."
)


@dataclass(frozen=True)
class WindowCase:
    tile_size: int
    block_sizes: tuple[int, ...]
    circular: tuple[bool, ...]

    def __str__(self) -> str:
        return (
            f"tile_size={self.tile_size}, block_sizes={list(self.block_sizes)}, "
            f"circular={list(self.circular)}"
        )


def _window_cases() -> list[tuple[str, WindowCase]]:
    return [
        (N_("full attention (blocks of 4) and a ring of 8"), WindowCase(8, (4, 8), (False, True))),
        (N_("two paged groups, blocks of 8 and 2"), WindowCase(8, (8, 2), (False, False))),
        (N_("tile 1024, blocks of 128 and 16"), WindowCase(1024, (128, 16), (False, False))),
        (N_("a ring of 2 beside blocks of 8"), WindowCase(8, (2, 8), (True, False))),
        (N_("sliding windows only: two rings"), WindowCase(8, (4, 8), (True, True))),
        (N_("blocks of 5 and 3, tile 16"), WindowCase(16, (5, 3), (False, False))),
    ]


@st.composite
def _window_strategy(draw: st.DrawFn) -> WindowCase:
    tile = draw(st.sampled_from([2**k for k in range(11)]))
    groups = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 300), min_size=groups, max_size=groups))
    rings = draw(st.lists(st.booleans(), min_size=groups, max_size=groups))
    return WindowCase(tile, tuple(sizes), tuple(rings))


def _window_mistakes(case: WindowCase) -> list[tuple[int, str]]:
    """(window, what it means) for the known-wrong answers, most specific first."""
    tile, sizes, rings = case.tile_size, case.block_sizes, case.circular
    linear = [s for s, r in zip(sizes, rings, strict=True) if not r]
    if not linear:
        return [
            (
                window_size(tile, min(sizes)),
                _(
                    "a ring reads entry 0 of its row only: when "
                    "every group is circular, the window needs 1 entry"
                ),
            )
        ]
    smallest = min(linear)
    found = [
        (
            next_power_of_2(cdiv(tile, smallest)),
            _(
                "the window has no +1: cdiv({tile}, {smallest}) blocks cover a tile that starts "
                "on a block boundary, and a tile that starts mid-block touches one more"
            ).format(tile=tile, smallest=smallest),
        ),
        (
            window_size(tile, min(sizes)),
            _(
                "a circular group's block size was counted: a ring reads entry 0 of its row "
                "only, so only the groups that are not circular size the window"
            ),
        ),
        (
            window_size(tile, max(linear)),
            _(
                "the window fits the LARGEST block size ({largest}): the group with blocks "
                "of {smallest} has a tile touch more blocks"
            ).format(largest=max(linear), smallest=smallest),
        ),
    ]
    if not rings[0]:
        found.append(
            (
                window_size(tile, sizes[0]),
                _(
                    "the window fits group 0's block size ({size}) only: one launch serves "
                    "every group, and the group with blocks of {smallest} needs more entries"
                ).format(size=sizes[0], smallest=smallest),
            )
        )
    return found


def judge_group_window(candidate: Callable[..., int], case: WindowCase) -> None:
    """Raise ``Wrong`` unless ``candidate`` gives ``group_window``'s window for ``case``."""
    call = f"group_window_size({case.tile_size}, {list(case.block_sizes)}, {list(case.circular)})"
    got = candidate(case.tile_size, list(case.block_sizes), list(case.circular))
    if hasattr(got, "item"):
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, int):
        raise Wrong(
            _("{call} returned {got!r}, not an int").format(call=call, got=got),
            _("an int"),
            repr(got),
            WINDOW_HINT,
        )
    expected = group_window(case.tile_size, case.block_sizes, case.circular)
    if got == expected:
        return
    why = next((w for value, w in _window_mistakes(case) if value == got != expected), "")
    if not why and not _is_power_of_two(got):
        why = _("it is not a power of two (tl.arange needs one: round up with next_power_of_2)")
    linear = [s for s, r in zip(case.block_sizes, case.circular, strict=True) if not r]
    shown = ""
    if linear and got < expected and _is_power_of_two(got):
        # What the production kernel does with it, on the smallest block size's worst tile.
        shown = _mid_block_failure(case.tile_size, min(linear), got)
    raise Wrong(
        _("{call} should be {expected}, got {got}").format(call=call, expected=expected, got=got)
        + (f": {why}" if why else "")
        + shown,
        expected,
        got,
        WINDOW_HINT,
    )


register(
    Exercise(
        id="09.group_window",
        title=N_("one window for every group"),
        cases=_window_cases,
        strategy=_window_strategy,
        judge=judge_group_window,
        hint=WINDOW_HINT,
        max_examples=60,
    )
)


# ---------------------------------------------------------------------------------------------
# 09.fused_groups: the batches
# ---------------------------------------------------------------------------------------------
@dataclass
class GroupsCase:
    """One batch and its KV-cache groups: request q owns tokens
    [query_start_loc[q], query_start_loc[q + 1]); group g has its own block table (one row
    per request), block size and circular flag."""

    query_start_loc: list[int]
    positions: list[int]
    block_tables: list[list[list[int]]]  # per group, one row per request
    block_sizes: list[int]
    circular: list[bool]
    max_num_tokens: int | None = None  # None: no padding tail
    window: int | None = None  # BLOCK_TABLE_WINDOW_SIZE if not group_window's (any that fits)

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1]

    @property
    def num_reqs(self) -> int:
        return len(self.query_start_loc) - 1

    @property
    def num_groups(self) -> int:
        return len(self.block_sizes)

    @property
    def padded_length(self) -> int:
        return self.max_num_tokens if self.max_num_tokens is not None else self.num_tokens

    @property
    def width(self) -> int:
        return max([len(row) for table in self.block_tables for row in table] + [1])

    def stacked(self) -> list[list[list[int]]]:
        """The tables as one [num_groups, num_reqs, width] list, rows padded with 0."""
        return [[row + [0] * (self.width - len(row)) for row in t] for t in self.block_tables]

    def request_of(self, token: int) -> int:
        return next(q for q in range(self.num_reqs) if token < self.query_start_loc[q + 1])

    def group(self, g: int) -> SlotCase:
        """Group g alone, as a single-group case (for the invariant in words)."""
        options = {"circular": True} if self.circular[g] else {}
        return SlotCase(
            self.query_start_loc,
            self.positions,
            self.stacked()[g],
            self.block_sizes[g],
            self.max_num_tokens,
            options,
        )

    def expected(self) -> list[list[int]]:
        tables = [torch.tensor(t, dtype=torch.int32) for t in self.stacked()]
        return slot_mappings_oracle(
            torch.tensor(self.query_start_loc, dtype=torch.int32),
            torch.tensor(self.positions, dtype=torch.int64),
            tables,
            self.block_sizes,
            circular=self.circular,
            max_num_tokens=self.padded_length,
        ).tolist()

    def __str__(self) -> str:
        parts = [
            f"query_start_loc={self.query_start_loc}",
            f"positions={self.positions}",
            f"block_sizes={self.block_sizes}",
            f"circular={self.circular}",
            f"block_tables={self.block_tables}",
        ]
        if self.max_num_tokens is not None and self.max_num_tokens != self.num_tokens:
            parts.append(f"max_num_tokens={self.max_num_tokens}")
        if self.window is not None:
            parts.append(f"BLOCK_TABLE_WINDOW_SIZE={self.window}")
        return ", ".join(parts)


def _groups_case(
    lengths: list[int],
    firsts: list[int],
    block_sizes: list[int],
    circular: list[bool],
    padding: int = 0,
) -> GroupsCase:
    """Requests of consecutive positions from ``firsts``; readable block numbers: group g's
    blocks are 10 * (g + 1) + k, distinct within the group."""
    starts, positions = [0], []
    for first, n in zip(firsts, lengths, strict=True):
        positions += list(range(first, first + n))
        starts.append(starts[-1] + n)
    tables = []
    for g, (size, ring) in enumerate(zip(block_sizes, circular, strict=True)):
        rows, used = [], 0
        for first, n in zip(firsts, lengths, strict=True):
            count = 1 if ring else max((first + n - 1) // size + 1, 1)
            rows.append([10 * (g + 1) + used + k for k in range(count)])
            used += count
        tables.append(rows)
    max_num_tokens = starts[-1] + padding if padding else None
    return GroupsCase(starts, positions, tables, list(block_sizes), list(circular), max_num_tokens)


def _large_blocks(case: GroupsCase, bases: Sequence[int]) -> GroupsCase:
    """``case`` with group g's block numbers moved up by ``bases[g]`` (a base past 2^24: block
    numbers a float32 cannot hold), or down from the group's largest block when the base is
    -1 (slots up to INT32_MAX)."""
    for g, (table, base) in enumerate(zip(case.block_tables, bases, strict=True)):
        top = max_block_number_of(case.block_sizes[g])
        for row in table:
            row[:] = [top - b if base == -1 else base + b for b in row]
    return case


def _with_window(case: GroupsCase, window: int) -> GroupsCase:
    case.window = window
    return case


def _fused_cases() -> list[tuple[str, GroupsCase]]:
    return [
        (
            N_(
                "two groups: full attention (blocks of 4) and a sliding window (a ring of 8), "
                "and a padding tail"
            ),
            _groups_case([6, 3, 1], [0, 9, 21], [4, 8], [False, True], padding=2),
        ),
        (
            N_("group 1's blocks hold 2 tokens, group 0's 4"),
            _groups_case([12, 2], [3, 7], [4, 2], [False, False]),
        ),
        (
            N_("empty requests (no tokens) between the others"),
            _groups_case([0, 4, 0, 3], [0, 2, 5, 10], [2, 4], [False, True], padding=1),
        ),
        (
            N_("a padding tail longer than a tile of 8"),
            _groups_case([2, 1], [5, 0], [4, 3], [False, False], padding=13),
        ),
        (
            N_("sliding windows only, positions before 0 (no slot) and a request with none after"),
            _groups_case([7, 2], [-3, -2], [4, 8], [True, True], padding=2),
        ),
        (
            N_("three groups, decode steps deep into their rows"),
            _groups_case([1, 1, 1], [13, 0, 30], [4, 2, 16], [False, False, True]),
        ),
        # Only a launch of circular groups has tiles with no slot; its window need not be
        # the smallest (1 entry): a base left at INT32_MAX then forms addresses that wrap.
        (
            N_(
                "sliding windows only, a request with no position >= 0, launched with a window "
                "of 4 entries (any window that holds a tile's blocks is valid)"
            ),
            _with_window(_groups_case([3, 2], [0, -3], [4, 8], [True, True], padding=1), 4),
        ),
        (
            N_(
                "block numbers above 2^24: blocks of 1 numbered up to 2^31 - 1, blocks of 16 and "
                "a ring of 8 from 2^24 + 1"
            ),
            _large_blocks(
                _groups_case([5, 3], [0, 9], [1, 16, 8], [False, False, True], padding=1),
                [-1, 2**24 + 1, 2**27 + 3],
            ),
        ),
    ]


@st.composite
def _fused_strategy(draw: st.DrawFn) -> GroupsCase:
    groups = draw(st.integers(1, 3))
    sizes = draw(
        st.lists(st.sampled_from([1, 2, 3, 4, 5, 8, 16]), min_size=groups, max_size=groups)
    )
    # Negative positions (a sliding window's padding) are valid in circular groups only.
    rings_only = draw(st.booleans())
    rings = (
        [True] * groups
        if rings_only
        else draw(st.lists(st.booleans(), min_size=groups, max_size=groups))
    )
    lengths = draw(st.lists(st.integers(0, 20), min_size=1, max_size=3))
    firsts = [draw(st.integers(-n - 2 if rings_only else 0, 30)) for n in lengths]
    padding = draw(st.integers(0 if sum(lengths) else 1, 10))
    case = _groups_case(lengths, firsts, sizes, rings, padding)
    if draw(st.booleans()):  # block numbers an engine's table can hold, most above 2^24
        tops = [max_block_number_of(size) - 200 for size in sizes]
        _large_blocks(case, [draw(st.integers(0, top)) for top in tops])
    # Shuffle block numbers within each group: a kernel must not rely on them being in order.
    for table in case.block_tables:
        entries = [b for row in table for b in row]
        shuffled = draw(st.permutations(entries))
        it = iter(shuffled)
        for row in table:
            row[:] = [next(it) for _ in row]
    return case


# ---------------------------------------------------------------------------------------------
# 09.fused_groups: launching the learner's kernel
# ---------------------------------------------------------------------------------------------
def run_kernel(kernel: Any, grid: tuple[int, ...], args: tuple, constants: dict) -> None:
    """Launch a learner's kernel, every load bounds-checked under the interpreter (a read
    outside the tensors passed in is reported as ``Wrong``); on a GPU, a plain launch."""
    checked_launch(kernel, grid, *args, **constants)


def fused_tensors(case: GroupsCase, device: torch.device | str = DEVICE) -> dict[str, Any]:
    """The kernel's inputs on ``device``. query_start_loc carries one spare entry (num_tokens
    again), so a kernel that forgets the padding program reads an empty request there (and is
    caught for the unwritten padding) rather than past the tensor; the kernel is told
    ``num_reqs`` apart. Positions are exactly the batch's: a lane that loads past them
    unmasked is an out-of-bounds read."""
    qsl = torch.tensor(case.query_start_loc + [case.num_tokens], dtype=torch.int32, device=device)
    return dict(
        num_reqs=case.num_reqs,
        query_start_loc=qsl,
        positions=torch.tensor(case.positions, dtype=torch.int64, device=device),
        block_tables=torch.tensor(case.stacked(), dtype=torch.int32, device=device).reshape(
            case.num_groups, case.num_reqs, case.width
        ),
        block_sizes=torch.tensor(case.block_sizes, dtype=torch.int32, device=device),
        circular=torch.tensor([int(c) for c in case.circular], dtype=torch.int32, device=device),
    )


def kernel_args(t: dict[str, Any], num_tokens: int, max_num_tokens: int, out: torch.Tensor):
    """The kernel's runtime arguments, in its signature's order."""
    tables = t["block_tables"]
    return (
        num_tokens,
        max_num_tokens,
        t["num_reqs"],
        t["query_start_loc"],
        t["positions"],
        tables,
        tables.stride(0),
        tables.stride(1),
        t["block_sizes"],
        t["circular"],
        out,
        out.stride(0),
    )


def launch_fused_kernel(kernel: Any, case: GroupsCase, tile_size: int = TILE) -> list[int]:
    """Run a learner's fused kernel on grid ``(num_groups, num_reqs + 1)``, with tiles of
    ``tile_size`` tokens and ``group_window``'s window, into rows ``max_num_tokens + ROW_GAP``
    apart inside a poisoned buffer. Returns the whole buffer (guard, rows and gaps, guard).

    The kernel takes ``num_tokens, max_num_tokens, num_reqs, query_start_loc_ptr,
    positions_ptr, block_tables_ptr, block_tables_group_stride, block_table_stride,
    block_sizes_ptr, circular_ptr, slot_mappings_ptr, slot_mappings_stride``, then
    ``PAD_ID``, ``TILE_BLOCK_SIZE`` and ``BLOCK_TABLE_WINDOW_SIZE``.
    """
    groups, length = case.num_groups, case.padded_length
    stride = length + ROW_GAP
    buffer = torch.full(
        (GUARD + groups * stride + GUARD,), POISON, dtype=torch.int32, device=DEVICE
    )
    out = buffer[GUARD : GUARD + groups * stride].view(groups, stride)[:, :length]
    tensors = fused_tensors(case)
    constants = dict(
        PAD_ID=PAD_SLOT_ID,
        TILE_BLOCK_SIZE=tile_size,
        BLOCK_TABLE_WINDOW_SIZE=case.window
        or group_window(tile_size, case.block_sizes, case.circular),
    )
    grid = (groups, case.num_reqs + 1)
    run_kernel(kernel, grid, kernel_args(tensors, case.num_tokens, length, out), constants)
    return buffer.cpu().tolist()


# ---------------------------------------------------------------------------------------------
# 09.fused_groups: what went wrong, in words
# ---------------------------------------------------------------------------------------------
FUSED_HINT = N_(
    "Program (g, q): row g of the output starts at slot_mappings_ptr + g * "
    "slot_mappings_stride; group g's block size, circular flag and table are its "
    "own; program (g, num_reqs) pads row g; a negative position (circular groups) "
    "gets PAD_ID."
)


def _slots_as_if(case: GroupsCase, g: int, block_size: int) -> list[int | None]:
    """Group g's real tokens' slots had its table been read with ``block_size`` (a masked
    load past the row gives 0, as the kernel's would); None where the window could not say."""
    row_of = case.stacked()[g]
    slots: list[int | None] = []
    for t, p in enumerate(case.positions[: case.num_tokens]):
        if p < 0:
            slots.append(None)
            continue
        block = 0 if case.circular[g] else p // block_size
        row = row_of[case.request_of(t)]
        slots.append((row[block] if block < len(row) else 0) * block_size + p % block_size)
    return slots


def _group_name(case: GroupsCase, g: int) -> str:
    kind = (_("a ring of {size}") if case.circular[g] else _("blocks of {size}")).format(
        size=case.block_sizes[g]
    )
    return _("group {g} ({kind})").format(g=g, kind=kind)


def diagnose_fused(case: GroupsCase, expected: list[list[int]], buffer: list[int]) -> Wrong | None:
    """The first invariant that ``buffer`` (guard, rows and gaps, guard) breaks, or None."""
    groups, length = case.num_groups, case.padded_length
    stride = length + ROW_GAP
    body = buffer[GUARD : GUARD + groups * stride]
    for index, value in enumerate(buffer[:GUARD]):
        if value != POISON:
            return Wrong(
                _(
                    "a lane wrote {value} before the output (at {value2} from row 0's start)"
                ).format(value=value, value2=index - GUARD),
                POISON,
                value,
                _(
                    "Mask every store, and start row g at slot_mappings_ptr + g * "
                    "slot_mappings_stride."
                ),
            )
    for index, value in enumerate(buffer[GUARD + groups * stride :]):
        if value != POISON:
            return Wrong(
                _("a lane wrote {value} past the last group's row (at {index} after it)").format(
                    value=value, index=index
                ),
                POISON,
                value,
                _("Mask every store (offsets < end, offsets < max_num_tokens)."),
            )
    for g in range(groups):
        gap = body[g * stride + length : (g + 1) * stride]
        for index, value in enumerate(gap):
            if value != POISON:
                return Wrong(
                    _(
                        "a lane wrote {value} just past the end of {group_name}'s row (column "
                        "{value2}; "
                        "the rows hold {length} entries and lie {stride} apart here): rows are "
                        "slot_mappings_stride apart, which need not be max_num_tokens"
                    ).format(
                        value=value,
                        group_name=_group_name(case, g),
                        value2=length + index,
                        length=length,
                        stride=stride,
                    ),
                    POISON,
                    value,
                    _("Row g starts at slot_mappings_ptr + g * slot_mappings_stride."),
                )
    rows = [body[g * stride : g * stride + length] for g in range(groups)]
    unwritten = [g for g in range(1, groups) if all(v == POISON for v in rows[g])]
    if unwritten and any(v != POISON for v in rows[0]):
        g = unwritten[0]
        return Wrong(
            _(
                "{group_name}'s row was never written, while row 0 was: every group's programs "
                "wrote row 0 (the group's row offset is missing)"
            ).format(group_name=_group_name(case, g)),
            expected[g],
            rows[g],
            _(
                "Row g starts at slot_mappings_ptr + group_idx * slot_mappings_stride, with "
                "group_idx = tl.program_id(0)."
            ),
        )
    for g in range(groups):
        name = _group_name(case, g)
        got, want = rows[g], expected[g]
        if case.circular[g]:
            for t in range(case.num_tokens):
                p = case.positions[t]
                if p < 0 and got[t] not in (PAD_SLOT_ID, POISON):
                    return Wrong(
                        _(
                            "{name}: token {t} (request {request_of}) has position {p}, before "
                            "position 0 of "
                            "its sliding window: it has no slot and must get PAD_ID "
                            "{pad_slot_id}, got {got}"
                        ).format(
                            name=name,
                            t=t,
                            request_of=case.request_of(t),
                            p=p,
                            pad_slot_id=PAD_SLOT_ID,
                            got=got[t],
                        ),
                        want[: case.num_tokens],
                        got[: case.num_tokens],
                        _(
                            "In a circular group, has_slot = pos >= 0: keep negative positions "
                            "away from % "
                            "(Triton's % truncates toward zero: -1 % 4 is -1) and store PAD_ID "
                            "for them."
                        ),
                    )
        real = got[: case.num_tokens]
        if real != want[: case.num_tokens] and POISON not in real:
            for h in range(groups):
                size = case.block_sizes[h]
                if size == case.block_sizes[g]:
                    continue
                alt = _slots_as_if(case, g, size)
                mine = [s for s, a in zip(real, alt, strict=True) if a is not None]
                if mine and mine == [a for a in alt if a is not None]:
                    return Wrong(
                        _(
                            "{name}: its slots are those of blocks of {size} tokens "
                            "({group_name}'s block "
                            "size), but its own blocks hold {value}: each group's programs must "
                            "load their "
                            "own group's block size"
                        ).format(
                            name=name,
                            size=size,
                            group_name=_group_name(case, h),
                            value=case.block_sizes[g],
                        ),
                        want[: case.num_tokens],
                        real,
                        _(
                            "Load the program's own group's block size from block_sizes, and use "
                            "it for the "
                            "block index, the offset and the slot."
                        ),
                    )
        wrong = explain_slot_mapping(
            case.group(g), want, [POISON] * GUARD + got + [POISON] * GUARD
        )
        if wrong is not None:
            return Wrong(
                f"{name}: {wrong.invariant}", wrong.expected, wrong.got, wrong.hint or FUSED_HINT
            )
    return None


def _sentinel_read(case: GroupsCase, wrong: Wrong) -> Wrong | None:
    """A read about 2^31 entries away from a tensor in a launch with a slot-less tile: the window
    started at the INT32_MAX sentinel, and INT32_MAX + 1 wrapped to -2^31."""
    # The bounds check names the tensor nearest the address, which may lie either side of it.
    read = getattr(wrong, "read_index", None) if wrong.kind == "out_of_bounds" else None
    slotless = [
        q
        for q in range(case.num_reqs)
        if case.query_start_loc[q] < case.query_start_loc[q + 1]
        and all(
            p < 0 for p in case.positions[case.query_start_loc[q] : case.query_start_loc[q + 1]]
        )
    ]
    if read is None or abs(read) < 2**20 or not slotless:
        return None
    return Wrong(
        _(
            "{invariant}: request {slotless}'s tiles have no lane with a slot (every "
            "position is negative), so the window's base stayed at the INT32_MAX sentinel "
            "and INT32_MAX + 1 wrapped to -2^31"
        ).format(invariant=wrong.invariant, slotless=slotless[0]),
        wrong.expected,
        wrong.got,
        _(
            "A tile in which no lane has a slot starts its window at 0: replace a base still "
            "at INT32_MAX by 0 before forming any address from it."
        ),
    )


def judge_fused(kernel: Any, case: GroupsCase) -> None:
    """Launch ``kernel`` on ``case`` and raise ``Wrong`` with the first broken invariant."""
    if not hasattr(kernel, "__getitem__"):
        raise Wrong(
            _("expected a @triton.jit kernel, got {name}").format(name=type(kernel).__name__),
            hint=_(
                "Pass the kernel itself: check('09.fused_groups', fused_slot_mappings_kernel)."
            ),
        )
    try:
        buffer = launch_fused_kernel(kernel, case)
    except Wrong as wrong:
        raise _sentinel_read(case, wrong) or wrong from None
    except Exception as error:
        wrong = _gather_error(error)
        if wrong is None:
            raise
        raise wrong from None
    wrong = diagnose_fused(case, case.expected(), buffer)
    if wrong is not None:
        raise wrong


register(
    Exercise(
        id="09.fused_groups",
        title=N_("the fused multi-group slot-mapping kernel"),
        cases=_fused_cases,
        strategy=_fused_strategy,
        judge=judge_fused,
        hint=FUSED_HINT,
        max_examples=30,
    )
)


# ---------------------------------------------------------------------------------------------
# 09.fused_groups_time: the kernel against lesson 08's model, on a GPU
# ---------------------------------------------------------------------------------------------
TIME_SHAPES = (("decode1024", 2), ("mixed", 2))  # (slotmap.bench shape, groups)
TIME_BLOCK = 16  # tokens per block in every group of the timed batches
GRAPH_CALLS = 20  # kernel launches per captured graph, as slotmap bench's default
COPY_BYTES = 64 << 20  # the card's bandwidth: a copy large enough not to be latency-bound
# measured / model must lie in this band. The teaching kernel runs one program per request
# with one tile size, so it sits above the model (a long request walks its tiles one after
# another); far below it means the kernel did not do its work.
TIME_BAND = (0.5, 6.0)
NEEDS_GPU = (
    "timing needs an NVIDIA GPU (CUDA graphs); this backend is {}. "
    "Your kernel ran once and its slots are right; 09.fused_groups grades them."
)


@dataclass(frozen=True)
class TimeMeasurement:
    """One timed batch: the kernel's µs per call in a CUDA graph, and what the model needs,
    measured on the same card (the floor: an empty kernel on the same grid; the bandwidth:
    a large device-to-device copy)."""

    shape: str
    groups: int
    num_tokens: int
    max_num_tokens: int
    measured_us: float
    floor_us: float
    copy_gbps: float
    library_us: float | None = None  # the library's fused kernel, committed H200 run

    @property
    def predicted_us(self) -> float:
        from slotmap.exercises.lesson08 import model_us

        return model_us(
            self.num_tokens, self.max_num_tokens, self.groups, self.copy_gbps, self.floor_us
        )

    def __str__(self) -> str:
        return (
            f"{self.shape}, {self.groups} groups of blocks of {TIME_BLOCK}: "
            f"num_tokens={self.num_tokens}, max_num_tokens={self.max_num_tokens}"
        )


def time_verdict(m: TimeMeasurement, band: tuple[float, float] = TIME_BAND) -> Wrong | None:
    """None when ``m.measured_us`` lies within ``band`` times the model's prediction, else
    what it means."""
    from slotmap.exercises.lesson08 import kernel_bytes

    predicted = m.predicted_us
    ratio = m.measured_us / predicted
    if band[0] <= ratio <= band[1]:
        return None
    size = kernel_bytes(m.num_tokens, m.max_num_tokens, m.groups)
    model = (
        f"max(floor {m.floor_us:.3g} µs, {size:,} bytes / {m.copy_gbps:,.0f} GB/s) = "
        f"{predicted:.3g} µs"
    )
    library = (
        f"; the library's fused kernel took {m.library_us:.3g} µs on the H200 (committed run)"
        if m.library_us is not None
        else ""
    )
    if ratio > band[1]:
        return Wrong(
            _(
                "on {shape} with {groups} groups your kernel took {measured_us:.3g} µs a call in "
                "a CUDA graph, {ratio:.3g}x lesson 08's model ({model}); up to {band:g}x "
                "passes{library}"
            ).format(
                shape=m.shape,
                groups=m.groups,
                measured_us=m.measured_us,
                ratio=ratio,
                model=model,
                band=band[1],
                library=library,
            ),
            _("at most {value:.3g} µs").format(value=band[1] * predicted),
            f"{m.measured_us:.3g} µs",
            _(
                "Look for work done per lane that could be done once per tile: one window load a "
                "tile (not a load per lane in a loop), the group's metadata loaded once a "
                "program, no Python-side loop over tokens."
            ),
        )
    return Wrong(
        _(
            "on {shape} with {groups} groups your kernel took {measured_us:.3g} µs a call, "
            "{value:.3g}x faster than lesson 08's model ({model}) allows: a kernel cannot "
            "beat its floor by that much; did every program write its row?"
        ).format(
            shape=m.shape, groups=m.groups, measured_us=m.measured_us, value=1 / ratio, model=model
        ),
        _("at least {value:.3g} µs").format(value=band[0] * predicted),
        f"{m.measured_us:.3g} µs",
        _("Time a kernel that passes 09.fused_groups."),
    )


def measure_fused_time(kernel: Any, shape_name: str, groups: int) -> TimeMeasurement:
    """Time ``kernel`` on one of ``slotmap bench``'s shapes in a CUDA graph (its timers), with
    its inputs and reference, checking the slots exactly before and after timing."""
    from slotmap import bench
    from slotmap.exercises.lesson08 import committed_results, lookup
    from slotmap.kernels.fused_groups import choose_tiling

    case = bench.build_case(bench.SHAPES[shape_name], TIME_BLOCK, str(DEVICE))
    n, length = case.shape.num_tokens, case.shape.max_num_tokens
    device = case.positions.device
    tensors = dict(
        num_reqs=case.num_reqs,
        query_start_loc=case.query_start_loc,
        positions=case.positions,
        block_tables=torch.stack(case.block_tables[:groups]),
        block_sizes=torch.full((groups,), TIME_BLOCK, dtype=torch.int32, device=device),
        circular=torch.zeros(groups, dtype=torch.int32, device=device),
    )
    out = torch.empty(groups, length, dtype=torch.int32, device=device)
    tile = choose_tiling(n, case.num_reqs)[0]
    constants = dict(
        PAD_ID=PAD_SLOT_ID,
        TILE_BLOCK_SIZE=tile,
        BLOCK_TABLE_WINDOW_SIZE=group_window(tile, [TIME_BLOCK] * groups, [False] * groups),
    )
    grid = (groups, case.num_reqs + 1)
    args = kernel_args(tensors, n, length, out)
    expected = case.expected[:groups]

    def run() -> None:
        run_kernel(kernel, grid, args, constants)

    def exact(when: str) -> None:
        bench.synchronize()
        if not torch.equal(out, expected):
            wrong = (out != expected).nonzero()[0].tolist()
            raise Wrong(
                _(
                    "on {shape_name} with {groups} groups, {when}, slot_mappings{wrong} is {int}, "
                    "the reference says {int2}"
                ).format(
                    shape_name=shape_name,
                    groups=groups,
                    when=when,
                    wrong=wrong,
                    int=int(out[wrong[0], wrong[1]]),
                    int2=int(expected[wrong[0], wrong[1]]),
                ),
                hint=_("Make 09.fused_groups pass first."),
            )

    out.fill_(POISON)
    run()
    exact("before timing")
    capture = bench.graph_capture("cuda")
    out.fill_(POISON)
    measured = bench.time_graph(run, GRAPH_CALLS, False, capture)
    exact("after timing")
    floor = bench.time_graph(lambda: bench._empty_kernel[grid](), GRAPH_CALLS, False, capture)
    source = torch.randint(1, 256, (COPY_BYTES // 2,), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy_us = bench.time_graph(lambda: target.copy_(source), GRAPH_CALLS, False, capture)
    record = lookup(committed_results(), shape_name, TIME_BLOCK, f"fused-{groups}", "graph")
    return TimeMeasurement(
        shape_name,
        groups,
        n,
        length,
        measured,
        floor,
        COPY_BYTES / (copy_us * 1e3),
        None if record is None else float(record["us"]),
    )


def gpu_timing() -> bool:
    """Whether this backend can time a kernel in a CUDA graph."""
    return BACKEND.name == "cuda"


def _time_cases() -> list[tuple[str, Any]]:
    if not gpu_timing():
        return [(N_("one correctness run (the timing needs a GPU)"), None)]
    return [
        (f"{shape}, {groups} groups, in a CUDA graph", (shape, groups))
        for shape, groups in TIME_SHAPES
    ]


def judge_time(kernel: Any, case: tuple[str, int] | None) -> None:
    """On a GPU, time ``kernel`` on one shape against the model; elsewhere (``case`` None)
    check it once, then skip: the timing needs a GPU."""
    if case is None:
        # No GPU: an unfinished or wrong kernel still fails here; a right one is skipped.
        judge_fused(kernel, _fused_cases()[0][1])
        raise Skipped(NEEDS_GPU.format(BACKEND.name))
    if not hasattr(kernel, "__getitem__"):
        judge_fused(kernel, _fused_cases()[0][1])
    wrong = time_verdict(measure_fused_time(kernel, *case))
    if wrong is not None:
        raise wrong


register(
    Exercise(
        id="09.fused_groups_time",
        title=N_("the fused kernel against lesson 08's timing model (GPU)"),
        cases=_time_cases,
        strategy=None,
        judge=judge_time,
        hint=N_(
            "Make 09.fused_groups pass first; then one window load a tile, metadata once a "
            "program."
        ),
    )
)
