"""Hybrid blocks: a physical KV block of ``blocks_per_kv_block`` attention blocks.

``expand_block_table`` turns a table of physical KV blocks into a table of attention blocks;
the slot mapping then uses ``block_size`` = the attention block and ``kv_cache_block_size``
= the physical one. Whichever way a block is described, a token's KV must land in the same
place in memory.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import DEVICE, assert_slots_equal, divisors, make_case, tensor
from hypothesis import given
from hypothesis import strategies as st

import slotmap


def test_expand_block_table_by_hand() -> None:
    table = tensor([[3, 1], [0, 5]], torch.int32)
    expanded = slotmap.expand_block_table(table, 4)
    assert expanded.dtype == torch.int32 and expanded.is_contiguous()
    assert expanded.tolist() == [[12, 13, 14, 15, 4, 5, 6, 7], [0, 1, 2, 3, 20, 21, 22, 23]]


def test_expand_by_one_is_the_identity() -> None:
    table = tensor([[3, 1], [0, 5]], torch.int32)
    assert torch.equal(slotmap.expand_block_table(table, 1), table)


def test_expand_a_table_without_rows() -> None:
    # A batch without requests may come with a block table of zero rows.
    empty = torch.empty(0, 3, dtype=torch.int32, device=DEVICE)
    expanded = slotmap.expand_block_table(empty, 4)
    assert expanded.shape == (0, 12)


def test_expand_rejects_a_factor_below_one() -> None:
    with pytest.raises(ValueError, match=r"blocks_per_kv_block must be >= 1, got 0"):
        slotmap.expand_block_table(tensor([[1]], torch.int32), 0)


LAUNCHERS = [
    pytest.param(slotmap.slot_mapping_oracle, {}, id="oracle"),
    pytest.param(slotmap.compute_slot_mapping, {"tile_size": 16}, id="window-tile16"),
    pytest.param(slotmap.compute_slot_mapping, {}, id="window"),
    pytest.param(slotmap.compute_slot_mapping_direct, {}, id="direct"),
]


@pytest.mark.parametrize(("launcher", "options"), LAUNCHERS)
@given(
    block_size=st.sampled_from((1, 2, 3, 16)),
    blocks_per_kv_block=st.sampled_from((2, 3, 4)),
    world=st.integers(1, 3),
    data=st.data(),
)
def test_hybrid_blocks_put_every_token_where_whole_kv_blocks_do(
    launcher, options, block_size: int, blocks_per_kv_block: int, world: int, data
) -> None:
    # Attention block k * B + j holds tokens (k * B + j) * bs + o = k * kv + j * bs + o of
    # physical block k: the slot is the same as with block_size = kv and the unexpanded
    # table, on every rank.
    kv = block_size * blocks_per_kv_block
    interleave = data.draw(st.sampled_from(divisors(kv)), label="interleave")
    rank = data.draw(st.integers(0, world - 1), label="rank")
    lengths = data.draw(st.lists(st.integers(0, 40), min_size=1, max_size=3), label="lengths")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    cp = {"cp_world_size": world, "cp_rank": rank, "cp_interleave": interleave}
    whole = make_case(lengths, kv, seed=seed, **cp)  # one attention block per kv block
    whole.options.setdefault("kv_cache_block_size", kv)
    kv_table = whole.block_table
    hybrid = dataclasses.replace(
        whole,
        block_table=slotmap.expand_block_table(kv_table, blocks_per_kv_block),
        block_size=block_size,
        options=dict(whole.options, kv_cache_block_size=kv),
    )
    assert_slots_equal(hybrid.run(launcher, **options), whole.run(launcher, **options))


def test_expanding_a_block_number_past_int32_is_refused_not_wrapped():
    largest_ok = (2**31 - 1 - 3) // 4  # 4 * k + 3 is still an int32
    table = torch.tensor([[largest_ok]], dtype=torch.int32)
    expanded = slotmap.expand_block_table(table, 4).tolist()
    assert expanded == [[4 * largest_ok + j for j in range(4)]]
    with pytest.raises(ValueError, match=r"physical block 1073741824: .* int32's largest value"):
        slotmap.expand_block_table(torch.tensor([[1, 2**30]], dtype=torch.int32), 4)
