"""The bounded-window gather: window size, its precondition, and what happens at its edges.

A tile finds the smallest logical block among its valid lanes, loads
``window_size(tile, block_size)`` consecutive block-table entries from there, and each lane
picks its own. Contiguous positions always fit; arbitrary ones may not, and the launcher must
say so instead of reading outside the window.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from conftest import (
    BLOCK_SIZES,
    TILES,
    assert_slots_equal,
    fused_single_group,
    make_case,
    qsl_of,
    slot_mapping_cases,
    tensor,
)
from hypothesis import given
from hypothesis import strategies as st

import slotmap

PAD = slotmap.PAD_SLOT_ID


@pytest.mark.parametrize(
    ("tile", "block_size", "expected"),
    [
        pytest.param(1024, 16, 128, id="production-b16"),  # 64 blocks + 1 -> 128
        pytest.param(1024, 128, 16, id="production-b128"),  # 8 + 1 -> 16
        pytest.param(1024, 1, 2048, id="production-b1"),  # 1024 + 1 -> 2048
        pytest.param(16, 16, 2, id="tile-is-one-block"),  # 1 + 1 -> 2
        pytest.param(16, 4, 8, id="tile16-b4"),  # 4 + 1 -> 8
        pytest.param(16, 5, 8, id="tile16-b5"),  # ceil(16 / 5) = 4, + 1 -> 8
        pytest.param(64, 48, 4, id="tile64-b48"),  # ceil(64 / 48) = 2, + 1 -> 4
        pytest.param(16, 128, 2, id="block-bigger-than-tile"),  # 1 + 1 -> 2
    ],
)
def test_window_size_by_hand(tile: int, block_size: int, expected: int) -> None:
    assert slotmap.window_size(tile, block_size) == expected


@given(tile=st.sampled_from((1, 2, 16, 32, 64, 1024)), block_size=st.integers(1, 300))
def test_window_covers_any_contiguous_tile(tile: int, block_size: int) -> None:
    # A tile of contiguous positions starting at any offset inside a block spans at most
    # ceil(tile / block_size) + 1 blocks: the window holds that many, in a power of two.
    window = slotmap.window_size(tile, block_size)
    assert window & (window - 1) == 0
    worst = max(((start + tile - 1) // block_size) + 1 for start in range(block_size))
    assert worst <= window
    assert window < 2 * (-(-tile // block_size) + 1)  # and is the smallest such power of two


def test_a_tile_can_span_one_more_block_than_it_covers() -> None:
    # Why the + 1: 16 positions starting at 2 touch blocks 0..4 of size 4, five blocks, while
    # ceil(16 / 4) = 4. A window of 4 would miss block 4.
    blocks = {p // 4 for p in range(2, 18)}
    assert len(blocks) == 5 > -(-16 // 4)


@pytest.mark.parametrize("validate", [True, False], ids=["validated", "unvalidated"])
@pytest.mark.parametrize("gather_as_float", [False, True], ids=["int", "float"])
def test_tile_starting_mid_block(validate: bool, gather_as_float: bool) -> None:
    # Two requests of 16 and 40 tokens starting mid-block with tile 16 and block 4: every tile
    # spans five blocks. Expected by the plain formula.
    rows = [[11, 3, 7, 1, 9, 4, 0, 2, 13, 5, 6, 8, 10, 12, 14], [20 + b for b in range(15)]]
    positions = [list(range(2, 18)), list(range(1, 41))]
    expected = [rows[q][p // 4] * 4 + p % 4 for q in range(2) for p in positions[q]]
    flat = [p for pos in positions for p in pos]
    actual = slotmap.compute_slot_mapping(
        qsl_of([16, 40]),
        tensor(flat, torch.int64),
        tensor(rows, torch.int32),
        4,
        tile_size=16,
        validate=validate,
        num_tokens=56,
        gather_as_float=gather_as_float,
    )
    assert_slots_equal(actual, expected)


@given(
    lengths=st.lists(st.integers(0, 70), min_size=1, max_size=3),
    block_size=st.sampled_from(BLOCK_SIZES),
    tile=st.sampled_from(TILES),
    seed=st.integers(0, 2**32 - 1),
)
def test_contiguous_positions_always_pass_the_precondition(lengths, block_size, tile, seed):
    # The validator accepts every contiguous batch, and the kernel then agrees with the oracle.
    case = make_case(lengths, block_size, seed=seed, order="contiguous")
    actual = case.run(slotmap.compute_slot_mapping, tile_size=tile)
    assert_slots_equal(actual, case.expected())


def far_apart(**options):
    # One request, one tile: logical blocks 0 and 100 (block 1), window 32 for tile 16.
    qsl = qsl_of([3])
    positions = tensor([0, 100, 1], torch.int64)
    table = tensor([list(range(500, 700))], torch.int32)
    return (qsl, positions, table, 1), options


@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(slotmap.compute_slot_mapping, id="window"),
        pytest.param(partial(fused_single_group, token_parallel=False), id="fused"),
    ],
)
def test_precondition_violation_is_reported(launcher) -> None:
    args, options = far_apart()
    with pytest.raises(
        ValueError, match=r"request 0, tokens 0 and 1: logical blocks 0 and 100 .*tile of 16"
    ):
        launcher(*args, tile_size=16, **options)


@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(
            partial(slotmap.compute_slot_mapping_direct, token_parallel=False),
            id="direct-requests",
        ),
        pytest.param(
            partial(slotmap.compute_slot_mapping_direct, token_parallel=True), id="direct-tokens"
        ),
        pytest.param(partial(fused_single_group, token_parallel=True), id="fused-tokens"),
    ],
)
def test_per_lane_loads_have_no_precondition(launcher) -> None:
    args, options = far_apart()
    assert_slots_equal(launcher(*args, tile_size=16), [500, 600, 501])


def test_a_big_enough_tile_window_fits() -> None:
    # The same positions with the production tile: window 2048 holds blocks 0..100.
    args, _ = far_apart()
    assert_slots_equal(slotmap.compute_slot_mapping(*args), [500, 600, 501])


def test_precondition_violation_in_a_later_request_and_tile() -> None:
    # Request 1's third tile of 16 (batch tokens 40..43) holds blocks 32, 33, 34 and 90.
    positions = list(range(8)) + list(range(35)) + [90]
    qsl = qsl_of([8, 36])
    table = tensor([list(range(100)), list(range(100, 200))], torch.int32)
    with pytest.raises(ValueError, match=r"request 1, tokens 40 and 43: logical blocks 32 and 90"):
        slotmap.compute_slot_mapping(qsl, tensor(positions, torch.int64), table, 1, tile_size=16)


@pytest.mark.parametrize(
    ("positions", "rank", "message"),
    [
        pytest.param([0, 201], 0, None, id="far-token-on-other-rank"),
        pytest.param([0, 201], 1, None, id="only-far-token-local"),
        pytest.param([0, 200], 0, r"logical blocks 0 and 100", id="both-local"),
    ],
)
def test_precondition_counts_only_local_lanes(positions, rank: int, message) -> None:
    # CP W 2, interleave 1, block 1: rank r owns positions of parity r. Position 200 is
    # rank 0's local position 100 -> block 100; 201 is rank 1's block 100.
    args = (qsl_of([2]), tensor(positions, torch.int64), tensor([range(128)], torch.int32), 1)
    options = dict(cp_world_size=2, cp_rank=rank, tile_size=16)
    if message:
        with pytest.raises(ValueError, match=message):
            slotmap.compute_slot_mapping(*args, **options)
    else:
        expected = slotmap.slot_mapping_oracle(*args, cp_world_size=2, cp_rank=rank)
        assert_slots_equal(slotmap.compute_slot_mapping(*args, **options), expected)


@pytest.mark.parametrize("tile", [16, 1024])
def test_tile_without_valid_lanes(tile: int) -> None:
    # A tile whose tokens all belong to another rank (or are a circular tail) still loads a
    # harmless window and pads every lane.
    other_rank = slotmap.compute_slot_mapping(
        qsl_of([4]),
        tensor([1, 3, 5, 7], torch.int64),
        tensor([[9]], torch.int32),
        1,
        cp_world_size=2,
        cp_rank=0,
        tile_size=tile,
    )
    assert_slots_equal(other_rank, [PAD] * 4)
    tail = slotmap.compute_slot_mapping(
        qsl_of([3]),
        tensor([-3, -2, -1], torch.int64),
        tensor([[9]], torch.int32),
        4,
        circular=True,
        tile_size=tile,
    )
    assert_slots_equal(tail, [PAD] * 3)


@given(case=slot_mapping_cases(), tile=st.sampled_from(TILES))
def test_window_trace_records_each_tiles_window_base(case, tile: int) -> None:
    # The teaching trace (lesson 03) must show what the kernel really loaded: every tile's
    # window base matches the reference's, tiles that do not exist stay untouched, and the
    # slots do not change when tracing is on.
    options = {k: v for k, v in case.options.items() if k not in ("out",)}
    lengths = (case.query_start_loc[1:] - case.query_start_loc[:-1]).tolist()
    width = max([-(-n // tile) for n in lengths], default=0) + 1
    trace = torch.full((len(lengths), width), -777, dtype=torch.int32, device=slotmap.DEVICE)
    traced = case.run(slotmap.compute_slot_mapping, tile_size=tile, window_trace=trace)
    assert_slots_equal(traced, case.run(slotmap.slot_mapping_oracle))
    expected = slotmap.window_bases_oracle(
        case.query_start_loc,
        case.positions,
        case.block_size,
        tile_size=tile,
        **{
            k: v
            for k, v in options.items()
            if k
            in ("kv_cache_block_size", "cp_world_size", "cp_rank", "cp_interleave", "circular")
        },
    )
    for request, bases in enumerate(expected):
        padded = bases + [-777] * (width - len(bases))
        assert trace[request].tolist() == padded, f"request {request}"


def test_window_trace_must_have_one_row_per_request() -> None:
    case = make_case([5, 3], 4)
    with pytest.raises(ValueError, match="one row per request"):
        slotmap.compute_slot_mapping(
            *case.args(), window_trace=torch.zeros((3, 2), dtype=torch.int32)
        )
    with pytest.raises(ValueError, match="2-D int32"):
        slotmap.compute_slot_mapping(
            *case.args(), window_trace=torch.zeros((2, 2), dtype=torch.int64)
        )
