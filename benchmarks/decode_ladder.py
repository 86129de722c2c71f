"""Where decode256's direct kernel spends its time above the launch (not part of the package).

The direct kernel on decode256 (256 requests x 1 token) runs on the token grid: 8 programs
of 32 lanes on one warp, each lane a token. This ladder times, in a CUDA graph of 20 calls
on that same grid, kernels that each add one stage of what the direct kernel does, then the
library's kernel itself, so the differences say what each stage costs:

1. ``empty``: the launch on that grid;
2. ``store``: each lane stores a constant (the output's write);
3. ``pos``: position load -> store (one dependent load);
4. ``chain``: position -> block-table entry of the lane's own row -> slot store (the two-load
   chain every slot mapping has);
5. ``guess``: the chain, and beside it the token grid's three query_start_loc loads (each
   lane's request end, the tile's first start and last end) folded into a check of the
   guess after the table load, with a branch that would reload (never taken here);
6. ``direct``: the library's direct kernel, as ``compute_slot_mapping_direct`` launches it
   (``validate=False``, the plan cached).

Rungs 2-6 are checked exactly against the reference slots before and after timing (the
output poisoned first). The rungs take turns, ``--repeats`` rounds; the median of each
rung's rounds is reported. Run on the device: ``PYTHONPATH=$PWD python3
benchmarks/decode_ladder.py --out $OUT/decode-ladder.json``. Under ``TRITON_INTERPRET=1``
it checks every rung and times nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import triton
import triton.language as tl

import slotmap
from slotmap.bench import GRAPH_CAPTURES, SHAPES, build_case, time_graph

CALLS = 20
TILE = 32
PAD = -1


@triton.jit
def _empty(out_ptr):
    pass


@triton.jit(do_not_specialize=["n"])
def _store(out_ptr, n, TILE: tl.constexpr):
    offsets = tl.program_id(0) * TILE + tl.arange(0, TILE)
    tl.store(out_ptr + offsets, offsets, mask=offsets < n)


@triton.jit(do_not_specialize=["n"])
def _pos(pos_ptr, out_ptr, n, TILE: tl.constexpr):
    offsets = tl.program_id(0) * TILE + tl.arange(0, TILE)
    mask = offsets < n
    pos = tl.load(pos_ptr + offsets, mask=mask, other=0).to(tl.int32)
    tl.store(out_ptr + offsets, pos, mask=mask)


@triton.jit(do_not_specialize=["n"])
def _chain(pos_ptr, table_ptr, stride, block_size, out_ptr, n, TILE: tl.constexpr):
    offsets = tl.program_id(0) * TILE + tl.arange(0, TILE)
    mask = offsets < n
    pos = tl.load(pos_ptr + offsets, mask=mask, other=0).to(tl.int32)
    blocks = pos // block_size
    entry = tl.load(table_ptr + offsets * stride + blocks, mask=mask & (blocks < stride), other=0)
    tl.store(out_ptr + offsets, entry * block_size + pos % block_size, mask=mask)


@triton.jit(do_not_specialize=["n"])
def _guess(qsl_ptr, pos_ptr, table_ptr, stride, block_size, out_ptr, n, TILE: tl.constexpr):
    tile_start = tl.program_id(0) * TILE
    offsets = tile_start + tl.arange(0, TILE)
    mask = offsets < n
    pos = tl.load(pos_ptr + offsets, mask=mask, other=0).to(tl.int32)
    # The token grid's guess (decode: token t is request t), checked by three qsl loads.
    stops = tl.load(qsl_ptr + offsets + 1, mask=mask, other=-1)
    real = tl.minimum(n - tile_start, TILE)
    start = tl.load(qsl_ptr + tile_start)
    stop = tl.load(qsl_ptr + tile_start + real)
    likely = (start == tile_start) & (stop == tile_start + real)
    blocks = pos // block_size
    in_row = mask & (blocks < stride)
    entry = tl.load(table_ptr + offsets * stride + blocks, mask=in_row, other=0)
    lane_ok = (stops == offsets + 1) | ~mask
    settled = likely.to(tl.int32) & tl.min(lane_ok.to(tl.int32), 0)
    if settled == 0:  # the direct kernel finds every lane's request again here
        entry = tl.load(table_ptr + blocks, mask=in_row, other=0)
    tl.store(out_ptr + offsets, entry * block_size + pos % block_size, mask=mask)


def rungs(case, out):
    """(name, run, expected output or None) of each rung, on the case's tensors."""
    qsl, pos, table = case.query_start_loc, case.positions, case.block_tables[0]
    n, bs, stride = pos.numel(), case.block_size, table.stride(0)
    grid = (triton.cdiv(n, TILE),)
    slots = case.expected[0]
    opts = {"num_warps": 1}
    return [
        ("empty", lambda: _empty[grid](out, **opts), None),
        ("store", lambda: _store[grid](out, n, TILE, **opts), torch.arange(n, device=out.device)),
        ("pos", lambda: _pos[grid](pos, out, n, TILE, **opts), pos.int()),
        ("chain", lambda: _chain[grid](pos, table, stride, bs, out, n, TILE, **opts), slots),
        (
            "guess",
            lambda: _guess[grid](qsl, pos, table, stride, bs, out, n, TILE, **opts),
            slots,
        ),
        (
            "direct",
            lambda: slotmap.compute_slot_mapping_direct(
                qsl, pos, table, bs, num_tokens=n, max_num_tokens=n, out=out, validate=False
            ),
            slots,
        ),
    ]


def check(run, out, want, label) -> None:
    out.fill_(-999)
    run()
    if out.device.type == "cuda":
        torch.cuda.synchronize()
    got = out[: want.numel()].cpu()
    if not torch.equal(got, want.cpu().to(got.dtype)):
        raise SystemExit(f"{label}: output differs from the reference")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-sizes", nargs="+", type=int, default=[128, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interpreted else "cuda"
    shape = SHAPES["decode256"]
    results = []
    for block_size in args.block_sizes:
        case = build_case(shape, block_size, device)
        out = torch.full((shape.max_num_tokens,), -999, dtype=torch.int32, device=device)
        ladder = rungs(case, out)
        for name, run, want in ladder:
            if want is not None:
                check(run, out, want, f"b{block_size} {name}")
        if interpreted:
            print(f"b{block_size}: every rung exact (interpreter: nothing timed)")
            continue
        times: dict[str, list[float]] = {name: [] for name, _, _ in ladder}
        for _ in range(args.repeats):
            for name, run, _ in ladder:
                times[name].append(time_graph(run, CALLS, False, GRAPH_CAPTURES["cuda"]))
        for name, run, want in ladder:
            if want is not None:
                check(run, out, want, f"b{block_size} {name} (after timing)")
        previous = None
        for name, _, _ in ladder:
            us = statistics.median(times[name])
            step = "" if previous is None else f"{us - previous:+.3f}"
            print(f"decode256 b{block_size} {name:7s} {us:7.3f} us {step}", flush=True)
            results.append(
                dict(block_size=block_size, rung=name, us=us, rounds=times[name], exact=True)
            )
            previous = us
    if args.out and results:
        env = dict(
            gpu=torch.cuda.get_device_name(),
            torch=torch.__version__,
            triton=triton.__version__,
            calls_per_graph=CALLS,
        )
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(dict(env=env, results=results), f, indent=1)


if __name__ == "__main__":
    main()
