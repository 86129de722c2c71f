"""Experiment (not part of the package): what 4 groups cost in one launch on the huge shape.

The fused kernel's request grid gives every group its own programs, grid
``(groups, num_reqs + 1, parallel_tiles)``, so each group reads the positions again. Run 8
(results/h200.md) measured fused-4 at 3.1x fused-1 on 64 x 65536 tokens, about 13 µs a group:
each group paid for the whole 12 bytes a token, as if no group found the positions in L2.
Here one program maps a tile for every group (positions loaded once, kept in registers), so
the bytes fall from 4 x (8 + 4) to 8 + 4 x 4 a token; prediction: fused-4 52 -> ~26 µs (24
bytes a token at the same-size copy's ~3,900 GB/s), i.e. ~2x one group at copy bandwidth.

Variants, each checked exactly (output poisoned) before and after timing:

* ``fused-1`` / ``fused-4``: the library (``slotmap.compute_slot_mappings``);
* ``loop-gather-G``: groups looped inside a program, the window gather (the library's);
* ``loop-direct-G``: the same with one block-table load a lane (the GPU's direct design);
* ``programs-direct-G``: the library's grid (a group's own programs), one load a lane.

Run on the device: ``PYTHONPATH=$PWD python3 benchmarks/group_lab.py --out $OUT/groups.json``.
"""

from __future__ import annotations

import argparse
import json

# isort: off
import slotmap  # first: it chooses the backend before triton loads
import torch
import triton
import triton.language as tl
from slotmap.kernels.common import _fill_pad, _gather_from_window
from slotmap.kernels.fused_groups import _group_block_and_offset, choose_tiling, group_metadata
from slotmap.layout import window_size

# isort: on

CALLS = 20
POISON = -999


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens", "num_reqs"])
def _groups_loop_kernel(
    num_tokens, max_num_tokens, num_reqs, query_start_loc_ptr, positions_ptr, group_meta_ptr,
    slot_mappings_ptr, slot_mappings_stride,
    PAD_ID: tl.constexpr, TILE_BLOCK_SIZE: tl.constexpr, BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
    PARALLEL_TILES: tl.constexpr, NUM_GROUPS: tl.constexpr, GATHER: tl.constexpr,
):  # fmt: skip
    # Program (q, p) maps tiles p, p + P, ... of request q for every group in turn.
    req_idx = tl.program_id(0)
    part = tl.program_id(1)
    if req_idx == num_reqs:
        for g in tl.static_range(NUM_GROUPS):
            _fill_pad(slot_mappings_ptr + g * slot_mappings_stride,
                      num_tokens + part * TILE_BLOCK_SIZE, max_num_tokens, PARALLEL_TILES,
                      PAD_ID, TILE_BLOCK_SIZE)  # fmt: skip
        return
    start_idx = tl.maximum(tl.load(query_start_loc_ptr + req_idx), 0)
    end_idx = tl.minimum(tl.load(query_start_loc_ptr + req_idx + 1), num_tokens)
    for tile_start in range(
        start_idx + part * TILE_BLOCK_SIZE, end_idx, PARALLEL_TILES * TILE_BLOCK_SIZE
    ):
        offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offsets < end_idx
        pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
        for g in tl.static_range(NUM_GROUPS):
            meta_ptr = group_meta_ptr + g * 4
            block_table_ptr = tl.load(meta_ptr).to(tl.pointer_type(tl.int32))
            block_table_stride = tl.load(meta_ptr + 1).to(tl.int32)
            block_size = tl.load(meta_ptr + 2).to(tl.int32)
            is_circular = tl.load(meta_ptr + 3) != 0
            row_ptr = block_table_ptr + req_idx * block_table_stride
            block_indices, slot_offsets, has_slot = _group_block_and_offset(
                pos, block_size, is_circular, 1, 0, 1
            )
            valid = mask & has_slot
            if GATHER:
                block_numbers, _ = _gather_from_window(
                    row_ptr, block_table_stride, block_indices, valid, BLOCK_TABLE_WINDOW_SIZE,
                    False,
                )  # fmt: skip
            else:
                in_row = valid & (block_indices >= 0) & (block_indices < block_table_stride)
                block_numbers = tl.load(row_ptr + block_indices, mask=in_row, other=0)
            slot_ids = tl.where(has_slot, block_numbers * block_size + slot_offsets, PAD_ID)
            tl.store(slot_mappings_ptr + g * slot_mappings_stride + offsets, slot_ids, mask=mask)


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens", "num_reqs"])
def _group_programs_kernel(
    num_tokens, max_num_tokens, num_reqs, query_start_loc_ptr, positions_ptr, group_meta_ptr,
    slot_mappings_ptr, slot_mappings_stride,
    PAD_ID: tl.constexpr, TILE_BLOCK_SIZE: tl.constexpr, PARALLEL_TILES: tl.constexpr,
):  # fmt: skip
    # The library's grid (groups, num_reqs + 1, P), one block-table load a lane.
    group_idx = tl.program_id(0)
    req_idx = tl.program_id(1)
    part = tl.program_id(2)
    out_ptr = slot_mappings_ptr + group_idx * slot_mappings_stride
    if req_idx == num_reqs:
        _fill_pad(out_ptr, num_tokens + part * TILE_BLOCK_SIZE, max_num_tokens, PARALLEL_TILES,
                  PAD_ID, TILE_BLOCK_SIZE)  # fmt: skip
        return
    meta_ptr = group_meta_ptr + group_idx * 4
    block_table_ptr = tl.load(meta_ptr).to(tl.pointer_type(tl.int32))
    block_table_stride = tl.load(meta_ptr + 1).to(tl.int32)
    block_size = tl.load(meta_ptr + 2).to(tl.int32)
    is_circular = tl.load(meta_ptr + 3) != 0
    row_ptr = block_table_ptr + req_idx * block_table_stride
    start_idx = tl.maximum(tl.load(query_start_loc_ptr + req_idx), 0)
    end_idx = tl.minimum(tl.load(query_start_loc_ptr + req_idx + 1), num_tokens)
    for tile_start in range(
        start_idx + part * TILE_BLOCK_SIZE, end_idx, PARALLEL_TILES * TILE_BLOCK_SIZE
    ):
        offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offsets < end_idx
        pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
        block_indices, slot_offsets, has_slot = _group_block_and_offset(
            pos, block_size, is_circular, 1, 0, 1
        )
        in_row = mask & has_slot & (block_indices >= 0) & (block_indices < block_table_stride)
        block_numbers = tl.load(row_ptr + block_indices, mask=in_row, other=0)
        slot_ids = tl.where(has_slot, block_numbers * block_size + slot_offsets, PAD_ID)
        tl.store(out_ptr + offsets, slot_ids, mask=mask)


def programs_run(case, out, groups):
    n, m = case.shape.num_tokens, case.shape.max_num_tokens
    tile, parallel = choose_tiling(n, case.num_reqs)
    meta = group_metadata(case.block_tables[:groups], [case.block_size] * groups,
                          [False] * groups)  # fmt: skip

    def run():
        _group_programs_kernel[(groups, case.num_reqs + 1, parallel)](
            n, m, case.num_reqs, case.query_start_loc, case.positions, meta, out, out.stride(0),
            PAD_ID=-1, TILE_BLOCK_SIZE=tile, PARALLEL_TILES=parallel,
            num_warps=max(1, min(tile // 128, 8)),
        )  # fmt: skip

    return run


def loop_run(case, out, groups, gather):
    n, m = case.shape.num_tokens, case.shape.max_num_tokens
    tile, parallel = choose_tiling(n, case.num_reqs)
    meta = group_metadata(case.block_tables[:groups], [case.block_size] * groups,
                          [False] * groups)  # fmt: skip

    def run():
        _groups_loop_kernel[(case.num_reqs + 1, parallel)](
            n, m, case.num_reqs, case.query_start_loc, case.positions, meta, out, out.stride(0),
            PAD_ID=-1, TILE_BLOCK_SIZE=tile,
            BLOCK_TABLE_WINDOW_SIZE=window_size(tile, case.block_size),
            PARALLEL_TILES=parallel, NUM_GROUPS=groups, GATHER=gather,
            num_warps=max(1, min(tile // 128, 8)),
        )  # fmt: skip

    return run


def library_run(case, out, groups):
    def run():
        slotmap.compute_slot_mappings(
            case.query_start_loc, case.positions, case.block_tables[:groups],
            [case.block_size] * groups, num_tokens=case.shape.num_tokens,
            max_num_tokens=case.shape.max_num_tokens, out=out, validate=False,
        )  # fmt: skip

    return run


def main() -> None:
    from slotmap.bench import SHAPES, TINY_SHAPES, build_case, time_graph

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="groups.json")
    parser.add_argument("--cpu", action="store_true", help="a dry run on the interpreter")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    timer = (lambda run, calls, quick: (run(), 0.0)[1]) if args.cpu else time_graph
    shapes = (
        [("tiny-mixed", 16)]
        if args.cpu
        else [("huge", 128), ("huge", 16), ("prefill8192", 128), ("prefill8192", 16),
              ("huge", 128)]
    )  # fmt: skip
    results = []
    for shape, block in shapes:
        case = build_case({**SHAPES, **TINY_SHAPES}[shape], block, device)
        for groups in (1, 4):
            out = torch.empty(groups, case.shape.max_num_tokens, dtype=torch.int32,
                              device=device)  # fmt: skip
            want = case.expected[:groups]
            variants = {
                f"fused-{groups}": library_run(case, out, groups),
                f"loop-gather-{groups}": loop_run(case, out, groups, True),
                f"loop-direct-{groups}": loop_run(case, out, groups, False),
                f"programs-direct-{groups}": programs_run(case, out, groups),
            }
            for name, run in variants.items():
                for _ in range(2):
                    out.fill_(POISON)
                    run()
                    if not torch.equal(out, want):
                        raise AssertionError(f"{shape} b{block} {name}: not exact")
                us = timer(run, CALLS, False)
                if not torch.equal(out, want):
                    raise AssertionError(f"{shape} b{block} {name}: not exact after timing")
                gbps = case.bytes_moved(groups) / (us * 1e3) if us else 0.0
                print(f"{shape} b{block} {name:<16} {us:8.2f} us {gbps:7.0f} GB/s", flush=True)
                results.append(dict(shape=shape, block=block, variant=name, us=us, gbps=gbps))
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
