"""Multi-group slot mapping: ``compute_slot_mappings`` against ``slot_mappings_oracle``.

One launch for all KV-cache groups: each group has its own block table, block size and
circular flag; ``idx_mapping`` sends request q to row ``idx_mapping[q]`` of every table.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    MULTI_GROUP_MODES,
    MultiCase,
    assert_slots_equal,
    call_guarded,
    multi_group_cases,
    qsl_of,
    tensor,
)
from hypothesis import given
from hypothesis import strategies as st

import slotmap

PAD = slotmap.PAD_SLOT_ID
MODES = pytest.mark.parametrize("mode", [pytest.param(m, id=m) for m in MULTI_GROUP_MODES])
MULTI_GROUP = {
    "oracle": lambda: slotmap.slot_mappings_oracle,
    "torch": lambda: slotmap.slot_mappings_torch,
    "fused": lambda: slotmap.compute_slot_mappings,
}
IMPLEMENTATIONS = pytest.mark.parametrize(
    "impl_name", [pytest.param(name, id=name) for name in MULTI_GROUP]
)


def two_groups(use_idx_mapping: bool) -> MultiCase:
    # Group 0: block 4, rows [7, 2] and [5, 1]. Group 1: a ring of one block of 2 (circular),
    # rows [3] and [6]. Request 0 has positions 0..5, request 1 positions 2..4; two pads.
    options = {"circular": [False, True], "max_num_tokens": 11}
    if use_idx_mapping:
        options["idx_mapping"] = tensor([1, 0], torch.int32)  # the requests swap rows
    return MultiCase(
        qsl_of([6, 3]),
        tensor([0, 1, 2, 3, 4, 5, 2, 3, 4], torch.int64),
        [tensor([[7, 2], [5, 1]], torch.int32), tensor([[3], [6]], torch.int32)],
        [4, 2],
        options,
    )


TWO_GROUPS = [
    28,
    29,
    30,
    31,
    8,
    9,
    22,
    23,
    4,
    PAD,
    PAD,
    6,
    7,
    6,
    7,
    6,
    7,
    12,
    13,
    12,
    PAD,
    PAD,
]
TWO_GROUPS_SWAPPED = [
    20,
    21,
    22,
    23,
    4,
    5,
    30,
    31,
    8,
    PAD,
    PAD,
    12,
    13,
    12,
    13,
    12,
    13,
    6,
    7,
    6,
    PAD,
    PAD,
]


@IMPLEMENTATIONS
@pytest.mark.parametrize(
    ("use_idx_mapping", "expected"),
    [
        pytest.param(False, TWO_GROUPS, id="rows-in-order"),
        pytest.param(True, TWO_GROUPS_SWAPPED, id="idx-mapping-swaps"),
    ],
)
def test_two_groups_by_hand(impl_name: str, use_idx_mapping: bool, expected) -> None:
    case = two_groups(use_idx_mapping)
    actual = case.run(MULTI_GROUP[impl_name]())
    assert_slots_equal(actual, torch.tensor(expected).view(2, 11), impl_name)


@IMPLEMENTATIONS
def test_long_prefill_beside_decodes(impl_name: str) -> None:
    # One 5000-token prefill and three decodes: the adaptive launcher picks a big tile and
    # spreads the prefill over parallel programs. Expected by the plain formula.
    lengths = [1, 5000, 1, 1]
    firsts = [40, 3, 17, 0]
    positions = [list(range(f, f + n)) for f, n in zip(firsts, lengths, strict=True)]
    sizes = [16, 48]
    tables, expected = [], []
    for g, bs in enumerate(sizes):
        width = (5003 // bs) + 1
        rows = [[(q * width + b) * 7 % 100003 + g for b in range(width)] for q in range(4)]
        tables.append(tensor(rows, torch.int32))
        expected.append([rows[q][p // bs] * bs + p % bs for q in range(4) for p in positions[q]])
    flat = [p for pos in positions for p in pos]
    case = MultiCase(qsl_of(lengths), tensor(flat, torch.int64), tables, sizes, {})
    assert_slots_equal(case.run(MULTI_GROUP[impl_name]()), torch.tensor(expected), impl_name)


@IMPLEMENTATIONS
def test_no_requests_pads_every_group(impl_name: str) -> None:
    tables = [tensor([[0]], torch.int32), tensor([[0]], torch.int32)]
    case = MultiCase(qsl_of([]), tensor([], torch.int64), tables, [4, 16], {"max_num_tokens": 3})
    assert_slots_equal(case.run(MULTI_GROUP[impl_name]()), torch.full((2, 3), PAD))


def test_rows_agree_with_single_group_oracle() -> None:
    # Row g of the multi-group result is group g's single-group slot mapping.
    case = two_groups(use_idx_mapping=True)
    rows = case.options["idx_mapping"].long()
    multi = case.run(slotmap.slot_mappings_oracle)
    for g, (table, bs) in enumerate(zip(case.block_tables, case.block_sizes, strict=True)):
        single = slotmap.slot_mapping_oracle(
            case.query_start_loc,
            case.positions,
            table[rows].contiguous(),
            bs,
            circular=case.options["circular"][g],
            max_num_tokens=11,
        )
        assert_slots_equal(multi[g], single, f"group {g}")


@MODES
@given(data=st.data())
def test_torch_reference_matches_oracle(mode: str, data) -> None:
    orders = ("contiguous", "tile-shuffled", "shuffled", "scattered")
    case = data.draw(multi_group_cases(mode, orders=orders), label="case")
    assert_slots_equal(
        case.run(slotmap.slot_mappings_torch), case.run(slotmap.slot_mappings_oracle)
    )


@MODES
@given(
    data=st.data(),
    tile=st.sampled_from((None, 16, 32, 64, 1024)),
    parallel_tiles=st.sampled_from((None, 1, 2, 3)),
    # The request grid's gathers: the backend's default, the window's two, one load a lane.
    gather=st.sampled_from(
        (
            {},
            {"gather_as_float": True},
            {"gather_as_float": False},
            {"lane_loads": False},
            {"lane_loads": True},
        )
    ),
)
def test_fused_kernel_matches_oracle(
    mode: str, data, tile: int | None, parallel_tiles: int | None, gather: dict
) -> None:
    # The adaptive tile is a power of two >= 16: shuffling inside 16-token chunks keeps every
    # tile's positions contiguous, whatever tile the launcher picks.
    case = data.draw(multi_group_cases(mode, chunk=tile or 16), label="case")
    actual = case.run(
        slotmap.compute_slot_mappings, tile_size=tile, parallel_tiles=parallel_tiles, **gather
    )
    assert_slots_equal(actual, case.run(slotmap.slot_mappings_oracle))


@given(case=multi_group_cases(), out_int64=st.booleans())
def test_fused_kernel_without_validation_matches_oracle(case: MultiCase, out_int64: bool) -> None:
    dtype = torch.int64 if out_int64 else torch.int32
    expected = case.run(slotmap.slot_mappings_oracle)
    options = dict(case.options, num_tokens=case.num_tokens)
    actual = call_guarded(
        slotmap.compute_slot_mappings,
        *case.args(),
        out_shape=case.out_shape,
        out_dtype=dtype,
        validate=False,
        **options,
    )
    assert_slots_equal(actual, expected)


@pytest.mark.parametrize("parallel_tiles", [1, 3, 64])
def test_long_padding_tail_shared_by_parallel_programs(parallel_tiles: int) -> None:
    # 3 tokens, 5000 outputs: the padding programs share the tail tile by tile.
    case = MultiCase(
        qsl_of([3]),
        tensor([0, 1, 2], torch.int64),
        [tensor([[5]], torch.int32)],
        [4],
        {"max_num_tokens": 5000},
    )
    actual = case.run(slotmap.compute_slot_mappings, tile_size=16, parallel_tiles=parallel_tiles)
    assert_slots_equal(actual, torch.tensor([[20, 21, 22] + [PAD] * 4997]))


@st.composite
def cases_with_stale_dummies(draw: st.DrawFn) -> MultiCase:
    """A valid case whose requests read rows through idx_mapping (int32 or int64), some of them
    dummies (-1) whose tokens hold stale positions: 0, inside the row, or far past it."""
    case = draw(multi_group_cases(chunk=16), label="case")
    num_reqs = case.query_start_loc.numel() - 1
    rows = min(t.shape[0] for t in case.block_tables)
    chosen = draw(st.permutations(range(rows)))[:num_reqs]
    dummy = draw(st.lists(st.booleans(), min_size=num_reqs, max_size=num_reqs))
    dtype = draw(st.sampled_from((torch.int32, torch.int64)))
    idx = [-1 if d else r for r, d in zip(chosen, dummy, strict=True)]
    widest = max(
        t.shape[1] * bs for t, bs in zip(case.block_tables, case.block_sizes, strict=True)
    )
    stale = st.one_of(st.just(0), st.integers(0, widest), st.integers(widest, 2**31 - 1))
    positions = case.positions.clone().cpu()
    starts = case.query_start_loc.tolist()
    for q in (q for q in range(num_reqs) if dummy[q]):
        for t in range(starts[q], starts[q + 1]):
            positions[t] = draw(stale)
    options = dict(case.options, idx_mapping=tensor(idx, dtype))
    return MultiCase(
        case.query_start_loc,
        positions.to(case.positions.device),
        case.block_tables,
        case.block_sizes,
        options,
    )


@given(
    case=cases_with_stale_dummies(),
    grid=st.sampled_from(
        (
            {"token_parallel": True},
            {"token_parallel": False, "lane_loads": False},
            {"token_parallel": False, "lane_loads": True},
            {"parallel_tiles": 2},
        )
    ),
    validate=st.booleans(),
)
def test_dummy_requests_with_stale_positions_get_pad_on_every_grid(
    case: MultiCase, grid: dict, validate: bool
) -> None:
    # A dummy request owns no blocks: PAD in every group wherever its positions point.
    expected = case.run(slotmap.slot_mappings_oracle)
    num_reqs = case.query_start_loc.numel() - 1
    starts = case.query_start_loc.tolist()
    dummies = [q for q in range(num_reqs) if int(case.options["idx_mapping"][q]) < 0]
    for q in dummies:
        pad = case.options.get("pad_id", PAD)
        assert torch.all(expected[:, starts[q] : starts[q + 1]].cpu() == pad)
    options = dict(case.options) if validate else dict(case.options, num_tokens=case.num_tokens)
    actual = call_guarded(
        slotmap.compute_slot_mappings,
        *case.args(),
        out_shape=case.out_shape,
        validate=validate,
        **grid,
        **options,
    )
    assert_slots_equal(actual, expected)
