"""Parity with production's newest multi-group slot mapping (docs/semantics.md §4).

Five per-group and per-request features, on the references and on every grid of the fused
kernel: ``slot_mapping_enabled`` (a group that maps no token and whose table is never read),
``dcp_sharded`` (context parallelism per group), ``kernel_block_sizes`` beside the allocation
``block_sizes``, dummy requests (``idx_mapping`` -1) and the padding that starts at the real
token count ``query_start_loc[num_reqs]`` rather than at a padded host count.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from conftest import (
    Guarded,
    assert_slots_equal,
    blocks_needed,
    call_guarded,
    make_block_table,
    make_positions,
    qsl_of,
    request_lengths,
    tensor,
)
from hypothesis import given
from hypothesis import strategies as st

import slotmap

PAD = slotmap.PAD_SLOT_ID
STALE = 4242  # a slot an earlier step left in a persistent output buffer

# The fused kernel's grids: request grid with the window (integer and float gathers), with
# one load a lane, and the token grid.
GRIDS = {
    "window": {"token_parallel": False, "lane_loads": False, "gather_as_float": False},
    "window-float": {"token_parallel": False, "lane_loads": False, "gather_as_float": True},
    "lane-loads": {"token_parallel": False, "lane_loads": True},
    "token-grid": {"token_parallel": True},
}
ON_EVERY_GRID = pytest.mark.parametrize("grid", list(GRIDS))


def poisoned_table(rows: int, width: int) -> torch.Tensor:
    # Entries no valid slot comes from: a kernel that reads it writes a negative slot.
    return tensor(
        [[-(10**6) - r * width - b for b in range(width)] for r in range(rows)], torch.int32
    )


@dataclass
class ParityCase:
    """One batch with per-group switches; ``options`` are the launcher's keywords."""

    query_start_loc: torch.Tensor
    positions: torch.Tensor
    block_tables: list[torch.Tensor | None]
    block_sizes: list[int]
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def out_shape(self) -> tuple[int, int]:
        real = int(self.query_start_loc[-1])
        return len(self.block_tables), self.options.get("max_num_tokens") or real

    def args(self) -> tuple:
        return self.query_start_loc, self.positions, self.block_tables, self.block_sizes

    def run(self, fn, **extra: Any) -> torch.Tensor:
        return call_guarded(fn, *self.args(), out_shape=self.out_shape, **self.options, **extra)


@st.composite
def parity_cases(draw: st.DrawFn, max_groups: int = 3) -> ParityCase:
    """A random valid batch mixing enabled and disabled, sharded and unsharded groups, kernel
    blocks inside allocation blocks, circular groups, dummy requests and a padded count."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    groups = draw(st.integers(1, max_groups))
    kv_sizes = draw(
        st.lists(st.sampled_from((2, 4, 6, 8, 16, 48)), min_size=groups, max_size=groups)
    )
    kernel_sizes = [
        draw(st.sampled_from([d for d in range(1, kv + 1) if kv % d == 0])) for kv in kv_sizes
    ]
    circular = [
        k == kv and draw(st.integers(0, 4)) == 0
        for k, kv in zip(kernel_sizes, kv_sizes, strict=True)
    ]
    enabled = [draw(st.integers(0, 3)) > 0 for _ in range(groups)]
    world = draw(st.sampled_from((1, 2, 2, 3, 4)))
    sharded = [not ring and draw(st.booleans()) for ring in circular]
    interleave = draw(st.sampled_from([d for d in range(1, 49) if math.gcd(*kv_sizes) % d == 0]))
    rank = draw(st.integers(0, world - 1))

    lengths = draw(request_lengths(4, 40))
    dummy = [draw(st.integers(0, 3)) == 0 for _ in lengths]
    firsts = [rng.randint(0, 3 * max(kv_sizes) * world) for _ in lengths]
    per_request = make_positions(
        rng, lengths, firsts, draw(st.sampled_from(("contiguous", "tile-shuffled")))
    )
    top = max((p for r, d in zip(per_request, dummy, strict=True) if not d for p in r), default=0)
    # A dummy request (CUDA-graph padding) holds stale positions: repeated 0s, or positions
    # far past every table row. It has no slot to collide on and reads no row.
    stale = draw(st.sampled_from((0, top + 1, 2**20, 2**31 - 3)))
    per_request = [
        [stale + (i % 3 if stale else 0) for i in range(len(p))] if d else p
        for p, d in zip(per_request, dummy, strict=True)
    ]
    flat = [p for request in per_request for p in request]

    tables: list[torch.Tensor | None] = []
    extra_rows = draw(st.integers(0, 2))
    for g in range(groups):
        blocks_per_kv = kv_sizes[g] // kernel_sizes[g]
        split = world if sharded[g] else 1
        if not enabled[g]:
            # Never read: absent, too small for any row, or poisoned.
            kind = draw(st.sampled_from(("none", "tiny", "poisoned")))
            tables.append(
                None
                if kind == "none"
                else poisoned_table(1 if kind == "tiny" else len(lengths) + extra_rows, 1 + top)
            )
            continue
        width = blocks_needed(top, kernel_sizes[g], blocks_per_kv, split, circular[g])
        tables.append(
            make_block_table(
                rng,
                len(lengths) + extra_rows,
                width + rng.randint(0, 2),
                kernel_sizes[g],
                blocks_per_kv,
            )
        )

    options: dict[str, Any] = dict(
        kernel_block_sizes=kernel_sizes,
        slot_mapping_enabled=enabled,
        dcp_sharded=sharded,
        circular=circular,
    )
    if world > 1:
        options.update(cp_world_size=world, cp_rank=rank, cp_interleave=interleave)
    if any(dummy) or draw(st.booleans()):
        rows = len(lengths) + extra_rows
        chosen = rng.sample(range(rows), len(lengths))
        options["idx_mapping"] = tensor(
            [-1 if d else r for r, d in zip(chosen, dummy, strict=True)],
            draw(st.sampled_from((torch.int32, torch.int64))),  # vLLM >= 0.32: int64
        )
    padded = draw(st.sampled_from((0, 1, 7)))
    if padded:
        options["num_tokens"] = len(flat) + padded  # a padded host count, as vLLM's
    options["max_num_tokens"] = len(flat) + padded + draw(st.sampled_from((0, 3)))
    garbage = [rng.choice((0, 5, 2**20)) for _ in range(padded)]
    return ParityCase(
        qsl_of(lengths), tensor(flat + garbage, torch.int64), tables, kv_sizes, options
    )


# ---------------------------------------------------------------------------------------------
# Properties: the torch reference and every grid against the oracle, on poisoned outputs.
# ---------------------------------------------------------------------------------------------
@given(case=parity_cases())
def test_torch_reference_matches_oracle(case: ParityCase) -> None:
    assert_slots_equal(
        case.run(slotmap.slot_mappings_torch), case.run(slotmap.slot_mappings_oracle)
    )


@ON_EVERY_GRID
@given(case=parity_cases(), out_int64=st.booleans(), tile=st.sampled_from((None, 16, 64)))
def test_fused_kernel_matches_oracle(
    grid: str, case: ParityCase, out_int64: bool, tile: int | None
) -> None:
    dtype = torch.int64 if out_int64 else torch.int32
    expected = case.run(slotmap.slot_mappings_oracle)
    actual = call_guarded(
        slotmap.compute_slot_mappings,
        *case.args(),
        out_shape=case.out_shape,
        out_dtype=dtype,
        tile_size=tile,
        **GRIDS[grid],
        **case.options,
    )
    assert_slots_equal(actual, expected, grid)


@given(case=parity_cases())
def test_fused_kernel_without_validation_matches_oracle(case: ParityCase) -> None:
    expected = case.run(slotmap.slot_mappings_oracle)
    options = dict(case.options)
    options.setdefault("num_tokens", int(case.query_start_loc[-1]))
    actual = call_guarded(
        slotmap.compute_slot_mappings,
        *case.args(),
        out_shape=case.out_shape,
        validate=False,
        **options,
    )
    assert_slots_equal(actual, expected)


# ---------------------------------------------------------------------------------------------
# Hand cases, one a feature, expected values worked out by hand.
# ---------------------------------------------------------------------------------------------
IMPLEMENTATIONS = {
    "oracle": lambda: slotmap.slot_mappings_oracle,
    "torch": lambda: slotmap.slot_mappings_torch,
    **{f"fused-{grid}": lambda grid=grid: _fused(GRIDS[grid]) for grid in GRIDS},
}
ON_EVERY_IMPLEMENTATION = pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))


def _fused(options: dict):
    def run(*args, **kwargs):
        return slotmap.compute_slot_mappings(*args, tile_size=16, **options, **kwargs)

    return run


def hybrid_model(cp_rank: int) -> ParityCase:
    # A hybrid model's three kinds of group in one launch, on CP rank cp_rank of 2
    # (interleave 1): request 0 holds positions 0..5 (row 0), request 1 positions 8, 9 (row 1).
    # Group 0, full attention, sharded: allocation blocks of 4 seen as kernel blocks of 2;
    # its rows are the kernel blocks of allocation blocks [3, 7] and [5, 1].
    # Group 1, sliding window, unsharded: blocks of 4, every position maps on every rank.
    # Group 2, a Mamba state group: disabled, no table at all.
    full = slotmap.expand_block_table(tensor([[3, 7], [5, 1]], torch.int32), 2)
    window = tensor([[9, 2, 5], [4, 8, 1]], torch.int32)
    return ParityCase(
        qsl_of([6, 2]),
        tensor([0, 1, 2, 3, 4, 5, 8, 9], torch.int64),
        [full, window, None],
        [4, 4, 16],
        dict(
            kernel_block_sizes=[2, 4, 16],
            dcp_sharded=[True, False, False],
            slot_mapping_enabled=[True, True, False],
            cp_world_size=2,
            cp_rank=cp_rank,
            cp_interleave=1,
            max_num_tokens=10,
        ),
    )


HYBRID_RANK_0 = [
    # Full attention on rank 0: even positions of each 8-position virtual block, packed
    # (position 8: virtual block 1, kernel block 1 * 2 + 0, row 1's entry 2).
    [6 * 2 + 0, PAD, 6 * 2 + 1, PAD, 7 * 2 + 0, PAD, 2 * 2 + 0, PAD, PAD, PAD],
    [36, 37, 38, 39, 8, 9, 4, 5, PAD, PAD],  # the window, local: table[p // 4] * 4 + p % 4
    [PAD] * 10,  # the state group
]
HYBRID_RANK_1 = [
    [PAD, 6 * 2 + 0, PAD, 6 * 2 + 1, PAD, 7 * 2 + 0, PAD, 2 * 2 + 0, PAD, PAD],
    [36, 37, 38, 39, 8, 9, 4, 5, PAD, PAD],  # the same on every rank: not sharded
    [PAD] * 10,
]


@ON_EVERY_IMPLEMENTATION
@pytest.mark.parametrize(("rank", "expected"), [(0, HYBRID_RANK_0), (1, HYBRID_RANK_1)])
def test_hybrid_model_three_kinds_of_group(impl: str, rank: int, expected) -> None:
    actual = hybrid_model(rank).run(IMPLEMENTATIONS[impl]())
    assert_slots_equal(actual, expected, impl)


@ON_EVERY_IMPLEMENTATION
def test_disabled_group_never_reads_its_poisoned_table(impl: str) -> None:
    # Group 1 is disabled and its table holds only negative entries: any read shows.
    case = ParityCase(
        qsl_of([3, 2]),
        tensor([0, 1, 2, 5, 6], torch.int64),
        [tensor([[4, 6], [1, 3]], torch.int32), poisoned_table(2, 2)],
        [4, 4],
        dict(slot_mapping_enabled=[True, False], max_num_tokens=6),
    )
    expected = [[16, 17, 18, 13, 14, PAD], [PAD] * 6]
    assert_slots_equal(case.run(IMPLEMENTATIONS[impl]()), expected, impl)


@ON_EVERY_IMPLEMENTATION
def test_disabled_group_needs_no_rows(impl: str) -> None:
    # Three requests, and the disabled group's table has one row of one entry.
    case = ParityCase(
        qsl_of([1, 1, 1]),
        tensor([0, 4, 9], torch.int64),
        [tensor([[2, 0, 0], [0, 5, 0], [0, 0, 7]], torch.int32), poisoned_table(1, 1)],
        [4, 4],
        dict(slot_mapping_enabled=[True, False]),
    )
    assert_slots_equal(case.run(IMPLEMENTATIONS[impl]()), [[8, 20, 29], [PAD] * 3], impl)


def dummy_request_case() -> ParityCase:
    # Request 0 is a dummy (idx_mapping -1, positions 0 as CUDA-graph padding leaves them);
    # request 1 reads row 0. The table is a view one row into a buffer whose row before it is
    # poisoned: a kernel that reads "row -1" reads -7.
    buffer = tensor([[-7, -7], [3, 9], [2, 2]], torch.int32)
    return ParityCase(
        qsl_of([2, 3]),
        tensor([0, 0, 4, 5, 6], torch.int64),
        [buffer[1:]],
        [4],
        dict(idx_mapping=tensor([-1, 0], torch.int32), max_num_tokens=6),
    )


@ON_EVERY_IMPLEMENTATION
def test_dummy_request_gets_pad_and_reads_no_row(impl: str) -> None:
    actual = dummy_request_case().run(IMPLEMENTATIONS[impl]())
    assert_slots_equal(actual, [[PAD, PAD, 36, 37, 38, PAD]], impl)


@ON_EVERY_IMPLEMENTATION
def test_kernel_blocks_inside_allocation_blocks(impl: str) -> None:
    # One group, allocation block 8 holding kernel blocks of 2, no CP: the table counts
    # kernel blocks, so slot = table[p // 2] * 2 + p % 2 whatever the allocation block.
    case = ParityCase(
        qsl_of([5]),
        tensor([3, 4, 5, 6, 7], torch.int64),
        [tensor([[20, 21, 22, 23, 40, 41]], torch.int32)],
        [8],
        dict(kernel_block_sizes=[2]),
    )
    assert_slots_equal(case.run(IMPLEMENTATIONS[impl]()), [[43, 44, 45, 46, 47]], impl)


def stale_buffer_case() -> tuple[ParityCase, torch.Tensor]:
    # Chunked prefill under a padded host count: the batch holds 3 tokens (query_start_loc
    # ends at 3) but the host passes num_tokens 6, as for a graph captured for 6. The output
    # buffer still holds an earlier, longer chunk's slots.
    case = ParityCase(
        qsl_of([3]),
        tensor([4, 5, 6, 0, 0, 0], torch.int64),
        [tensor([[2, 5]], torch.int32)],
        [4],
        dict(num_tokens=6, max_num_tokens=8),
    )
    return case, torch.tensor([[20, 21, 22] + [PAD] * 5])


@ON_EVERY_IMPLEMENTATION
@pytest.mark.parametrize("validate", [True, False])
def test_padding_starts_at_the_real_token_count(impl: str, validate: bool) -> None:
    case, expected = stale_buffer_case()
    guarded = Guarded(case.out_shape)
    guarded.out.fill_(STALE)
    fn = IMPLEMENTATIONS[impl]()
    fn(*case.args(), out=guarded.out, validate=validate, **case.options)
    guarded.check_guards()
    assert_slots_equal(guarded.out, expected, impl)


@ON_EVERY_IMPLEMENTATION
def test_slots_past_int32_in_an_int64_out(impl: str) -> None:
    # Sharded kernel blocks of 2 inside allocation blocks of 4 on CP rank 1 of 2, entries
    # near 2**31: the slots pass int32, so only an int64 out holds them (in its own width).
    big = 2**31 - 8
    case = ParityCase(
        qsl_of([4]),
        tensor([0, 1, 2, 3], torch.int64),
        [tensor([[big, big + 1]], torch.int32), None],
        [4, 4],
        dict(
            kernel_block_sizes=[2, 4],
            slot_mapping_enabled=[True, False],
            cp_world_size=2,
            cp_rank=1,
        ),
    )
    guarded = Guarded(case.out_shape, torch.int64)
    IMPLEMENTATIONS[impl]()(*case.args(), out=guarded.out, **case.options)
    guarded.check()
    expected = [[PAD, big * 2, PAD, big * 2 + 1], [PAD] * 4]
    assert_slots_equal(guarded.out, expected, impl)


@ON_EVERY_IMPLEMENTATION
def test_slots_past_int32_without_switches(impl: str) -> None:
    # The same without any switch: the multi-group oracle once wrapped these to int32.
    big = 2**31 - 8
    case = ParityCase(
        qsl_of([2]), tensor([0, 1], torch.int64), [tensor([[big]], torch.int32)], [2]
    )
    guarded = Guarded(case.out_shape, torch.int64)
    IMPLEMENTATIONS[impl]()(*case.args(), out=guarded.out, **case.options)
    assert_slots_equal(guarded.check(), [[big * 2, big * 2 + 1]], impl)


def test_the_hot_path_serves_a_batch_with_a_disabled_group_without_table(monkeypatch) -> None:
    # A serving loop's repeated validate=False call: the cached plan serves it even though
    # the state group's table is None (the first enabled table stands in for the checks).
    from slotmap.kernels import fused_groups

    case = hybrid_model(cp_rank=1)
    out = torch.full(case.out_shape, STALE, dtype=torch.int32, device=slotmap.DEVICE)
    options = dict(case.options, num_tokens=8, out=out, validate=False)
    slotmap.compute_slot_mappings(*case.args(), **options)

    def no_full_way(*args, **kwargs):
        raise AssertionError("the hot call went the full way (resolve_counts)")

    monkeypatch.setattr(fused_groups, "resolve_counts", no_full_way)
    out.fill_(STALE)
    slotmap.compute_slot_mappings(*case.args(), **options)
    assert_slots_equal(out, HYBRID_RANK_1)


# ---------------------------------------------------------------------------------------------
# The two table conventions: vLLM <= 0.31 counts kernel blocks (``kernel_block_sizes`` given),
# vLLM 0.32-0.34 allocation blocks (``kernel_block_sizes`` None). One cache, the same slots.
# ---------------------------------------------------------------------------------------------
@given(case=parity_cases(), seed=st.integers(0, 2**16))
def test_the_two_table_conventions_give_the_same_slots(case: ParityCase, seed: int) -> None:
    rng = random.Random(seed)
    kernel = case.options["kernel_block_sizes"]
    in_allocation_blocks, in_kernel_blocks = [], []
    for table, size, kb in zip(case.block_tables, case.block_sizes, kernel, strict=True):
        if table is None or table.dtype != torch.int32 or table.shape[1] == 0:
            in_allocation_blocks.append(table)
            in_kernel_blocks.append(table)
            continue
        per = size // kb
        width = -(-table.shape[1] // per)
        entries = [rng.randint(0, 5000) for _ in range(width * table.shape[0])]
        allocation = tensor(entries, torch.int32).view(table.shape[0], width)
        in_allocation_blocks.append(allocation)
        in_kernel_blocks.append(slotmap.expand_block_table(allocation, per))
    options = {k: v for k, v in case.options.items() if k != "kernel_block_sizes"}
    args = (case.query_start_loc, case.positions)
    shape = case.out_shape
    new = call_guarded(
        slotmap.slot_mappings_oracle,
        *args,
        in_allocation_blocks,
        case.block_sizes,
        out_shape=shape,
        **options,
    )
    old = call_guarded(
        slotmap.slot_mappings_oracle,
        *args,
        in_kernel_blocks,
        case.block_sizes,
        out_shape=shape,
        kernel_block_sizes=kernel,
        **options,
    )
    assert_slots_equal(new, old, "allocation-block tables vs kernel-block tables")
    fused = call_guarded(
        slotmap.compute_slot_mappings,
        *args,
        in_allocation_blocks,
        case.block_sizes,
        out_shape=shape,
        **options,
    )
    assert_slots_equal(fused, new, "the fused kernel on allocation-block tables")
