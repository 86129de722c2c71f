"""Bad inputs (docs/semantics.md §5): every launcher and reference raises a ValueError that names
the offender (request, token, value), and with validation off never writes outside ``out``.

Each single-group case runs through the references, the window and direct launchers and the
multi-group launcher (as one group) where the case applies to it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from conftest import (
    DEVICE,
    OTHER_DEVICE,
    Guarded,
    fused_single_group,
    qsl_of,
    tensor,
)
from english_left import KEPT, english_words

import slotmap

SINGLE_GROUP: dict[str, Callable[..., Any]] = {
    "oracle": lambda *a, **k: slotmap.slot_mapping_oracle(*a, **k),
    "torch": lambda *a, **k: slotmap.slot_mapping_torch(*a, **k),
    "window": lambda *a, **k: slotmap.compute_slot_mapping(*a, **k),
    "direct": lambda *a, **k: slotmap.compute_slot_mapping_direct(*a, **k),
    "fused": fused_single_group,
    # Each grid of the two launchers that have two, whatever their defaults choose here.
    "direct-requests": lambda *a, **k: slotmap.compute_slot_mapping_direct(
        *a, token_parallel=False, **k
    ),
    "direct-tokens": lambda *a, **k: slotmap.compute_slot_mapping_direct(
        *a, token_parallel=True, **k
    ),
    "fused-requests": lambda *a, **k: fused_single_group(*a, token_parallel=False, **k),
    "fused-tokens": lambda *a, **k: fused_single_group(*a, token_parallel=True, **k),
    # The fused request grid's two gathers: one load a lane (asked for) and the window.
    "fused-lanes": lambda *a, **k: fused_single_group(
        *a, token_parallel=False, lane_loads=True, **k
    ),
    "fused-window": lambda *a, **k: fused_single_group(
        *a, token_parallel=False, lane_loads=False, **k
    ),
}
ALL = tuple(SINGLE_GROUP)
LAUNCHERS = (
    "window",
    "direct",
    "fused",
    "direct-requests",
    "direct-tokens",
    "fused-requests",
    "fused-tokens",
    "fused-lanes",
    "fused-window",
)


def batch(
    qsl: list[int] | torch.Tensor = (0, 4, 10),
    positions: list[int] | torch.Tensor = (0, 1, 2, 3, 8, 9, 10, 11, 12, 13),
    table: list[list[int]] | torch.Tensor = ((1, 2, 3, 4), (5, 6, 7, 8)),
    block_size: int = 4,
    **options: Any,
) -> tuple[tuple, dict]:
    """A valid batch unless told otherwise: request 0 = tokens 0..3 (positions 0..3),
    request 1 = tokens 4..9 (positions 8..13); block 4, rows of 4 blocks."""

    def as_tensor(value, dtype):
        return value if isinstance(value, torch.Tensor) else tensor(list(value), dtype)

    table = (
        table if isinstance(table, torch.Tensor) else tensor([list(r) for r in table], torch.int32)
    )
    args = (as_tensor(qsl, torch.int32), as_tensor(positions, torch.int64), table, block_size)
    return args, options


def positions_with(token: int, value: int) -> list[int]:
    positions = [0, 1, 2, 3, 8, 9, 10, 11, 12, 13]
    positions[token] = value
    return positions


def strided(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    # Every other element of a tensor twice as long: same values, not contiguous.
    wide = torch.zeros(2 * len(values), dtype=dtype, device=DEVICE)
    wide[::2] = torch.tensor(values, dtype=dtype)
    return wide[::2]


@dataclass
class Bad:
    build: Callable[[], tuple[tuple, dict]]
    match: str
    impls: tuple[str, ...] = field(default=ALL)


def out_aliasing(what: str) -> tuple[tuple, dict]:
    """The valid batch, its ``out`` sharing memory with the positions or the block table."""
    args, options = batch()
    if what == "positions":
        return args, {"out": args[1]}  # int64 [10]: an output of the right shape and dtype
    buffer = torch.zeros(10, dtype=torch.int32, device=DEVICE)
    buffer[:8] = args[2].flatten()
    return (*args[:2], buffer[:8].view(2, 4), args[3]), {"out": buffer}


BAD: dict[str, Bad] = {
    # out
    "out-aliases-positions": Bad(
        lambda: out_aliasing("positions"), r"out shares memory with positions"
    ),
    "out-aliases-the-block-table": Bad(
        lambda: out_aliasing("table"), r"out shares memory with block_table"
    ),
    # query_start_loc
    "qsl-not-monotone": Bad(
        lambda: batch(qsl=[0, 6, 4]),
        r"request 1: query_start_loc is not monotone .*query_start_loc\[1\] = 6 > "
        r"query_start_loc\[2\] = 4",
    ),
    "qsl-negative-inside": Bad(
        lambda: batch(qsl=[0, -2, 10]), r"request 0: .*query_start_loc\[1\] = -2"
    ),
    # The last entry alone negative: the message must still blame query_start_loc's request
    # (not a num_tokens the caller never passed).
    "qsl-negative-last": Bad(lambda: batch(qsl=[0, 4, -1]), r"request 1.*-1"),
    "qsl-first-not-0": Bad(
        lambda: batch(qsl=[2, 4, 10]), r"query_start_loc\[0\] must be 0, got 2"
    ),
    "qsl-empty": Bad(lambda: batch(qsl=[]), r"query_start_loc needs num_reqs \+ 1 >= 1 entries"),
    "num-tokens-mismatch": Bad(
        lambda: batch(num_tokens=9), r"num_tokens is 9 but query_start_loc ends at 10"
    ),
    "num-tokens-over-max": Bad(
        lambda: batch(max_num_tokens=8), r"num_tokens 10 exceeds max_num_tokens 8"
    ),
    "too-few-positions": Bad(
        lambda: batch(positions=list(range(9))), r"too few positions: 9 for 10 tokens"
    ),
    "too-few-rows": Bad(
        lambda: batch(table=[[1, 2, 3, 4]]), r"2 requests but .*block table.* only 1 rows"
    ),
    "rows-of-0-entries": Bad(
        lambda: batch(table=torch.empty(2, 0, dtype=torch.int32, device=DEVICE)),
        r"rows of 0 entries",
    ),
    # positions
    "negative-position": Bad(
        lambda: batch(positions=positions_with(7, -3)),
        r"request 1, token 7: position -3 is negative",
    ),
    "position-over-int32": Bad(
        lambda: batch(positions=positions_with(7, 2**31)),
        r"request 1, token 7: position 2147483648 does not fit in int32",
    ),
    "circular-position-under-int32": Bad(
        lambda: batch(positions=positions_with(7, -(2**31) - 1), circular=True),
        r"request 1, token 7: position -2147483649 does not fit in int32",
    ),
    "block-outside-row": Bad(
        lambda: batch(positions=positions_with(7, 16)),
        r"request 1, token 7: position 16 needs logical block 4, outside the block-table row "
        r"of 4 entries",
    ),
    # block table contents
    "slot-over-int32": Bad(
        lambda: batch(table=[[1, 2, 3, 4], [5, 6, 7, 2**31 // 4]]),
        r"request 1, token 8: slot 2147483648 .*overflows int32",
    ),
    "negative-physical-block": Bad(
        lambda: batch(table=[[1, 2, 3, 4], [5, 6, 7, -3]]),
        r"request 1, token 8: block table entry \[1, 3\] holds physical block -3",
    ),
    # configuration
    "kv-not-multiple-of-block": Bad(
        lambda: batch(kv_cache_block_size=6),
        r"kv_cache_block_size 6 must be a positive multiple of block_size 4",
        impls=("oracle", "torch", "window", "direct"),
    ),
    "kv-not-multiple-of-interleave": Bad(
        lambda: batch(kv_cache_block_size=4, cp_world_size=2, cp_interleave=8),
        r"kv_cache_block_size 4 is not a multiple of cp_interleave 8",
    ),
    "cp-rank-outside-world": Bad(
        lambda: batch(cp_world_size=2, cp_rank=2), r"cp_rank 2 is not a rank of a world of 2"
    ),
    "circular-with-cp": Bad(
        lambda: batch(cp_world_size=2, circular=True),
        r"circular cache cannot be split across 2 context-parallel ranks",
    ),
    "block-size-0": Bad(lambda: batch(block_size=0), r"block_size must be >= 1, got 0"),
    # the window precondition (window kernels only)
    "window-precondition": Bad(
        lambda: batch(
            qsl=[0, 3],
            positions=[0, 100, 1],
            table=[list(range(128))],
            block_size=1,
            tile_size=16,
        ),
        r"request 0, tokens 0 and 1: logical blocks 0 and 100",
        # The token grid loads per lane: no window. The request grid checks the window's
        # precondition whichever gather it runs, so both accept the same batches.
        impls=("window", "fused-requests", "fused-lanes", "fused-window"),
    ),
    "tile-not-power-of-two": Bad(
        lambda: batch(tile_size=24), r"tile_size must be a power of two, got 24", LAUNCHERS
    ),
    "tile-0": Bad(
        lambda: batch(tile_size=0), r"tile_size must be a power of two, got 0", LAUNCHERS
    ),
    # dtypes
    "qsl-int64": Bad(
        lambda: batch(qsl=tensor([0, 4, 10], torch.int64)),
        r"query_start_loc must be int32, got int64",
    ),
    "positions-int32": Bad(
        lambda: batch(positions=tensor(positions_with(0, 0), torch.int32)),
        r"positions must be int64, got int32",
    ),
    "block-table-int64": Bad(
        lambda: batch(table=tensor([[1, 2, 3, 4], [5, 6, 7, 8]], torch.int64)),
        r"block_table.* must be int32, got int64",
    ),
    "out-float32": Bad(
        lambda: batch(out=torch.zeros(10, dtype=torch.float32, device=DEVICE)),
        r"out must be int32 or int64, got float32",
    ),
    "out-int16": Bad(
        lambda: batch(out=torch.zeros(10, dtype=torch.int16, device=DEVICE)),
        r"out must be int32 or int64, got int16",
    ),
    # shapes
    "out-too-long": Bad(
        lambda: batch(out=torch.zeros(11, dtype=torch.int32, device=DEVICE)),
        r"out has shape \((1, )?11,?\), expected \((1, )?10,?\)",
    ),
    "out-too-short-for-padding": Bad(
        lambda: batch(max_num_tokens=12, out=torch.zeros(10, dtype=torch.int32, device=DEVICE)),
        r"out has shape \((1, )?10,?\), expected \((1, )?12,?\)",
    ),
    "positions-2d": Bad(
        lambda: batch(positions=tensor([positions_with(0, 0)], torch.int64)),
        r"positions must have 1 dimension",
    ),
    # devices
    "qsl-on-other-device": Bad(
        lambda: batch(qsl=qsl_of([4, 6]).to(OTHER_DEVICE)),
        rf"query_start_loc is on {OTHER_DEVICE}",
    ),
    "positions-on-other-device": Bad(
        lambda: batch(positions=tensor(positions_with(0, 0), torch.int64).to(OTHER_DEVICE)),
        rf"is on \S+ but positions are on {OTHER_DEVICE}",
    ),
    "block-table-on-other-device": Bad(
        lambda: batch(table=tensor([[1, 2, 3, 4], [5, 6, 7, 8]], torch.int32).to(OTHER_DEVICE)),
        rf"block_table.* is on {OTHER_DEVICE}",
    ),
    "out-on-other-device": Bad(
        lambda: batch(out=torch.zeros(10, dtype=torch.int32, device=OTHER_DEVICE)),
        rf"out is on {OTHER_DEVICE}",
    ),
    # contiguity
    "qsl-not-contiguous": Bad(
        lambda: batch(qsl=strided([0, 4, 10], torch.int32)), r"query_start_loc must be contiguous"
    ),
    "positions-not-contiguous": Bad(
        lambda: batch(positions=strided(positions_with(0, 0), torch.int64)),
        r"positions must be contiguous",
    ),
    "block-table-not-contiguous": Bad(
        lambda: batch(table=tensor([[1, 0, 2, 0, 3, 0, 4, 0]] * 2, torch.int32)[:, ::2]),
        r"block_table.* must be contiguous",
    ),
    "out-not-contiguous": Bad(
        lambda: batch(out=strided([0] * 10, torch.int32)), r"out must be contiguous"
    ),
}


@pytest.mark.parametrize(
    ("bad_name", "impl_name"),
    [
        pytest.param(bad_name, impl_name, id=f"{bad_name}-{impl_name}")
        for bad_name, bad in BAD.items()
        for impl_name in bad.impls
    ],
)
def test_bad_input_is_named(bad_name: str, impl_name: str) -> None:
    bad = BAD[bad_name]
    args, options = bad.build()
    with pytest.raises(ValueError, match=bad.match):
        SINGLE_GROUP[impl_name](*args, **options)


def test_the_valid_batch_is_valid() -> None:
    # The bad cases above are one change away from this batch, which every launcher accepts.
    args, options = batch()
    expected = [4, 5, 6, 7, 28, 29, 30, 31, 32, 33]
    for name, fn in SINGLE_GROUP.items():
        assert fn(*args, **options).cpu().tolist() == expected, name


# ---------------------------------------------------------------------------------------------
# Multi-group only
# ---------------------------------------------------------------------------------------------
def groups(**options: Any) -> tuple[tuple, dict]:
    """Two groups (block 4 and 2, rows of 4 and 8 blocks) over the batch above."""
    (qsl, positions, table, _), _ = batch()
    second = tensor([list(range(20, 28)), list(range(30, 38))], torch.int32)
    return (qsl, positions, [table, second], [4, 2]), options


MULTI_GROUP = {
    "oracle": lambda *a, **k: slotmap.slot_mappings_oracle(*a, **k),
    "torch": lambda *a, **k: slotmap.slot_mappings_torch(*a, **k),
    "fused": lambda *a, **k: slotmap.compute_slot_mappings(*a, **k),
    "fused-requests": lambda *a, **k: slotmap.compute_slot_mappings(*a, token_parallel=False, **k),
    "fused-tokens": lambda *a, **k: slotmap.compute_slot_mappings(*a, token_parallel=True, **k),
}


def groups_out_aliasing(what: str) -> tuple[tuple, dict]:
    """The two groups, ``out`` sharing memory with the positions or with idx_mapping."""
    args, options = groups()
    if what == "positions":
        out = torch.zeros(20, dtype=torch.int64, device=DEVICE)
        out[:10] = args[1]
        return (args[0], out[:10], *args[2:]), {"out": out.view(2, 10)}
    out = torch.zeros(20, dtype=torch.int32, device=DEVICE)
    out[18:] = tensor([1, 0], torch.int32)
    return args, {"out": out.view(2, 10), "idx_mapping": out[18:]}


BAD_MULTI: dict[str, Bad] = {
    "out-aliases-positions": Bad(
        lambda: groups_out_aliasing("positions"), r"out shares memory with positions"
    ),
    "out-aliases-idx-mapping": Bad(
        lambda: groups_out_aliasing("idx_mapping"), r"out shares memory with idx_mapping"
    ),
    "idx-mapping-out-of-range": Bad(
        lambda: groups(idx_mapping=tensor([0, 5], torch.int32)),
        r"request 1: idx_mapping\[1\] = 5 is not a row of every block table",
    ),
    "idx-mapping-below-minus-one": Bad(
        lambda: groups(idx_mapping=tensor([0, -2], torch.int32)),
        r"request 1: idx_mapping\[1\] = -2 is below -1 \(-1 marks a dummy request",
    ),
    "kernel-block-not-dividing": Bad(
        lambda: groups(kernel_block_sizes=[3, 2]),
        r"group 0: kernel block size 3 does not divide block size 4",
    ),
    "kernel-blocks-mismatch": Bad(
        lambda: groups(kernel_block_sizes=[4]), r"2 block tables but 1 kernel_block_sizes"
    ),
    "enabled-flags-mismatch": Bad(
        lambda: groups(slot_mapping_enabled=[True]),
        r"2 block tables but 1 slot_mapping_enabled flags",
    ),
    "sharded-flags-mismatch": Bad(
        lambda: groups(dcp_sharded=[True, False, True]), r"2 block tables but 3 dcp_sharded"
    ),
    "enabled-group-without-table": Bad(
        lambda: (groups()[0][:2] + ([groups()[0][2][0], None], [4, 2]), {}),
        r"block_tables\[1\] must be a torch.Tensor, got NoneType",
    ),
    "sharded-group-interleave-not-dividing": Bad(
        # Only group 1 is sharded: its allocation block 2 is not a multiple of 4.
        lambda: groups(cp_world_size=2, cp_interleave=4, dcp_sharded=[False, True]),
        r"group 1: kv_cache_block_size 2 is not a multiple of cp_interleave 4",
    ),
    "sharded-circular-group": Bad(
        lambda: groups(cp_world_size=2, circular=[False, True]),
        r"group 1: a circular cache cannot be split .*dcp_sharded=False",
    ),
    "circular-group-with-kernel-blocks": Bad(
        lambda: groups(circular=[False, True], kernel_block_sizes=[4, 1]),
        r"group 1: a circular cache is one block a row",
    ),
    "num-tokens-below-the-real-count": Bad(
        lambda: groups(num_tokens=9), r"num_tokens is 9 but query_start_loc ends at 10"
    ),
    "idx-mapping-too-short": Bad(
        lambda: groups(idx_mapping=tensor([0], torch.int32)),
        r"idx_mapping has 1 entries for 2 requests",
    ),
    "idx-mapping-int16": Bad(
        lambda: groups(idx_mapping=tensor([0, 1], torch.int16)),
        r"idx_mapping must be int32 or int64, got int16",
    ),
    "idx-mapping-on-other-device": Bad(
        lambda: groups(idx_mapping=tensor([0, 1], torch.int32).to(OTHER_DEVICE)),
        rf"idx_mapping is on {OTHER_DEVICE}",
    ),
    "out-one-group-short": Bad(
        lambda: groups(out=torch.zeros(1, 10, dtype=torch.int32, device=DEVICE)),
        r"out has shape \(1, 10\), expected \(2, 10\)",
    ),
    "out-flat": Bad(
        lambda: groups(out=torch.zeros(20, dtype=torch.int32, device=DEVICE)),
        r"out must have 2 dimension",
    ),
    "sizes-mismatch": Bad(
        lambda: (groups()[0][:3] + ([4],), {}), r"2 block tables but 1 block sizes"
    ),
    "circular-flags-mismatch": Bad(
        lambda: groups(circular=[True]), r"2 block tables but .*1 circular"
    ),
    "no-groups": Bad(lambda: (groups()[0][:2] + ([], []), {}), r"at least one KV-cache group"),
    "second-group-position-negative": Bad(
        lambda: (
            (groups()[0][0], tensor(positions_with(7, -3), torch.int64)) + groups()[0][2:],
            {"circular": [True, False]},
        ),
        r"group 1, request 1, token 7: position -3 is negative",
    ),
    "second-group-block-outside-row": Bad(
        lambda: (
            (groups()[0][0], tensor(positions_with(7, 17), torch.int64)) + groups()[0][2:],
            {"circular": [True, False]},
        ),
        r"group 1, request 1, token 7: position 17 needs logical block 8",
    ),
    "second-group-table-int64": Bad(
        lambda: (groups()[0][:2] + ([groups()[0][2][0], groups()[0][2][1].long()], [4, 2]), {}),
        r"block_tables\[1\] must be int32, got int64",
    ),
    "group-config": Bad(
        lambda: groups(cp_world_size=2, cp_interleave=4),
        r"group 1: kv_cache_block_size 2 is not a multiple of cp_interleave 4",
    ),
    "parallel-tiles-0": Bad(
        lambda: groups(parallel_tiles=0), r"parallel_tiles must be >= 1, got 0", ("fused",)
    ),
    "parallel-tiles-negative": Bad(
        lambda: groups(parallel_tiles=-2), r"parallel_tiles must be >= 1, got -2", ("fused",)
    ),
    "tile-0": Bad(
        lambda: groups(tile_size=0), r"tile_size must be a power of two, got 0", ("fused",)
    ),
    "lane-loads-with-gather-as-float": Bad(
        lambda: groups(lane_loads=True, gather_as_float=False),
        r"gather_as_float belongs to the window gather: not with lane_loads",
        ("fused",),
    ),
}


@pytest.mark.parametrize(
    ("bad_name", "impl_name"),
    [
        pytest.param(bad_name, impl_name, id=f"{bad_name}-{impl_name}")
        for bad_name, bad in BAD_MULTI.items()
        for impl_name in (bad.impls if bad.impls != ALL else tuple(MULTI_GROUP))
    ],
)
def test_bad_multi_group_input_is_named(bad_name: str, impl_name: str) -> None:
    bad = BAD_MULTI[bad_name]
    args, options = bad.build()
    with pytest.raises(ValueError, match=bad.match):
        MULTI_GROUP[impl_name](*args, **options)


ONE_AWAY_AND_VALID = {
    # Each is one change away from a bad case above, and valid (docs/semantics.md §4, §5).
    "dummy-request": dict(idx_mapping=tensor([0, -1], torch.int32)),
    "idx-mapping-int64": dict(idx_mapping=tensor([1, -1], torch.int64)),  # vLLM >= 0.32
    "disabled-group-without-table": dict(slot_mapping_enabled=[True, False]),
    "unsharded-group-interleave-not-dividing": dict(
        cp_world_size=2, cp_interleave=4, dcp_sharded=[True, False]
    ),
    "unsharded-circular-group": dict(
        cp_world_size=2, circular=[False, True], dcp_sharded=[True, False]
    ),
    "padded-num-tokens": dict(num_tokens=12, max_num_tokens=12),
}


@pytest.mark.parametrize("impl_name", list(MULTI_GROUP))
@pytest.mark.parametrize("valid_name", list(ONE_AWAY_AND_VALID))
def test_the_group_switches_accept_valid_batches(valid_name: str, impl_name: str) -> None:
    (qsl, positions, tables, sizes), _ = groups()
    options = ONE_AWAY_AND_VALID[valid_name]
    if valid_name == "disabled-group-without-table":
        tables = [tables[0], None]
    if valid_name == "padded-num-tokens":
        positions = torch.cat([positions, positions[:2]])
    result = MULTI_GROUP[impl_name](qsl, positions, tables, sizes, **options)
    expected = slotmap.slot_mappings_oracle(qsl, positions, tables, sizes, **options)
    assert result.cpu().tolist() == expected.cpu().tolist()


# ---------------------------------------------------------------------------------------------
# Replay padding
# ---------------------------------------------------------------------------------------------
def replay(**changes: Any) -> tuple[tuple, dict]:
    (qsl, positions, _, _), _ = batch()
    values = {
        "slot_mappings": torch.zeros(2, 10, dtype=torch.int32, device=DEVICE),
        "query_start_loc": qsl,
        "positions": positions,
        "replay_start": tensor([2, 9], torch.int32),
        "window": 3,
        "prefix_cacheable": [True, False],
    }
    options = {k: changes.pop(k) for k in ("num_tokens", "pad_id") if k in changes}
    values.update(changes)
    return tuple(values.values()), options


REPLAY = {
    "oracle": lambda *a, **k: slotmap.replay_padding_oracle(*a, **k),
    "torch": lambda *a, **k: slotmap.replay_padding_torch(*a, **k),
    "kernel": lambda *a, **k: slotmap.pad_replayed_slots(*a, **k),
}
BAD_REPLAY: dict[str, Bad] = {
    "replay-start-negative": Bad(
        lambda: replay(replay_start=tensor([2, -3], torch.int32)),
        r"request 1: replay_start -3 is negative",
    ),
    "replay-start-int64": Bad(
        lambda: replay(replay_start=tensor([2, 9], torch.int64)), r"replay_start must be int32"
    ),
    "replay-start-too-short": Bad(
        lambda: replay(replay_start=tensor([2], torch.int32)),
        r"replay_start has 1 entries for 2 requests",
    ),
    "replay-start-on-other-device": Bad(
        lambda: replay(replay_start=tensor([2, 9], torch.int32).to(OTHER_DEVICE)),
        rf"replay_start is on {OTHER_DEVICE}",
    ),
    "replay-end-over-int32": Bad(
        lambda: replay(replay_start=tensor([2, 2**31 - 10], torch.int32), window=20),
        r"replay_start 2147483638 \+ window 20 does not fit in int32",
    ),
    "window-negative": Bad(lambda: replay(window=-1), r"replay window must be >= 0, got -1"),
    "flags-mismatch": Bad(
        lambda: replay(prefix_cacheable=[True]),
        r"1 prefix_cacheable flags for 2 slot-mapping rows",
    ),
    "slot-mappings-too-narrow": Bad(
        lambda: replay(slot_mappings=torch.zeros(2, 9, dtype=torch.int32, device=DEVICE)),
        r"slot_mappings holds 9 tokens, fewer than 10",
    ),
    "slot-mappings-float": Bad(
        lambda: replay(slot_mappings=torch.zeros(2, 10, device=DEVICE)),
        r"slot_mappings must be int32 or int64, got float32",
    ),
    "slot-mappings-not-contiguous": Bad(
        lambda: replay(slot_mappings=torch.zeros(2, 20, dtype=torch.int32, device=DEVICE)[:, ::2]),
        r"slot_mappings must be contiguous",
    ),
    "position-over-int32": Bad(
        lambda: replay(positions=tensor(positions_with(7, 2**31), torch.int64)),
        r"token 7: position 2147483648 does not fit in int32",
    ),
    "qsl-not-monotone": Bad(
        lambda: replay(query_start_loc=tensor([0, 6, 4], torch.int32)),
        r"request 1: query_start_loc is not monotone",
    ),
    "num-tokens-mismatch": Bad(
        lambda: replay(num_tokens=9), r"num_tokens is 9 but query_start_loc ends at 10"
    ),
}


@pytest.mark.parametrize(
    ("bad_name", "impl_name"),
    [
        pytest.param(bad_name, impl_name, id=f"{bad_name}-{impl_name}")
        for bad_name in BAD_REPLAY
        for impl_name in REPLAY
    ],
)
def test_bad_replay_input_is_named(bad_name: str, impl_name: str) -> None:
    args, options = BAD_REPLAY[bad_name].build()
    with pytest.raises(ValueError, match=BAD_REPLAY[bad_name].match):
        REPLAY[impl_name](*args, **options)


# ---------------------------------------------------------------------------------------------
# validate=False: no checks that read tensor contents, but never a write outside the output
# ---------------------------------------------------------------------------------------------
UNVALIDATED = {
    "qsl-last-beyond-num-tokens": {"qsl": [0, 4, 50]},
    "qsl-not-monotone": {"qsl": [0, 9, 3], "num_tokens": 3},
    "qsl-negative": {"qsl": [-5, 4, 10]},
    "qsl-way-negative": {"qsl": [0, -(2**31), 2**31 - 1]},
    "num-tokens-below-qsl": {"qsl": [0, 4, 10], "num_tokens": 6, "max_num_tokens": 6},
    "position-outside-row": {"positions": positions_with(7, 400)},
    "negative-position": {"positions": positions_with(7, -400)},
}


@pytest.mark.parametrize("launcher_name", LAUNCHERS)
@pytest.mark.parametrize("bad_name", list(UNVALIDATED))
def test_unvalidated_bad_input_writes_only_inside_out(bad_name: str, launcher_name: str) -> None:
    change = dict(UNVALIDATED[bad_name])
    num_tokens = change.pop("num_tokens", 10)
    max_num_tokens = change.pop("max_num_tokens", 12)
    args, _ = batch(**change)
    guarded = Guarded(max_num_tokens)
    SINGLE_GROUP[launcher_name](
        *args,
        num_tokens=num_tokens,
        max_num_tokens=max_num_tokens,
        out=guarded.out,
        validate=False,
        tile_size=16,
    )
    guarded.check_guards()
    # The padding tail is still written.
    assert torch.all(guarded.out[num_tokens:].cpu() == slotmap.PAD_SLOT_ID)


@pytest.mark.parametrize("bad_name", ["qsl-last-beyond-num-tokens", "qsl-negative"])
def test_unvalidated_bad_replay_writes_only_inside_slot_mappings(bad_name: str) -> None:
    guarded = Guarded((2, 10))
    guarded.out.fill_(7)
    (qsl, positions, _, _), _ = batch(**UNVALIDATED[bad_name])
    slotmap.pad_replayed_slots(
        guarded.out,
        qsl,
        positions,
        tensor([1, 1], torch.int32),
        100,
        [True, True],
        num_tokens=10,
        validate=False,
        tile_size=16,
    )
    guarded.check_guards()


# ---------------------------------------------------------------------------------------------
# In Chinese: every case above is named in Chinese, through the message catalog
# ---------------------------------------------------------------------------------------------
# The argument names a message names that read as words (identifiers with no underscore).
ARGUMENT_NAMES = {"positions", "out", "int", "list", "float", "str", "meta", "cpu", "circular"}
ARGUMENT_NAMES |= {"direct", "CP"}  # a kernel's name; context parallelism's abbreviation


def chinese_message(call: Callable[[], Any]) -> str:
    """The ValueError ``call`` raises with the course speaking Chinese."""
    from slotmap import i18n

    before = i18n.language()
    i18n.use("zh")
    try:
        with pytest.raises(ValueError) as caught:
            call()
    finally:
        i18n.use(before)
    return str(caught.value)


def first_impl(bad: Bad, impls: dict[str, Callable[..., Any]]) -> str:
    return next(name for name in bad.impls if name in impls)


@pytest.mark.parametrize(
    ("bad", "impls"),
    [
        *((BAD[name], SINGLE_GROUP) for name in BAD),
        *((BAD_MULTI[name], MULTI_GROUP) for name in BAD_MULTI),
        *((BAD_REPLAY[name], REPLAY) for name in BAD_REPLAY),
    ],
    ids=[
        *BAD,
        *(f"multi-{name}" for name in BAD_MULTI),
        *(f"replay-{name}" for name in BAD_REPLAY),
    ],
)
def test_in_chinese_a_bad_input_is_named_in_chinese(bad: Bad, impls: dict) -> None:
    """The same refusal, in the catalog's Chinese: no English word left but identifiers and
    the words the glossary keeps, and every number of the English message."""
    args, options = bad.build()
    impl = impls[first_impl(bad, impls)]
    with pytest.raises(ValueError, match=bad.match) as english:
        impl(*args, **options)
    args, options = bad.build()  # fresh tensors: a case may have its out alias them
    chinese = chinese_message(lambda: impl(*args, **options))
    assert any("\u4e00" <= c <= "\u9fff" for c in chinese), chinese
    assert english_words(chinese, KEPT | ARGUMENT_NAMES) == [], chinese
    numbers = Counter(re.findall(r"-?\d+", str(english.value)))
    assert numbers <= Counter(re.findall(r"-?\d+", chinese)), chinese  # "2 的幂": one more
