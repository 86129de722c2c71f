"""The context-parallel partition invariant (docs/semantics.md §2).

For any position exactly one rank of ``0..W-1`` stores it, and on that rank distinct positions
of one request get distinct slots. It holds only when ``kv_cache_block_size % cp_interleave
== 0``; the launchers reject the other configurations.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import (
    TILES,
    Case,
    assert_slots_equal,
    divisors,
    fused_single_group,
    make_case,
    qsl_of,
    tensor,
)
from hypothesis import given
from hypothesis import strategies as st

import slotmap

PAD = slotmap.PAD_SLOT_ID


@st.composite
def cp_configs(draw):
    """(W, I, kv_cache_block_size, block_size) with I dividing the kv block."""
    block_size = draw(st.sampled_from((1, 2, 3, 4, 5, 16, 48)))
    kv_cache_block_size = block_size * draw(st.sampled_from((1, 2, 3, 4)))
    world = draw(st.integers(1, 5))
    interleave = draw(st.sampled_from(divisors(kv_cache_block_size)))
    return world, interleave, kv_cache_block_size, block_size


@given(config=cp_configs())
def test_each_position_has_one_owner_and_its_own_slot(config) -> None:
    # Formula level, on the oracle's token_slot: an identity block table makes the slot
    # block * block_size + offset, so distinct slots mean distinct (block, offset) pairs.
    world, interleave, kv, bs = config
    span = 3 * kv * world + 5  # three virtual blocks and a bit
    row = list(range(span // bs + 8))
    per_rank: list[list[int]] = []
    for rank in range(world):
        per_rank.append(
            [
                slotmap.token_slot(
                    p,
                    row,
                    bs,
                    kv_cache_block_size=kv,
                    cp_world_size=world,
                    cp_rank=rank,
                    cp_interleave=interleave,
                )
                for p in range(span)
            ]
        )
    for p in range(span):
        owners = [rank for rank in range(world) if per_rank[rank][p] != PAD]
        assert len(owners) == 1, f"position {p} is stored by ranks {owners}"
    for rank, slots in enumerate(per_rank):
        local = [s for s in slots if s != PAD]
        assert len(set(local)) == len(local), f"rank {rank}: two positions share a slot"


@st.composite
def cp_cases(draw, chunk: int = 16):
    world, interleave, kv, bs = draw(cp_configs())
    lengths = draw(st.lists(st.integers(0, 40), min_size=1, max_size=3))
    return make_case(
        lengths,
        bs,
        seed=draw(st.integers(0, 2**32 - 1)),
        order=draw(st.sampled_from(("contiguous", "tile-shuffled"))),
        chunk=chunk,
        blocks_per_kv_block=kv // bs,
        cp_world_size=world,
        cp_interleave=interleave,
        extra_tokens=draw(st.sampled_from((0, 3))),
        large_blocks=draw(st.booleans()),
    )


def on_rank(case: Case, rank: int) -> Case:
    options = dict(case.options, cp_rank=rank)
    if options.get("cp_world_size", 1) == 1:
        options.pop("cp_rank")
    return dataclasses.replace(case, options=options)


def assert_partition(case: Case, per_rank: list[torch.Tensor], what: str) -> None:
    stacked = torch.stack([slots.cpu() for slots in per_rank])  # [W, max_num_tokens]
    n = case.num_tokens
    owners = (stacked[:, :n] != PAD).sum(dim=0)
    bad = (owners != 1).nonzero().flatten().tolist()
    assert not bad, f"{what}: tokens {bad[:10]} have {owners[bad[:10]].tolist()} owners"
    assert torch.all(stacked[:, n:] == PAD), f"{what}: padding tail not padded on every rank"
    starts = case.query_start_loc.tolist()
    for rank, slots in enumerate(stacked):
        for q in range(len(starts) - 1):
            mine = slots[starts[q] : starts[q + 1]]
            mine = mine[mine != PAD].tolist()
            assert len(set(mine)) == len(mine), f"{what}: rank {rank}, request {q} reuses a slot"


IMPLEMENTATIONS = {
    "oracle": lambda tile: slotmap.slot_mapping_oracle,
    "window": lambda tile: lambda *a, **k: slotmap.compute_slot_mapping(*a, tile_size=tile, **k),
    "direct": lambda tile: slotmap.compute_slot_mapping_direct,
}


@pytest.mark.parametrize("impl_name", [pytest.param(n, id=n) for n in IMPLEMENTATIONS])
@given(data=st.data(), tile=st.sampled_from(TILES))
def test_every_rank_together_covers_each_token_once(impl_name: str, data, tile: int) -> None:
    # Kernel level: run the same batch on every rank; distinct physical blocks in the table.
    case = data.draw(cp_cases(chunk=tile), label="case")
    world = case.options.get("cp_world_size", 1)
    fn = IMPLEMENTATIONS[impl_name](tile)
    per_rank = [on_rank(case, rank).run(fn) for rank in range(world)]
    assert_partition(case, per_rank, impl_name)


@given(data=st.data())
def test_fused_kernel_every_rank_covers_each_token_once(data) -> None:
    # The multi-group launcher has no hybrid blocks: its physical block is the block size.
    world, interleave, bs, _ = data.draw(cp_configs(), label="config")
    case = data.draw(
        st.builds(
            make_case,
            st.lists(st.integers(0, 40), min_size=1, max_size=3),
            st.just(bs),
            seed=st.integers(0, 2**32 - 1),
            cp_world_size=st.just(world),
            cp_interleave=st.just(interleave),
        ),
        label="case",
    )
    per_rank = [on_rank(case, rank).run(fused_single_group) for rank in range(world)]
    assert_partition(case, per_rank, "fused")


# A configuration whose kv block is not a multiple of the interleave: on rank 0 of W 2 with
# interleave 8 and kv block 4 (= block 4), positions 4 and 8 both land in block 1, offset 0.
COLLIDING = {"kv_cache_block_size": 4, "cp_world_size": 2, "cp_interleave": 8}


def test_colliding_configuration_really_collides() -> None:
    # Without this, the rejection below could be rejecting a harmless configuration.
    row = list(range(8))
    slots = [slotmap.token_slot(p, row, 4, cp_rank=0, **COLLIDING) for p in (4, 8)]
    assert slots[0] == slots[1] == 1 * 4 + 0


@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(slotmap.compute_slot_mapping, id="window"),
        pytest.param(slotmap.compute_slot_mapping_direct, id="direct"),
        pytest.param(slotmap.slot_mapping_oracle, id="oracle"),
        pytest.param(slotmap.slot_mapping_torch, id="torch"),
    ],
)
@pytest.mark.parametrize("rank", [0, 1])
def test_colliding_configuration_is_rejected(launcher, rank: int) -> None:
    qsl, positions, table = (
        qsl_of([16]),
        tensor(range(16), torch.int64),
        tensor([range(8)], torch.int32),
    )
    with pytest.raises(
        ValueError, match=r"kv_cache_block_size 4 is not a multiple of cp_interleave 8"
    ):
        launcher(qsl, positions, table, 4, cp_rank=rank, **COLLIDING)


def test_colliding_configuration_is_rejected_by_fused_launcher() -> None:
    qsl, positions, table = (
        qsl_of([16]),
        tensor(range(16), torch.int64),
        tensor([range(8)], torch.int32),
    )
    with pytest.raises(ValueError, match=r"group 0: .*block_size|group 0: .*cp_interleave 8"):
        slotmap.compute_slot_mappings(
            qsl, positions, [table], [4], cp_world_size=2, cp_rank=0, cp_interleave=8
        )


def test_single_rank_is_the_plain_mapping() -> None:
    # W == 1: rank 0 owns everything and CP arguments change nothing.
    case = make_case([7, 9], 4, seed=3, blocks_per_kv_block=2)
    plain = case.run(slotmap.slot_mapping_oracle)
    with_cp = dataclasses.replace(
        case, options=dict(case.options, cp_world_size=1, cp_rank=0, cp_interleave=8)
    ).run(slotmap.slot_mapping_oracle)
    assert_slots_equal(with_cp, plain)
    assert bool((plain[: case.num_tokens] != PAD).all())
