"""slotmap.cp's pure helpers agree with the reference, and a rank's positions are packed.

``owner_of``, ``local_position`` and ``local_length`` answer "who stores position p, where,
and how many positions does rank r hold" (lessons 05 and 07). They must agree with
``slotmap.reference.token_block_and_offset``, the definition, for every configuration the
launchers accept and also for the ones they reject.
"""

from __future__ import annotations

import pytest
from conftest import divisors
from hypothesis import given
from hypothesis import strategies as st

from slotmap.cp import (
    CPBatch,
    expected_slots,
    local_layout,
    local_length,
    local_position,
    owner_of,
)
from slotmap.reference import token_block_and_offset


@st.composite
def configs(draw, valid: bool = True):
    """(W, I, kv_cache_block_size); ``valid``: I divides the kv block, as launchers require."""
    kv = draw(st.sampled_from((1, 2, 3, 4, 6, 8, 16)))
    world = draw(st.integers(1, 5))
    interleave = draw(st.sampled_from(divisors(kv)) if valid else st.integers(1, 2 * kv + 1))
    return world, interleave, kv


def located(p: int, world: int, rank: int, interleave: int, kv: int):
    return token_block_and_offset(
        p, kv, kv_cache_block_size=kv, cp_world_size=world, cp_rank=rank, cp_interleave=interleave
    )


@given(config=configs(valid=False), seq_len=st.integers(0, 120))
def test_local_length_counts_the_positions_the_reference_gives_each_rank(config, seq_len):
    world, interleave, kv = config
    for rank in range(world):
        stored = sum(located(p, world, rank, interleave, kv) is not None for p in range(seq_len))
        assert local_length(seq_len, world, rank, interleave, kv) == stored


@given(config=configs(valid=False), seq_len=st.integers(0, 80))
def test_every_position_has_exactly_one_owner(config, seq_len):
    world, interleave, kv = config
    lengths = [local_length(seq_len, world, r, interleave, kv) for r in range(world)]
    assert sum(lengths) == seq_len
    for p in range(seq_len):
        owners = [r for r in range(world) if located(p, world, r, interleave, kv) is not None]
        assert owners == [owner_of(p, world, interleave, kv)]


@given(config=configs(), first=st.integers(0, 60), length=st.integers(0, 60))
def test_a_rank_packs_its_positions_contiguously(config, first, length):
    # The lesson's claim: the positions rank r stores, in order, sit at local positions
    # local_length(first) .. local_length(first + length) - 1: a contiguous run, no holes.
    world, interleave, kv = config
    for rank in range(world):
        mine = [
            local_position(p, world, interleave, kv)
            for p in range(first, first + length)
            if owner_of(p, world, interleave, kv) == rank
        ]
        start = local_length(first, world, rank, interleave, kv)
        assert mine == list(
            range(start, local_length(first + length, world, rank, interleave, kv))
        )


@given(config=configs(), p=st.integers(0, 300))
def test_with_a_valid_configuration_the_owner_is_the_segment_round_robin(config, p):
    world, interleave, kv = config
    assert owner_of(p, world, interleave, kv) == (p // interleave) % world


@given(config=configs(), p=st.integers(0, 300), per=st.sampled_from((1, 2, 4)))
def test_local_position_gives_the_reference_block_and_offset(config, p, per):
    # With hybrid blocks (kv = per * block_size) too: (b, o) = divmod(local position, block).
    world, interleave, kv = config
    kv, block = kv * per, kv
    rank = owner_of(p, world, interleave, kv)
    expected = token_block_and_offset(
        p,
        block,
        kv_cache_block_size=kv,
        cp_world_size=world,
        cp_rank=rank,
        cp_interleave=interleave,
    )
    assert divmod(local_position(p, world, interleave, kv), block) == expected


def test_the_rejected_configuration_puts_two_positions_in_one_place():
    # docs/semantics.md §2: kv 4, W 2, I 8: positions 4 and 8 both land on rank 0 at local
    # position 4.
    assert owner_of(4, 2, 8, 4) == owner_of(8, 2, 8, 4) == 0
    assert local_position(4, 2, 8, 4) == local_position(8, 2, 8, 4) == 4
    assert local_length(16, 2, 1, 8, 4) == 0  # rank 1 stores nothing at all


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param((5, 2, 2, 1, 4), "rank 2 is not a rank of a world of 2", id="rank"),
        pytest.param((5, 0, 0, 1, 4), "must be >= 1", id="world"),
        pytest.param((-1, 2, 0, 1, 4), "seq_len must be >= 0", id="seq_len"),
    ],
)
def test_local_length_rejects_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        local_length(*args)


def test_a_batch_reads_back_through_each_ranks_block_table():
    # Without the kernel: the oracle's slots, read back through the inverse block table, give
    # the local positions local_position predicts, on the owner only.
    batch = CPBatch((13, 1, 6), 2, 4, 3, 2, starts=(0, 21, 5), max_num_tokens=23)
    for rank in range(3):
        slots = expected_slots(batch, rank)
        assert slots[batch.num_tokens :] == [-1, -1, -1]
        local = local_layout(slots, batch, batch.block_table(rank))
        for token, p in enumerate(batch.positions):
            mine = owner_of(p, 3, 2, 4) == rank
            assert local[token] == (local_position(p, 3, 2, 4) if mine else -1)


@given(config=configs(valid=False), p=st.integers(0, 300), per=st.sampled_from((1, 2, 3)))
def test_the_five_steps_end_where_the_reference_does(config, p, per):
    from slotmap.cp import five_steps

    world, interleave, kv = config
    steps = five_steps(p, kv, kv * per, world, interleave)
    assert steps.owner == owner_of(p, world, interleave, kv * per)
    expected = token_block_and_offset(
        p,
        kv,
        kv_cache_block_size=kv * per,
        cp_world_size=world,
        cp_rank=steps.owner,
        cp_interleave=interleave,
    )
    assert (steps.block, steps.offset) == expected
