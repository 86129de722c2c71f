"""Lesson 02's exercise: write the first slot-mapping kernel.

``02.first_kernel``: the learner's ``@triton.jit`` kernel takes the production kernel's
arguments (``num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr,
block_table_ptr, block_table_stride, block_size, slot_mapping_ptr, PAD_ID,
TILE_BLOCK_SIZE``): one program per request walks its tokens in tiles, and the last program
writes the padding tail. The judge launches it with grid ``(num_reqs + 1,)`` on a poisoned,
guarded output (``judge_slot_mapping``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from hypothesis import strategies as st

from slotmap.exercises.cases import (
    SlotCase,
    judge_slot_mapping,
    launch_learner_kernel,
    slot_cases,
)
from slotmap.exercises.core import Exercise, Wrong, register
from slotmap.i18n import N_, _

HINT = N_(
    "Each request's program walks its own tokens, from its start to its end, one "
    "tile of TILE_BLOCK_SIZE lanes at a time, and masks the lanes that run past the "
    "end. The grid has one program more than there are requests: that last one "
    "writes PAD_ID over the tail of the output, from num_tokens up to max_num_tokens."
)


@dataclass
class KernelCase:
    """A batch and the tile size the kernel is launched with."""

    batch: SlotCase
    tile_size: int

    def __str__(self) -> str:
        return f"{self.batch}, TILE_BLOCK_SIZE={self.tile_size}"


def named_cases() -> list[tuple[str, KernelCase]]:
    two = ([0, 3, 8], [0, 1, 2, 2, 3, 4, 5, 6], [[7, 2], [5, 9]], 4)
    return [
        (
            N_("one request, exactly one tile"),
            KernelCase(SlotCase([0, 4], [0, 1, 2, 3], [[7, 2]], 4), 4),
        ),
        (
            N_("the last request ends in a partial tile, no padding tail"),
            KernelCase(
                SlotCase(
                    [0, 5, 11], list(range(5)) + list(range(3, 9)), [[6, 1, 0], [3, 8, 5]], 4
                ),
                4,
            ),
        ),
        (N_("two requests and a padding tail"), KernelCase(SlotCase(*two, max_num_tokens=13), 4)),
        (
            N_("a request longer than three tiles"),
            KernelCase(
                SlotCase(
                    [0, 2, 20],
                    [7, 8] + list(range(18)),
                    [[9, 4, 0, 0, 0], [2, 11, 5, 14, 1]],
                    4,
                    23,
                ),
                4,
            ),
        ),
        (
            N_("an empty request and a long padding tail"),
            KernelCase(SlotCase([0, 3, 3, 4], [0, 1, 2, 5], [[3, 0], [1, 0], [6, 2]], 3, 21), 8),
        ),
        (
            N_("no tokens at all: the padding program writes every entry"),
            KernelCase(SlotCase([0, 0], [], [[3]], 4, 6), 4),
        ),
        (
            N_("block numbers above 2^24, up to 2^31 - 1 (blocks of 1)"),
            KernelCase(
                SlotCase([0, 2, 3], [0, 1, 0], [[2**31 - 1, 16777217], [2**30 + 3, 0]], 1), 4
            ),
        ),
    ]


@st.composite
def random_cases(draw: st.DrawFn) -> KernelCase:
    batch = draw(slot_cases(max_requests=3, max_length=20, large_blocks=True))
    return KernelCase(batch, draw(st.sampled_from((4, 8, 16))))


def _is_kernel(candidate: Any) -> bool:
    # triton.jit gives a JITFunction, or an InterpretedFunction under TRITON_INTERPRET=1.
    return hasattr(candidate, "__getitem__") and hasattr(candidate, "run")


def judge(kernel: Any, case: KernelCase) -> None:
    if not _is_kernel(kernel):
        raise Wrong(
            _("expected the @triton.jit kernel itself, got {name}").format(
                name=type(kernel).__name__
            ),
            hint=_("Pass the decorated function: check('02.first_kernel', first_kernel)."),
        )
    # The spare entry catches a forgotten padding program as unwritten padding.
    launcher = partial(launch_learner_kernel, kernel, tile_size=case.tile_size, spare_entry=True)
    judge_slot_mapping(launcher, case.batch)


register(
    Exercise(
        id="02.first_kernel",
        title=N_("the first kernel: programs, tiles, masks, padding"),
        cases=named_cases,
        strategy=random_cases,
        judge=judge,
        hint=HINT,
        max_examples=25,
    )
)
