"""Property tests: every single-group implementation agrees with the oracle, exactly.

Each mode (plain, hybrid, cp, cp-hybrid, circular) gets its own examples. Inside a mode the
cases (``conftest.slot_mapping_cases``) vary block sizes 1..128 incl. non-powers of two,
every CP rank and interleave, negative circular positions, empty requests, padding tails,
big block numbers, garbage positions past num_tokens and a custom pad_id. Tiles are small
(16, 32, 64) so a few dozen tokens already cross tiles, and the production 1024.
Outputs are poisoned and guarded.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import SINGLE_GROUP_MODES, TILES, assert_slots_equal, slot_mapping_cases
from hypothesis import given, note
from hypothesis import strategies as st

import slotmap

ANY_ORDER = ("contiguous", "tile-shuffled", "shuffled", "scattered")
MODES = pytest.mark.parametrize("mode", [pytest.param(m, id=m) for m in SINGLE_GROUP_MODES])


@MODES
@given(data=st.data())
def test_torch_reference_matches_oracle(mode: str, data) -> None:
    case = data.draw(slot_mapping_cases(mode, orders=ANY_ORDER), label="case")
    expected = case.expected()
    assert_slots_equal(case.run(slotmap.slot_mapping_torch), expected)
    # int64 out too: the same values, widened.
    assert_slots_equal(case.run(slotmap.slot_mapping_torch, torch.int64), expected)


@MODES
@given(data=st.data(), tile=st.sampled_from(TILES), gather_as_float=st.booleans())
def test_window_kernel_matches_oracle(mode: str, data, tile: int, gather_as_float: bool) -> None:
    # Positions may be shuffled inside each tile: the window precondition still holds.
    case = data.draw(slot_mapping_cases(mode, chunk=tile), label="case")
    note(f"window size {slotmap.window_size(tile, case.block_size)}")
    actual = case.run(
        slotmap.compute_slot_mapping, tile_size=tile, gather_as_float=gather_as_float
    )
    assert_slots_equal(actual, case.expected())


@MODES
@given(data=st.data(), tile=st.sampled_from(TILES))
def test_direct_kernel_matches_oracle(mode: str, data, tile: int) -> None:
    # No window: positions in any order, scattered far apart inside a request.
    case = data.draw(slot_mapping_cases(mode, orders=ANY_ORDER), label="case")
    actual = case.run(slotmap.compute_slot_mapping_direct, tile_size=tile)
    assert_slots_equal(actual, case.expected())


@MODES
@given(data=st.data(), out_int64=st.booleans())
def test_kernels_without_validation_match_oracle(mode: str, data, out_int64: bool) -> None:
    # validate=False on valid input (the hot path, num_tokens given: no sync) changes nothing.
    case = data.draw(slot_mapping_cases(mode), label="case")
    dtype = torch.int64 if out_int64 else torch.int32
    hot = dataclasses.replace(case, options=dict(case.options, num_tokens=case.num_tokens))
    expected = case.expected(dtype)
    for launcher in (slotmap.compute_slot_mapping, slotmap.compute_slot_mapping_direct):
        actual = hot.run(launcher, dtype, validate=False, tile_size=16)
        assert_slots_equal(actual, expected, launcher.__name__)
