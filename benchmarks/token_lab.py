"""Experiment (not part of the package): where the token grid's time goes on the mixed shape.

Designs of ``slotmap.kernels.direct._compute_slot_mapping_direct_tokens_kernel`` (same
arguments, the library's helpers), each checked exactly against the reference before and after
timing, next to ladder microkernels on the same grid:

* ``library``: the shipped kernel: a likely decode run (two scalar loads say so) takes the
  guess, any other tile its first token's request, counted on a sample of the request ends
  (the first and last tile / 2 of them, one load a lane); checked after the block-table load.
  Its variants on the way there, each timed against ``run6`` in one process, are in
  ``results/h200-runs/token-lab-{likely-branch-full-ends,scalar-check,sampled-ends}.log``;
* ``run6``: the kernel of run 6 (commit 47126a2): the guess where its whole check (a
  reduction) says right, else the tile's first token's request; a decode tile's block-table
  load waits for the check;
* (until commit 47126a2 also ``one-request-first`` and ``no-guess``, the variants that led to
  run 6: ``results/h200-runs/token-lab.log``);
* ladder: ``loads2+store`` / ``loads3+store`` over the same number of 32-lane programs.

Run on the device: ``PYTHONPATH=$PWD python3 benchmarks/token_lab.py --out $OUT/lab.json``.
"""

from __future__ import annotations

import argparse
import json

# isort: off
import slotmap  # first: it chooses the backend before triton loads
import torch
import triton
import triton.language as tl
from slotmap.kernels.common import (
    _request_ends,
    token_launch_shape,
)
from sweep import _ladder_lanes_kernel  # benchmarks/sweep.py: the chain by itself

# isort: on

CALLS = 20


@triton.jit
def _count_from(ends, tile_start, TILE_BLOCK_SIZE: tl.constexpr):
    # The histogram way (as slotmap.kernels.common._histogram_requests).
    lane = tl.arange(0, TILE_BLOCK_SIZE)
    rel = ends - tile_start
    past = rel >= TILE_BLOCK_SIZE
    bins = tl.minimum(tl.maximum(rel, 0), TILE_BLOCK_SIZE - 1)
    req_idx = tl.cumsum(tl.histogram(bins, TILE_BLOCK_SIZE), 0)
    past_count = tl.sum(past.to(tl.int32), 0)
    return req_idx - tl.where(lane == TILE_BLOCK_SIZE - 1, past_count, 0)


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens", "num_reqs"])
def _run6_kernel(
    num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr, block_table_ptr,
    block_table_stride, block_size, slot_mapping_ptr, num_reqs,
    PAD_ID: tl.constexpr, TILE_BLOCK_SIZE: tl.constexpr, REQ_LANES: tl.constexpr,
    PAD_TILE_SIZE: tl.constexpr, EARLY_ENDS: tl.constexpr,
):  # fmt: skip
    # The direct token kernel of run 6 (commit 47126a2), linear caches only, its helpers
    # inlined: the block-table load's request waits for the guess's whole check.
    tile_idx = tl.program_id(0)
    token_tiles = tl.cdiv(num_tokens, TILE_BLOCK_SIZE)
    if tile_idx >= token_tiles:
        first = token_tiles * TILE_BLOCK_SIZE + (tile_idx - token_tiles) * PAD_TILE_SIZE
        offsets = first + tl.arange(0, PAD_TILE_SIZE)
        tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=offsets < max_num_tokens)
        return
    tile_start = tile_idx * TILE_BLOCK_SIZE
    lane = tl.arange(0, TILE_BLOCK_SIZE)
    offsets = tile_start + lane
    mask = offsets < num_tokens
    pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
    shift = num_tokens - num_reqs
    first_guess = tl.where(tile_start >= shift, tile_start - shift, tile_start)
    req_idx = first_guess + lane
    stops = tl.load(query_start_loc_ptr + req_idx + 1, mask=mask & (req_idx < num_reqs), other=-1)
    start = tl.load(query_start_loc_ptr + first_guess, mask=first_guess < num_reqs, other=-1)
    right = tl.min(((stops == offsets + 1) | ~mask).to(tl.int32), 0) == 1
    guessed_right = (right & (start == tile_start)).to(tl.int32)
    last = tl.minimum(tile_start + TILE_BLOCK_SIZE, num_tokens) - 1
    if EARLY_ENDS:
        ends = _request_ends(query_start_loc_ptr, num_reqs, REQ_LANES)
        first_req = tl.sum((ends <= tile_start).to(tl.int32), 0)
        last_req = tl.sum((ends <= last).to(tl.int32), 0)
        req_idx = tl.where(guessed_right == 1, req_idx, first_req)
    block_indices = pos // block_size
    in_row = mask & (pos >= 0) & (block_indices < block_table_stride)
    block_numbers = tl.load(block_table_ptr + req_idx * block_table_stride + block_indices,
                            mask=in_row & (req_idx < num_reqs), other=0)  # fmt: skip
    if guessed_right == 0:
        if not EARLY_ENDS:
            ends = _request_ends(query_start_loc_ptr, num_reqs, REQ_LANES)
            first_req = tl.sum((ends <= tile_start).to(tl.int32), 0)
            last_req = tl.sum((ends <= last).to(tl.int32), 0)
            req_idx = tl.zeros_like(req_idx) + first_req
            block_numbers = tl.load(block_table_ptr + req_idx * block_table_stride + block_indices,
                                    mask=in_row & (req_idx < num_reqs), other=0)  # fmt: skip
        if first_req != last_req:
            req_idx = _count_from(ends, tile_start, TILE_BLOCK_SIZE)
            block_numbers = tl.load(block_table_ptr + req_idx * block_table_stride + block_indices,
                                    mask=in_row & (req_idx < num_reqs), other=0)  # fmt: skip
    slot_ids = block_numbers * block_size + pos - block_indices * block_size
    slot_ids = tl.where(mask & (pos >= 0), slot_ids, PAD_ID)
    tl.store(slot_mapping_ptr + offsets, slot_ids, mask=offsets < max_num_tokens)


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens", "num_reqs"])
def _one_request_kernel(
    num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr, block_table_ptr,
    block_table_stride, block_size, slot_mapping_ptr, num_reqs,
    PAD_ID: tl.constexpr, TILE_BLOCK_SIZE: tl.constexpr, REQ_LANES: tl.constexpr,
):  # fmt: skip
    # Way 2 alone: the tile's request is the number of request ends at or below its first
    # token. Right only for batches whose tiles each lie inside one request (prefill4).
    tile_start = tl.program_id(0) * TILE_BLOCK_SIZE
    offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
    mask = offsets < num_tokens
    pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
    ends = _request_ends(query_start_loc_ptr, num_reqs, REQ_LANES)
    req = tl.sum((ends <= tile_start).to(tl.int32), 0)
    block_indices = pos // block_size
    block_numbers = tl.load(block_table_ptr + req * block_table_stride + block_indices,
                            mask=mask, other=0)  # fmt: skip
    slot_ids = block_numbers * block_size + pos - block_indices * block_size
    tl.store(slot_mapping_ptr + offsets, tl.where(mask, slot_ids, PAD_ID),
             mask=offsets < max_num_tokens)  # fmt: skip


def width_part(device, timer, record):
    """Does the width of the request-ends vector cost the chain? A batch of 4 x 1536-token
    requests (every 32-token tile inside one request; no padding) through way 2 alone, with
    the ends vector 4 lanes wide and padded to 512 (masked), beside the shipped kernel and
    the ladder on the same 192 programs."""
    from slotmap.bench import Shape, build_case

    case = build_case(Shape("prefill4", (1536,) * 4, 6144, "4 x 1536"), 128, device)
    n, table = case.shape.num_tokens, case.block_tables[0]
    out = torch.empty(n, dtype=torch.int32, device=device)
    want = case.expected[0]
    runs = {
        "library": library_run(case, out, 32),
        "run6": run6_run(case, out, 32),
    }
    for lanes in (4, 512):

        def run(lanes=lanes):
            _one_request_kernel[(n // 32,)](
                n, n, case.query_start_loc, case.positions, table, table.stride(0),
                case.block_size, out, case.num_reqs, PAD_ID=-1, TILE_BLOCK_SIZE=32,
                REQ_LANES=lanes, num_warps=1,
            )  # fmt: skip

        runs[f"one-request-only ends{lanes}"] = run
    timer(runs["library"], CALLS, False)  # the process's first timing reads low: discard it
    for name, run in runs.items():
        out.fill_(-999)
        run()
        if not torch.equal(out, want):
            raise AssertionError(f"prefill4 {name}: not exact")
        us = timer(run, CALLS, False)
        if not torch.equal(out, want):
            raise AssertionError(f"prefill4 {name}: not exact after timing")
        record(f"prefill4 b128 t32 {name}", us)
    if device == "cpu":
        return
    qsl = torch.arange(n + 1, dtype=torch.int32, device=device)
    pos = torch.randint(0, 4096, (n + 1,), dtype=torch.int64, device=device)
    ladder_table = torch.randint(0, 2**20, (64,), dtype=torch.int32, device=device)
    lout = torch.empty(n, dtype=torch.int32, device=device)
    for steps in (2, 3):
        us = timer(ladder_run(qsl, pos, ladder_table, lout, n, steps), CALLS, False)
        record(f"prefill4 ladder {n // 32}x32 loads{steps}+store", us)


def run6_run(case, out, tile):
    n, m = case.shape.num_tokens, case.shape.max_num_tokens
    _, grid, options = token_launch_shape(n, m, case.num_reqs, tile, None)
    table = case.block_tables[0]

    def run():
        _run6_kernel[grid](
            n, m, case.query_start_loc, case.positions, table, table.stride(0), case.block_size,
            out, case.num_reqs, PAD_ID=-1, TILE_BLOCK_SIZE=tile, REQ_LANES=options["REQ_LANES"],
            PAD_TILE_SIZE=options["PAD_TILE_SIZE"], EARLY_ENDS=options["EARLY_ENDS"],
            num_warps=options["num_warps"],
        )  # fmt: skip

    return run


def library_run(case, out, tile):
    def run():
        return slotmap.compute_slot_mapping_direct(
            case.query_start_loc, case.positions, case.block_tables[0], case.block_size,
            num_tokens=case.shape.num_tokens, max_num_tokens=case.shape.max_num_tokens,
            out=out, validate=False, tile_size=tile, token_parallel=True,
        )  # fmt: skip

    return run


def ladder_run(qsl, pos, table, out, n, steps):
    # ``steps`` dependent loads and a store, 32 lanes a program (the chain by itself).
    def run():
        _ladder_lanes_kernel[(triton.cdiv(n, 32),)](
            qsl, pos, table, out, n, STEPS=steps, LANES=32, num_warps=1
        )

    return run


def main() -> None:
    from slotmap.bench import SHAPES, build_case, time_graph

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="lab.json")
    parser.add_argument("--cpu", action="store_true", help="a dry run on the interpreter")
    parser.add_argument("--parts", nargs="+", default=["width", "variants"])
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    timer = (lambda run, calls, quick: (run(), 0.0)[1]) if args.cpu else time_graph
    results = []

    def record(label, us):
        print(f"{label:<44} {us:8.3f} us", flush=True)
        results.append(dict(label=label, us=us))

    if "width" in args.parts:
        # First: it also takes the process's first (unreliably low) timing on a throw-away.
        width_part(device, timer, record)
    shapes = (
        ()
        if "variants" not in args.parts
        else (("tiny-mixed", 16),)
        if args.cpu
        else (
            ("decode256", 128),
            ("mixed", 128),
            ("mixed", 16),
            ("decodes-first", 128),
            ("decode1024", 128),
            ("mixed", 128),
            ("decode256", 128),
        )
    )
    from slotmap.bench import TINY_SHAPES, Shape

    # vLLM's own order: the decodes first, the long requests at the batch's back.
    extra = {"decodes-first": Shape("decodes-first", (1,) * 256 + (1536,) * 4, 8192, "")}
    for shape, block in shapes:
        case = build_case({**SHAPES, **TINY_SHAPES, **extra}[shape], block, device)
        out = torch.empty(case.shape.max_num_tokens, dtype=torch.int32, device=device)
        want = case.expected[0]
        for tile in (32, 64):
            variants = {
                "library": library_run(case, out, tile),
                "run6": run6_run(case, out, tile),
            }
            for name, run in variants.items():
                for _ in range(2):
                    out.fill_(-999)
                    run()
                    if not torch.equal(out, want):
                        raise AssertionError(f"{shape} {name} t{tile}: not exact")
                us = timer(run, CALLS, False)
                if not torch.equal(out, want):
                    raise AssertionError(f"{shape} {name} t{tile}: not exact after timing")
                record(f"{shape} b{block} t{tile} {name}", us)
        if args.cpu:
            continue
        n = case.shape.num_tokens
        qsl = torch.arange(n + 1, dtype=torch.int32, device=device)
        pos = torch.randint(0, 4096, (n + 1,), dtype=torch.int64, device=device)
        table = torch.randint(0, 2**20, (64,), dtype=torch.int32, device=device)
        lout = torch.empty(n, dtype=torch.int32, device=device)
        programs = triton.cdiv(n, 32)
        for steps in (2, 3):
            us = timer(ladder_run(qsl, pos, table, lout, n, steps), CALLS, False)
            record(f"{shape} ladder {programs}x32 loads{steps}+store", us)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
