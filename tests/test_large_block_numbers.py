"""Block numbers above 2**24 are exact, with the float gather and without.

float32 holds integers exactly only up to 2**24: a kernel that gathers the int32 window as
float32 (as one production kernel does) corrupts larger block numbers. Ours splits each entry
into exact 16-bit halves. The largest block of each case is the largest whose slots all fit
in int32 (with block 1 and 16 its last slot is exactly INT32_MAX).
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_slots_equal, call_guarded, fused_single_group, qsl_of, tensor

import slotmap

INT32_MAX = 2**31 - 1

CASES = [
    pytest.param(1, [2**24 + 1, 2**30 + 7, 2**31 - 1, 2**24 - 1], id="block1"),
    pytest.param(16, [2**24 + 1, 2**31 // 16 - 1, 2**24 + 3], id="block16"),
    pytest.param(3, [2**24 + 1, (2**31 - 1) // 3 - 1, 2**25 + 5], id="block3"),
    pytest.param(48, [2**24 + 7, 2**31 // 48 - 1], id="block48"),
]
LAUNCHERS = [
    pytest.param(slotmap.compute_slot_mapping, {"gather_as_float": True}, id="window-float"),
    pytest.param(slotmap.compute_slot_mapping, {"gather_as_float": False}, id="window-int"),
    pytest.param(slotmap.compute_slot_mapping, {"tile_size": 16}, id="window-default-tile16"),
    pytest.param(slotmap.compute_slot_mapping_direct, {}, id="direct"),
    pytest.param(fused_single_group, {"gather_as_float": True}, id="fused-float"),
    pytest.param(fused_single_group, {"gather_as_float": False}, id="fused-int"),
    pytest.param(slotmap.slot_mapping_oracle, {}, id="oracle"),
    pytest.param(slotmap.slot_mapping_torch, {}, id="torch"),
]


def test_float32_really_loses_these_numbers() -> None:
    # Without this, the cases below could pass with the production float cast too.
    values = torch.tensor([2**24 + 1, 2**30 + 7, 2**31 - 129], dtype=torch.int32)
    assert not torch.equal(values.to(torch.float32).to(torch.int64), values.to(torch.int64))


@pytest.mark.parametrize(("launcher", "options"), LAUNCHERS)
@pytest.mark.parametrize(("block_size", "blocks"), CASES)
@pytest.mark.parametrize("out_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_large_block_numbers_are_exact(launcher, options, block_size, blocks, out_dtype):
    # One request walks every position of every block in its row; expected by hand.
    n = block_size * len(blocks)
    expected = [blocks[p // block_size] * block_size + p % block_size for p in range(n)]
    assert max(expected) <= INT32_MAX
    actual = call_guarded(
        launcher,
        qsl_of([n]),
        tensor(range(n), torch.int64),
        tensor([blocks], torch.int32),
        block_size,
        out_shape=n,
        out_dtype=out_dtype,
        **options,
    )
    assert_slots_equal(actual, expected)


@pytest.mark.parametrize("gather_as_float", [True, False], ids=["float", "int"])
def test_largest_slot_under_context_parallelism(gather_as_float: bool) -> None:
    # W 2, interleave 1, block 16: rank 1 owns odd positions; its last local position of
    # virtual block 0 (position 31) is offset 15 of its block 0.
    block = 2**31 // 16 - 1
    actual = slotmap.compute_slot_mapping(
        qsl_of([2]),
        tensor([30, 31], torch.int64),
        tensor([[block]], torch.int32),
        16,
        cp_world_size=2,
        cp_rank=1,
        gather_as_float=gather_as_float,
    )
    assert_slots_equal(actual, [slotmap.PAD_SLOT_ID, INT32_MAX])


@pytest.mark.parametrize("gather_as_float", [True, False], ids=["float", "int"])
def test_large_block_numbers_in_a_circular_group(gather_as_float: bool) -> None:
    actual = slotmap.compute_slot_mapping(
        qsl_of([3]),
        tensor([-1, 5, 17], torch.int64),
        tensor([[2**24 + 9]], torch.int32),
        16,
        circular=True,
        gather_as_float=gather_as_float,
    )
    base = (2**24 + 9) * 16
    assert_slots_equal(actual, [slotmap.PAD_SLOT_ID, base + 5, base + 1])


WIDE_LAUNCHERS = [
    *LAUNCHERS,
    pytest.param(
        slotmap.compute_slot_mapping_direct,
        {"token_parallel": True, "tile_size": 16},
        id="direct-token-grid",
    ),
    pytest.param(fused_single_group, {"token_parallel": True}, id="fused-token-grid"),
    pytest.param(fused_single_group, {"lane_loads": True}, id="fused-lane-loads"),
]


@pytest.mark.parametrize("validate", [True, False], ids=["validated", "unvalidated"])
@pytest.mark.parametrize(("launcher", "options"), WIDE_LAUNCHERS)
def test_an_int64_out_holds_slots_past_int32(launcher, options, validate) -> None:
    # Block 20,000,000 of 128 tokens: slots from 2,560,000,000, past INT32_MAX, as an engine
    # with a large pool and an int64 slot mapping (vLLM's) would compute them.
    block_size, blocks = 128, [20_000_000, 3, 2**31 - 1]
    n = block_size * len(blocks)
    expected = [blocks[p // block_size] * block_size + p % block_size for p in range(n)]
    assert max(expected) > INT32_MAX
    actual = call_guarded(
        launcher,
        qsl_of([n]),
        tensor(range(n), torch.int64),
        tensor([blocks], torch.int32),
        block_size,
        out_shape=n,
        out_dtype=torch.int64,
        num_tokens=n,
        validate=validate,
        **options,
    )
    assert_slots_equal(actual, expected)


def test_an_int32_out_still_refuses_a_slot_past_int32() -> None:
    # The int64 path must not loosen the int32 one: the check names the overflow.
    with pytest.raises(ValueError, match=r"overflows int32 \(an int64 out holds it\)"):
        slotmap.compute_slot_mapping(
            qsl_of([1]), tensor([0], torch.int64), tensor([[20_000_000]], torch.int32), 128
        )
