"""Lesson 04's exercises: circular (ring-buffer) caches.

* ``04.ring_slot``: the slot of one position in a ring buffer of one block, in Python, with
  negative positions (the padded tail of a sliding window) mapped to PAD_ID.
* ``04.circular_kernel``: the circular branch inside a teaching kernel (lesson 02's kernel for
  a ring-buffer cache). Triton's ``%`` truncates toward zero like C's: the guard is the point.

Both judges name the classic mistakes: Python's floor ``%`` wrapping a negative position into
a real slot, C's truncating ``%`` leaving a negative offset, and a forgotten block number.
"""

from __future__ import annotations

from collections.abc import Callable

import triton
import triton.language as tl
from hypothesis import strategies as st
from torch import Tensor

from slotmap.exercises.cases import (
    GUARD,
    SlotCase,
    explain_slot_mapping,
    guarded_output,
    launch_learner_kernel,
    max_block_number_of,
    slot_cases,
)
from slotmap.exercises.core import Exercise, Wrong, plural, register
from slotmap.i18n import N_, _
from slotmap.layout import PAD_SLOT_ID
from slotmap.reference import slot_mapping_oracle, token_slot

TILE = 8  # tokens per tile in this lesson's kernel exercise


# ---------------------------------------------------------------------------------------------
# What a wrong ring slot usually means
# ---------------------------------------------------------------------------------------------
def truncating_mod(a: int, b: int) -> int:
    """C's (and Triton's) ``a % b``: the remainder has the sign of ``a``."""
    return a - b * int(a / b) if b else 0


def diagnose_ring_slot(
    position: int, block_number: int, block_size: int, pad_id: int, got: int
) -> str | None:
    """Why ``got`` is wrong for this position of a ring buffer, in words (None: it is right)."""
    expected = token_slot(position, [block_number], block_size, circular=True, pad_id=pad_id)
    if got == expected:
        return None
    first, last = block_number * block_size, block_number * block_size + block_size - 1
    if position < 0:
        why = ""
        if got == block_number * block_size + position % block_size:
            why = _(" (Python's floor % wrapped it to offset {value})").format(
                value=position % block_size
            )
        elif truncating_mod(
            position, block_size
        ) < 0 and got == block_number * block_size + truncating_mod(position, block_size):
            why = _(
                " (C's truncating % left the negative offset {truncating_mod}: a slot of the "
                "block before)"
            ).format(truncating_mod=truncating_mod(position, block_size))
        return _(
            "position {position} is in the padded tail of the sliding window: it has no slot "
            "and must get PAD_ID {pad_id}, got {got}{why}"
        ).format(position=position, pad_id=pad_id, got=got, why=why)
    if got == position % block_size and block_number != 0:
        return _(
            "position {position} got slot {got} = position % block_size: the slot must be in "
            "the request's block {block_number} (slots {first}..{last})"
        ).format(position=position, got=got, block_number=block_number, first=first, last=last)
    return _(
        "position {position} in a ring of one block ({block_number}, {slots}) should be "
        "in slot {expected}, got {got}"
    ).format(
        position=position,
        block_number=block_number,
        slots=plural(block_size, N_("slot")),
        expected=expected,
        got=got,
    )


RING_HINT = N_(
    "Which positions can the ring never hold? Those get pad_id. Every other one "
    "keeps its offset inside its block, in the block the table names. Test the sign "
    "before taking a remainder: Triton's % truncates toward zero, like C's."
)


# ---------------------------------------------------------------------------------------------
# 04.ring_slot
# ---------------------------------------------------------------------------------------------
def _ring_slot_cases() -> list[tuple[str, tuple[int, int, int, int]]]:
    # (position, block_number, block_size, pad_id)
    return [
        (N_("the first lap: position 5, block 7 of 8 slots"), (5, 7, 8, -1)),
        (N_("a later lap wraps: position 21"), (21, 7, 8, -1)),
        (N_("position == block_size wraps to the first slot"), (8, 7, 8, -1)),
        (N_("a padded position of the window's tail: -3"), (-3, 7, 8, -1)),
        (N_("a padded position that is a multiple of block_size: -8"), (-8, 7, 8, -1)),
        (N_("block 0 is a block like any other"), (13, 0, 4, -1)),
        (N_("a custom pad_id"), (-1, 2, 4, -7)),
        (N_("a block number above 2^24: 2^28 + 3"), (13, 2**28 + 3, 4, -1)),
    ]


def _ring_slot_strategy() -> st.SearchStrategy:
    return st.integers(1, 16).flatmap(
        lambda block_size: st.tuples(
            st.integers(-3 * block_size - 2, 5 * block_size),
            st.one_of(st.integers(0, 100), st.integers(0, max_block_number_of(block_size))),
            st.just(block_size),
            st.sampled_from([-1, -1, -7]),
        )
    )


def judge_ring_slot(candidate: Callable[..., int], case: tuple[int, int, int, int]) -> None:
    position, block_number, block_size, pad_id = case
    got = candidate(position, block_number, block_size, pad_id)
    if isinstance(got, Tensor):
        got = got.item()
    expected = token_slot(position, [block_number], block_size, circular=True, pad_id=pad_id)
    if not isinstance(got, int):
        raise Wrong(
            _(
                "ring_slot({position}, {block_number}, {block_size}, {pad_id}) returned {got!r}, "
                "not an integer"
            ).format(
                position=position,
                block_number=block_number,
                block_size=block_size,
                pad_id=pad_id,
                got=got,
            ),
            expected,
            got,
        )
    why = diagnose_ring_slot(position, block_number, block_size, pad_id, got)
    if why is not None:
        raise Wrong(why, expected, got, RING_HINT)


register(
    Exercise(
        id="04.ring_slot",
        title=N_("the slot of one position in a ring buffer"),
        cases=_ring_slot_cases,
        strategy=_ring_slot_strategy,
        judge=judge_ring_slot,
        hint=RING_HINT,
        max_examples=100,
    )
)


# ---------------------------------------------------------------------------------------------
# 04.circular_kernel
# ---------------------------------------------------------------------------------------------
def _circular(query_start_loc, positions, block_table, block_size, max_num_tokens=None):
    return SlotCase(
        query_start_loc, positions, block_table, block_size, max_num_tokens, {"circular": True}
    )


def _circular_kernel_cases() -> list[tuple[str, SlotCase]]:
    return [
        (N_("the first lap of a ring of 8 slots"), _circular([0, 6], list(range(6)), [[3]], 8)),
        (
            N_("positions 5..12 cross the ring's end"),
            _circular([0, 8], list(range(5, 13)), [[3]], 8),
        ),
        (
            N_("a sliding window's padded tail: positions -3..4"),
            _circular([0, 8], list(range(-3, 5)), [[3]], 8),
        ),
        (
            N_("negative multiples of the block size: -8 and -4"),
            _circular([0, 3], [-8, -4, 0], [[5]], 4),
        ),
        (
            N_("two requests, several laps, a padding tail"),
            _circular(
                [0, 4, 14], [30, 31, 32, 33, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7], [[2], [9]], 4, 17
            ),
        ),
        (
            N_("rings in blocks above 2^24: 2^31 - 1 (a ring of 1) and 2^24 + 1"),
            _circular([0, 3, 7], [5, -1, 6, 0, 1, 2, 3], [[2**31 - 1], [16777217]], 1),
        ),
    ]


def _circular_kernel_strategy() -> st.SearchStrategy:
    return slot_cases(circular=True, max_length=20, large_blocks=True)


def judge_circular_kernel(kernel, case: SlotCase) -> None:
    if not hasattr(kernel, "__getitem__"):
        raise Wrong(
            _("expected a @triton.jit kernel, got {name}").format(name=type(kernel).__name__),
            hint=_("Pass the kernel itself: check('04.circular_kernel', circular_kernel)."),
        )
    qsl, positions, table = case.tensors()
    counts = {"num_tokens": case.num_tokens, "max_num_tokens": case.padded_length}
    expected = slot_mapping_oracle(
        qsl.cpu(), positions.cpu(), table.cpu(), case.block_size, **counts, **case.options
    ).tolist()
    buffer, out = guarded_output(case.padded_length, positions.device)
    launch_learner_kernel(
        kernel, qsl, positions, table, case.block_size, out=out, tile_size=TILE, **counts
    )
    values = buffer.tolist()
    wrong = explain_slot_mapping(case, expected, values)
    if wrong is None:
        return
    if wrong.kind in ("lane", "unwritten", "padding"):
        raise wrong  # out-of-bounds writes, unwritten elements, a bad padding tail
    got = values[GUARD : GUARD + case.padded_length]
    for token in range(case.num_tokens):
        block_number = case.block_table[case.request_of(token)][0]
        why = diagnose_ring_slot(
            case.positions[token], block_number, case.block_size, PAD_SLOT_ID, got[token]
        )
        if why is not None:
            where = _("token {token} (request {request_of})").format(
                token=token, request_of=case.request_of(token)
            )
            raise Wrong(f"{where}: {why}", wrong.expected, wrong.got, RING_HINT)
    raise wrong


register(
    Exercise(
        id="04.circular_kernel",
        title=N_("the circular branch of the kernel"),
        cases=_circular_kernel_cases,
        strategy=_circular_kernel_strategy,
        judge=judge_circular_kernel,
        hint=RING_HINT,
        max_examples=30,
    )
)


# ---------------------------------------------------------------------------------------------
# A teaching kernel: what Triton's % does with negative numbers (used by the lesson's figure)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _remainder_kernel(
    positions_ptr,  # [n], int64
    remainders_ptr,  # [n], int32: positions % block_size, as Triton computes it
    n,  # int
    block_size,  # int
    TILE: tl.constexpr,
):
    offsets = tl.arange(0, TILE)
    mask = offsets < n
    pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
    tl.store(remainders_ptr + offsets, pos % block_size, mask=mask)


def triton_remainder(positions: Tensor, block_size: int) -> Tensor:
    """``positions % block_size`` computed by a Triton kernel: truncating, like C.

    positions: [n] int64 (n <= 1024) -> [n] int32.
    """
    import torch

    n = positions.numel()
    out = torch.empty(n, dtype=torch.int32, device=positions.device)
    _remainder_kernel[(1,)](positions, out, n, block_size, TILE=triton.next_power_of_2(max(n, 1)))
    return out
