"""Hand-written cases, one per mode, through every single-group implementation.

Each case carries its expected slots, computed in this file by hand or by a one-line formula,
never by slotmap, so the cases pin the reference itself as well as the kernels.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch
from conftest import (
    SINGLE_GROUP_IMPLEMENTATIONS,
    Case,
    Guarded,
    assert_slots_equal,
    implementation,
    qsl_of,
    tensor,
)

import slotmap

PAD = slotmap.PAD_SLOT_ID


def plain_slots(rows: Sequence[Sequence[int]], positions: Sequence[Sequence[int]], bs: int):
    """Expected slots without CP: ``row[p // bs] * bs + p % bs``, request by request."""
    return [
        row[p // bs] * bs + p % bs for row, pos in zip(rows, positions, strict=True) for p in pos
    ]


@dataclass
class HandCase:
    case: Case
    expected: list[int]  # the whole output, padding tail included


def _case(lengths, positions, rows, bs, **options) -> Case:
    flat = [p for pos in positions for p in pos]
    return Case(qsl_of(lengths), tensor(flat, torch.int64), tensor(rows, torch.int32), bs, options)


def doc_example() -> HandCase:
    # The kernel's own comment: block_size 4, row [7, 2], positions 0..5 -> 28 29 30 31 8 9.
    return HandCase(_case([6], [range(6)], [[7, 2]], 4), [28, 29, 30, 31, 8, 9])


def two_shuffled_requests() -> HandCase:
    rng = random.Random(7)
    first = list(range(0, 10))
    second = list(range(5, 13))
    rng.shuffle(first)
    rng.shuffle(second)
    rows = [[3, 9, 4, 0], [8, 1, 6, 2]]
    return HandCase(
        _case([10, 8], [first, second], rows, 4), plain_slots(rows, [first, second], 4)
    )


def cp_world2_rank1_interleave2() -> HandCase:
    # kv block 8 = two attention blocks of 4; virtual block 16. Rank 1 owns offsets whose
    # segment (offset // 2) is odd: 2 3, 6 7, 10 11, 14 15, packed as local 0..7; local 0..3
    # sit in attention block 0 of the kv block, 4..7 in block 1. Physical kv blocks [5, 6]
    # expand to attention blocks [10, 11, 12, 13].
    expected = [PAD, PAD, 40, 41, PAD, PAD, 42, 43, PAD, PAD, 44, 45, PAD, PAD, 46, 47]
    expected += [PAD, PAD, 48, 49]  # position 18: second virtual block, local 0 -> block 12
    rows = slotmap.expand_block_table(tensor([[5, 6]], torch.int32), 2).tolist()
    assert rows == [[10, 11, 12, 13]]
    case = _case(
        [20],
        [range(20)],
        rows,
        4,
        kv_cache_block_size=8,
        cp_world_size=2,
        cp_rank=1,
        cp_interleave=2,
    )
    return HandCase(case, expected)


def cp_rank0_kv128_block32() -> HandCase:
    # W = 2, rank 0, interleave 2, kv block 128 (= 4 attention blocks of 32): virtual block
    # 256. Rank 0 owns offsets 0 1, 4 5, 8 9, ...; local = (vo // 4) * 2 + vo % 2.
    # Row = attention blocks 100..107 (two virtual blocks' worth). Some positions by hand:
    row = list(range(100, 108))
    by_hand = {
        0: 100 * 32 + 0,  # local 0 -> block 0, offset 0
        1: 100 * 32 + 1,
        2: PAD,  # segment 1 -> rank 1
        4: 100 * 32 + 2,  # local 2
        5: 100 * 32 + 3,
        64: 101 * 32 + 0,  # local 32 -> block 1
        253: 103 * 32 + 31,  # local 127 -> block 3, offset 31
        255: PAD,  # segment 127 -> rank 1
        256: 104 * 32 + 0,  # second virtual block: block 4
        261: 104 * 32 + 3,  # vo 5 -> local 3
    }
    expected = []
    for p in range(300):
        vb, vo = divmod(p, 256)
        local = (vo // 4) * 2 + vo % 2
        owned = (vo // 2) % 2 == 0
        expected.append(row[vb * 4 + local // 32] * 32 + local % 32 if owned else PAD)
    assert all(expected[p] == slot for p, slot in by_hand.items())
    case = _case(
        [300],
        [range(300)],
        [row],
        32,
        kv_cache_block_size=128,
        cp_world_size=2,
        cp_rank=0,
        cp_interleave=2,
    )
    return HandCase(case, expected)


def four_long_requests(bs: int) -> HandCase:
    # Prefill-sized requests of 1024, 2048, 4096 and 8192 contiguous tokens; two of them
    # start in the middle of a block so a tile straddles one more block than it covers.
    lengths = [1024, 2048, 4096, 8192]
    firsts = [0, 7, 0, 100]
    positions = [range(f, f + n) for f, n in zip(firsts, lengths, strict=True)]
    rng = random.Random(bs)
    width = (100 + 8192) // bs + 1
    numbers = rng.sample(range(1, 4 * 4 * width), 4 * width)
    rows = [numbers[i * width : (i + 1) * width] for i in range(4)]
    return HandCase(_case(lengths, positions, rows, bs), plain_slots(rows, positions, bs))


def circular_negative() -> HandCase:
    # A ring of one block (9): negative positions are the padded tail and get no slot.
    positions = [[-3, -2, -1, 0, 1, 2, 3, 4, 5], [6, -1, 9]]
    expected = [PAD, PAD, PAD, 36, 37, 38, 39, 36, 37] + [4 * 4 + 2, PAD, 4 * 4 + 1]
    return HandCase(_case([9, 3], positions, [[9, 1], [4, 5]], 4, circular=True), expected)


def hybrid() -> HandCase:
    # kv block 8 = 4 attention blocks of 2: physical kv blocks [3, 1] -> attention blocks
    # [12 13 14 15 4 5 6 7].
    rows = slotmap.expand_block_table(tensor([[3, 1]], torch.int32), 4).tolist()
    assert rows == [[12, 13, 14, 15, 4, 5, 6, 7]]
    expected = list(range(24, 32)) + list(range(8, 16))
    return HandCase(_case([16], [range(16)], rows, 2, kv_cache_block_size=8), expected)


def padding_tail() -> HandCase:
    case = _case([6], [range(6)], [[7, 2]], 4, max_num_tokens=9)
    return HandCase(case, [28, 29, 30, 31, 8, 9, PAD, PAD, PAD])


def padding_tail_custom_pad() -> HandCase:
    case = _case([2, 1], [[4, 5], [0]], [[7, 2], [3, 0]], 4, max_num_tokens=5, pad_id=-7)
    return HandCase(case, [8, 9, 12, -7, -7])


def empty_requests() -> HandCase:
    positions = [[], [0, 1, 2], [], [5, 6], []]
    rows = [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    return HandCase(_case([0, 3, 0, 2, 0], positions, rows, 4), [12, 13, 14, 33, 34])


def no_requests() -> HandCase:
    case = _case([], [], [[0]], 4, max_num_tokens=5)
    return HandCase(case, [PAD] * 5)


def nothing_at_all() -> HandCase:
    return HandCase(_case([], [], [[0]], 4), [])


def positions_past_num_tokens() -> HandCase:
    # positions holds more entries than tokens: the extra ones (garbage) are never read.
    case = _case([3], [[0, 1, 2]], [[5]], 4)
    case.positions = tensor([0, 1, 2, -5, 2**40], torch.int64)
    return HandCase(case, [20, 21, 22])


def block_size_3() -> HandCase:
    first = [0, 1, 2, 3, 4, 5, 6]
    second = [10, 11, 12]
    rows = [[4, 8, 15, 16, 23, 42, 7], [0, 0, 0, 0, 9, 99, 3]]
    expected_bs3 = plain_slots(rows, [first, second], 3)
    return HandCase(_case([7, 3], [first, second], rows, 3), expected_bs3)


HAND_CASES: dict[str, Callable[[], HandCase]] = {
    "doc-example": doc_example,
    "two-requests-shuffled": two_shuffled_requests,
    "cp-w2-r1-i2-kv8-b4": cp_world2_rank1_interleave2,
    "cp-w2-r0-i2-kv128-b32": cp_rank0_kv128_block32,
    "4-requests-1k-to-8k-b16": lambda: four_long_requests(16),
    "4-requests-1k-to-8k-b128": lambda: four_long_requests(128),
    "circular-negative": circular_negative,
    "hybrid-kv8-b2": hybrid,
    "padding-tail": padding_tail,
    "padding-tail-pad-7": padding_tail_custom_pad,
    "empty-requests": empty_requests,
    "num-reqs-0-padded": no_requests,
    "num-reqs-0-empty": nothing_at_all,
    "positions-past-num-tokens": positions_past_num_tokens,
    "block-size-3": block_size_3,
}
_HYBRID_CP = {"cp-w2-r1-i2-kv8-b4", "cp-w2-r0-i2-kv128-b32"}  # not expressible multi-group
_LONG = {"4-requests-1k-to-8k-b16", "4-requests-1k-to-8k-b128"}  # ~1000 interpreted tiles of 16


def _applies(case_name: str, impl_name: str) -> bool:
    hybrid_cp_ok = SINGLE_GROUP_IMPLEMENTATIONS[impl_name][1]
    if case_name in _HYBRID_CP and not hybrid_cp_ok:
        return False
    return not (case_name in _LONG and impl_name.endswith("tile16"))


PARAMS = [
    pytest.param(case_name, impl_name, id=f"{case_name}-{impl_name}")
    for case_name in HAND_CASES
    for impl_name in SINGLE_GROUP_IMPLEMENTATIONS
    if _applies(case_name, impl_name)
]


@pytest.mark.parametrize(("case_name", "impl_name"), PARAMS)
def test_hand_case(case_name: str, impl_name: str) -> None:
    hand = HAND_CASES[case_name]()
    actual = hand.case.run(implementation(impl_name))
    assert_slots_equal(actual, hand.expected, f"{case_name} / {impl_name}:")


@pytest.mark.parametrize(
    "impl_name",
    [pytest.param(name, id=name) for name in SINGLE_GROUP_IMPLEMENTATIONS],
)
@pytest.mark.parametrize("case_name", ["doc-example", "padding-tail", "circular-negative"])
def test_int64_out(case_name: str, impl_name: str) -> None:
    hand = HAND_CASES[case_name]()
    actual = hand.case.run(implementation(impl_name), out_dtype=torch.int64)
    assert actual.dtype == torch.int64
    assert_slots_equal(actual, hand.expected, f"{case_name} / {impl_name} (int64 out):")


@pytest.mark.parametrize(
    "impl_name",
    [pytest.param(name, id=name) for name in SINGLE_GROUP_IMPLEMENTATIONS],
)
def test_without_out_returns_fresh_int32(impl_name: str) -> None:
    hand = padding_tail()
    result = implementation(impl_name)(*hand.case.args(), **hand.case.options)
    assert result.dtype == torch.int32
    assert result.device.type == torch.device(slotmap.DEVICE).type
    assert_slots_equal(result, hand.expected, impl_name)


def test_token_slot_by_hand() -> None:
    row = [7, 2]
    assert [slotmap.token_slot(p, row, 4) for p in range(6)] == [28, 29, 30, 31, 8, 9]
    assert slotmap.token_slot(-1, [9], 4, circular=True) == PAD
    assert slotmap.token_slot(-1, [9], 4, circular=True, pad_id=-7) == -7
    assert slotmap.token_slot(13, [9], 4, circular=True) == 9 * 4 + 1
    # CP: W 2, I 1, block 2 (virtual block 4): rank r owns the positions of parity r.
    # Position 5 is in virtual block 1 at offset 1 -> rank 1, local 0 -> block 1, offset 0.
    assert slotmap.token_slot(5, [3, 8], 2, cp_world_size=2, cp_rank=1) == 8 * 2
    assert slotmap.token_slot(5, [3, 8], 2, cp_world_size=2, cp_rank=0) == PAD


# ---------------------------------------------------------------------------------------------
# Multi-group: a dummy request (idx_mapping -1) whose stale position lies past its table row.
# ---------------------------------------------------------------------------------------------
MULTI_GROUP_GRIDS: dict[str, dict] = {
    "oracle": {},
    "torch": {},
    "fused": {},
    "fused-window": {"token_parallel": False, "lane_loads": False},
    "fused-window-float": {"token_parallel": False, "lane_loads": False, "gather_as_float": True},
    "fused-lanes": {"token_parallel": False, "lane_loads": True},
    "fused-parallel-tiles": {"parallel_tiles": 2, "tile_size": 16},
    "fused-lanes-parallel-tiles": {"parallel_tiles": 2, "tile_size": 16, "lane_loads": True},
    "fused-token-grid": {"token_parallel": True},
    "fused-token-grid-tile16": {"token_parallel": True, "tile_size": 16},
}


def _multi_group(name: str) -> Callable[..., torch.Tensor]:
    if name == "oracle":
        return slotmap.slot_mappings_oracle
    if name == "torch":
        return slotmap.slot_mappings_torch
    return lambda *a, **k: slotmap.compute_slot_mappings(*a, **k, **MULTI_GROUP_GRIDS[name])


@pytest.mark.parametrize("validate", [True, False], ids=["validated", "unvalidated"])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("impl_name", list(MULTI_GROUP_GRIDS))
def test_dummy_request_with_a_stale_position_past_its_row(
    impl_name: str, idx_dtype: torch.dtype, validate: bool
) -> None:
    # vLLM's model-runner-v2 kernel gives [29, -1]: request 0 (row 0, position 1) is in block
    # 7; request 1 is a dummy whose stale position 100 needs block 25 of a 2-entry row.
    qsl = tensor([0, 1, 2], torch.int32)
    positions = tensor([1, 100], torch.int64)
    tables = [tensor([[7, 8], [9, 10]], torch.int32)]
    options: dict = dict(idx_mapping=tensor([0, -1], idx_dtype), validate=validate)
    if not validate:
        options["num_tokens"] = 2
    guarded = Guarded((1, 2))
    _multi_group(impl_name)(qsl, positions, tables, [4], out=guarded.out, **options)
    assert_slots_equal(guarded.check(), [[29, PAD]], impl_name)
