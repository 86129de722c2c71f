"""Lesson 01's exercises: the base formula for one token, then a whole batch.

* ``01.slot_of``: ``slot_of(position, block_table_row, block_size) -> int``.
* ``01.slot_mapping``: a batch's slot mapping in plain Python/torch, with the launcher's
  signature, judged like a kernel (poisoned, guarded output) by ``judge_slot_mapping``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

from slotmap.exercises.cases import (
    SLOT_OF_HINT,
    SlotCase,
    explain_slot,
    judge_slot_mapping,
    max_block_number_of,
    slot_cases,
)
from slotmap.exercises.core import Exercise, Wrong, register
from slotmap.i18n import N_, _
from slotmap.reference import token_slot


# ---------------------------------------------------------------------------------------------
# 01.slot_of
# ---------------------------------------------------------------------------------------------
@dataclass
class RowCase:
    """Positions of one request, its block-table row and the block size."""

    block_table_row: list[int]
    block_size: int
    positions: list[int]

    def __str__(self) -> str:
        return (
            f"block_table_row={self.block_table_row}, block_size={self.block_size}, "
            f"positions={self.positions}"
        )


def slot_of_cases() -> list[tuple[str, RowCase]]:
    # Every row has a spare entry past the blocks its positions use, so that an off-by-one
    # block index reads a real (wrong) entry and is reported as such, not as an IndexError.
    return [
        (N_("the first token"), RowCase([7, 2], 4, [0])),
        (N_("one request over two blocks"), RowCase([7, 2, 5], 4, list(range(8)))),
        (N_("block size 1"), RowCase([3, 9, 4, 8], 1, [0, 1, 2])),
        (N_("block size 3, not a power of two"), RowCase([5, 0, 11, 6], 3, list(range(9)))),
        (N_("a decode step late in a long request"), RowCase([4, 1, 8, 3, 6, 2], 16, [83])),
        (
            N_("production's blocks of 128, deep into a long request"),
            RowCase([9 * b % 41 for b in range(40)], 128, [0, 4099, 4999]),
        ),
        (
            N_("block numbers above 2^24, up to 2^31 - 1 (blocks of 1)"),
            RowCase([2**31 - 1, 16777217, 2**30 + 3, 0], 1, [0, 1, 2]),
        ),
    ]


@st.composite
def slot_of_random(draw: st.DrawFn) -> RowCase:
    block_size = draw(st.sampled_from((1, 2, 3, 4, 5, 8, 16)))
    entries = draw(st.integers(1, 6))
    if draw(st.booleans()):
        row = draw(st.permutations(range(64)))[:entries]
    else:  # any block whose slots fit int32: most above 2^24
        largest = st.integers(0, max_block_number_of(block_size))
        row = draw(st.lists(largest, min_size=entries, max_size=entries, unique=True))
    positions = draw(
        st.lists(st.integers(0, entries * block_size - 1), min_size=1, max_size=8, unique=True)
    )
    return RowCase(list(row), block_size, positions)


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if hasattr(value, "numel") and value.numel() == 1 and not value.is_floating_point():
        return int(value.item())  # a one-element integer tensor
    return None


def judge_slot_of(slot_of: Callable[[int, list[int], int], int], case: RowCase) -> None:
    for position in case.positions:
        returned = slot_of(position, list(case.block_table_row), case.block_size)
        got = _as_int(returned)
        if got is None:
            raise Wrong(
                _(
                    "slot_of({position}, ...) returned {returned!r} ({name}), not an integer slot"
                ).format(position=position, returned=returned, name=type(returned).__name__),
                hint=_("Use integer arithmetic: // and %, not /."),
            )
        expected = token_slot(position, case.block_table_row, case.block_size)
        if got != expected:
            raise explain_slot(position, case.block_table_row, case.block_size, got)


register(
    Exercise(
        id="01.slot_of",
        title=N_("the base formula for one token"),
        cases=slot_of_cases,
        strategy=slot_of_random,
        judge=judge_slot_of,
        hint=SLOT_OF_HINT,
        max_examples=60,
    )
)


# ---------------------------------------------------------------------------------------------
# 01.slot_mapping
# ---------------------------------------------------------------------------------------------
def slot_mapping_cases() -> list[tuple[str, SlotCase]]:
    two_requests = ([0, 3, 8], [0, 1, 2, 2, 3, 4, 5, 6], [[7, 2], [5, 9]], 4)
    return [
        (N_("two requests, no padding"), SlotCase(*two_requests)),
        (N_("two requests and a padding tail"), SlotCase(*two_requests, max_num_tokens=11)),
        (
            N_("one decode step per request"),
            SlotCase([0, 1, 2, 3], [5, 0, 9], [[3, 8, 0], [6, 1, 0], [2, 4, 7]], 4),
        ),
        (
            N_("an empty request in the middle"),
            SlotCase([0, 2, 2, 5], [0, 1, 3, 4, 5], [[9, 0], [1, 0], [4, 6]], 3, 7),
        ),
        # An engine's positions buffer has room for max_num_tokens; past num_tokens it holds
        # stale positions of an earlier step: the padding starts at num_tokens, not its length.
        (
            N_("a positions buffer longer than the batch"),
            SlotCase([0, 3, 8], [0, 1, 2, 2, 3, 4, 5, 6, 7, 7, 7], [[7, 2], [5, 9]], 4, 11),
        ),
        (N_("no tokens at all: every entry is padding"), SlotCase([0, 0], [], [[3]], 4, 5)),
        (
            N_("block numbers above 2^24, up to 2^31 - 1 (blocks of 1)"),
            SlotCase([0, 2, 3], [0, 1, 0], [[2**31 - 1, 16777217], [2**30 + 3, 0]], 1),
        ),
    ]


register(
    Exercise(
        id="01.slot_mapping",
        title=N_("a batch's slot mapping"),
        cases=slot_mapping_cases,
        strategy=lambda: slot_cases(max_requests=4, max_length=12, large_blocks=True),
        judge=judge_slot_mapping,
        hint=(
            N_(
                "For request q, tokens query_start_loc[q] .. query_start_loc[q + 1] - 1 use row "
                "q of the block table and their own positions; the rest of out is pad_id."
            )
        ),
        max_examples=40,
    )
)
