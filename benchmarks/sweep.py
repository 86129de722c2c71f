"""Tuning sweep for the H200 (not part of the package): launch shapes of the window and direct
kernels, the fused kernel's groups, and a ladder of dependent-load microkernels that shows
what the decode shapes' chain (indptr -> position -> block table -> store) costs by itself.

Run on the device: ``PYTHONPATH=$PWD python3 benchmarks/sweep.py --out $OUT/sweep.json``.
Every configuration is checked exactly against the reference before and after timing.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

import slotmap
from slotmap.bench import SHAPES, build_case, time_graph

CALLS = 20


@triton.jit
def _ladder_kernel(qsl_ptr, pos_ptr, table_ptr, out_ptr, STEPS: tl.constexpr):
    # STEPS dependent loads, then a store, one lane a program (the decode chain by itself).
    q = tl.program_id(0)
    value = q
    if STEPS >= 1:
        value = tl.load(qsl_ptr + q)
    if STEPS >= 2:
        value = tl.load(pos_ptr + value).to(tl.int32)
    if STEPS >= 3:
        value = tl.load(table_ptr + value // 128)
    if STEPS >= 0:
        tl.store(out_ptr + q, value)


@triton.jit
def _empty_kernel():
    pass


@triton.jit
def _ladder_lanes_kernel(
    qsl_ptr, pos_ptr, table_ptr, out_ptr, n, STEPS: tl.constexpr, LANES: tl.constexpr
):
    # The same chain, LANES requests a program: fewer programs, the same dependent loads.
    lanes = tl.program_id(0) * LANES + tl.arange(0, LANES)
    mask = lanes < n
    value = lanes
    if STEPS >= 1:
        value = tl.load(qsl_ptr + lanes, mask=mask, other=0)
    if STEPS >= 2:
        value = tl.load(pos_ptr + value, mask=mask, other=0).to(tl.int32)
    if STEPS >= 3:
        value = tl.load(table_ptr + value // 128, mask=mask, other=0)
    tl.store(out_ptr + lanes, value, mask=mask)


def ladder_lanes(results):
    # 256 one-token requests handled by 256 / LANES programs: is 1.5 us within reach at all?
    n = 256
    qsl = torch.arange(n + 1, dtype=torch.int32, device="cuda")
    pos = torch.randint(0, 4096, (n + 1,), dtype=torch.int64, device="cuda")
    table = torch.randint(0, 2**20, (64,), dtype=torch.int32, device="cuda")
    out = torch.empty(n, dtype=torch.int32, device="cuda")
    for lanes in (1, 32, 256):
        programs = n // lanes
        warps = 1 if lanes <= 32 else 4
        us = time_graph(lambda p=programs, w=warps: _empty_kernel[(p,)](num_warps=w), CALLS, False)
        results.append(dict(label=f"ladder-lanes p{programs} empty", us=us))
        print(f"ladder-lanes p{programs} w{warps} empty {us:9.3f} us", flush=True)
        for steps in (0, 1, 2, 3):

            def run(steps=steps, lanes=lanes, programs=programs, warps=warps):
                _ladder_lanes_kernel[(programs,)](
                    qsl, pos, table, out, n, STEPS=steps, LANES=lanes, num_warps=warps
                )

            us = time_graph(run, CALLS, False)
            label = f"ladder-lanes p{programs} w{warps} loads{steps}+store"
            print(f"{label:<48} {us:9.3f} us", flush=True)
            results.append(dict(label=label, us=us))


def check(out, want, label):
    if not torch.equal(out, want):
        raise AssertionError(f"{label}: not exact")


def checked_graph_time(run, out, want, label):
    """``run``'s graph-replay time in µs, its output checked exactly before and after timing."""
    out.fill_(-999)
    run()
    torch.cuda.synchronize()
    check(out, want, label)
    out.fill_(-999)
    us = time_graph(run, CALLS, quick=False)
    check(out, want, label)
    return us


def sweep_single(case, launcher_name, configs, results):
    launcher = {
        "window": slotmap.compute_slot_mapping,
        "direct": slotmap.compute_slot_mapping_direct,
    }[launcher_name]
    m = case.shape.max_num_tokens
    out = torch.empty(m, dtype=torch.int32, device="cuda")
    want = case.expected[0]
    for tile, warps, parallel in configs:
        label = (
            f"{case.shape.name} b{case.block_size} {launcher_name} t{tile} w{warps} p{parallel}"
        )

        def run(tile=tile, warps=warps, parallel=parallel):
            extra = {} if launcher_name == "window" else {"token_parallel": False}
            return launcher(
                case.query_start_loc,
                case.positions,
                case.block_tables[0],
                case.block_size,
                num_tokens=case.shape.num_tokens,
                max_num_tokens=m,
                out=out,
                validate=False,
                tile_size=tile,
                num_warps=warps,
                parallel_tiles=parallel,
                **extra,
            )

        us = checked_graph_time(run, out, want, label)
        gbps = case.bytes_moved(1) / us / 1e3
        print(f"{label:<48} {us:9.3f} us {gbps:8.0f} GB/s", flush=True)
        results.append(dict(label=label, us=us, gbps=gbps))


def sweep_fused(case, configs, results):
    m = case.shape.max_num_tokens
    for groups in (1, 2, 4):
        out = torch.empty(groups, m, dtype=torch.int32, device="cuda")
        want = case.expected[:groups]
        for tile, warps, parallel in configs:
            label = (
                f"{case.shape.name} b{case.block_size} fused-{groups} t{tile} w{warps} p{parallel}"
            )

            def run(tile=tile, warps=warps, parallel=parallel, groups=groups, out=out):
                return slotmap.compute_slot_mappings(
                    case.query_start_loc,
                    case.positions,
                    case.block_tables[:groups],
                    [case.block_size] * groups,
                    num_tokens=case.shape.num_tokens,
                    max_num_tokens=m,
                    out=out,
                    validate=False,
                    tile_size=tile,
                    num_warps=warps,
                    parallel_tiles=parallel,
                )

            us = checked_graph_time(run, out, want, label)
            print(f"{label:<48} {us:9.3f} us", flush=True)
            results.append(dict(label=label, us=us))


def sweep_tokens(case, configs, results, groups_list=(0, 1, 4)):
    """The token grid (``token_parallel=True``): direct (groups 0) and fused over 1 and 4
    groups for each (tile, warps), next to an empty kernel on the same grid."""
    from slotmap.kernels.token_grid import token_launch_shape

    m, n = case.shape.max_num_tokens, case.shape.num_tokens
    for tile, warps in configs:
        _, grid, options = token_launch_shape(n, m, case.num_reqs, tile, warps)
        for groups in groups_list:
            g = max(groups, 1)
            out = torch.empty(g, m, dtype=torch.int32, device="cuda")
            want = case.expected[:g]
            name = "direct" if groups == 0 else f"fused-{groups}"
            label = f"{case.shape.name} b{case.block_size} tokens {name} t{tile} w{warps}"

            def run(tile=tile, warps=warps, groups=groups, out=out):
                if groups == 0:
                    return slotmap.compute_slot_mapping_direct(
                        case.query_start_loc,
                        case.positions,
                        case.block_tables[0],
                        case.block_size,
                        num_tokens=n,
                        max_num_tokens=m,
                        out=out[0],
                        validate=False,
                        tile_size=tile,
                        num_warps=warps,
                        token_parallel=True,
                    )
                return slotmap.compute_slot_mappings(
                    case.query_start_loc,
                    case.positions,
                    case.block_tables[:groups],
                    [case.block_size] * groups,
                    num_tokens=n,
                    max_num_tokens=m,
                    out=out,
                    validate=False,
                    tile_size=tile,
                    num_warps=warps,
                    token_parallel=True,
                )

            us = checked_graph_time(run, out, want, label)
            gbps = case.bytes_moved(g) / us / 1e3
            print(f"{label:<52} {us:9.3f} us {gbps:8.0f} GB/s", flush=True)
            results.append(dict(label=label, us=us, gbps=gbps))
        w = options["num_warps"]
        for groups in sorted({max(x, 1) for x in groups_list}):
            gg = (groups, grid[0]) if groups > 1 else grid
            us = time_graph(lambda gg=gg, w=w: _empty_kernel[gg](num_warps=w), CALLS, False)
            label = f"{case.shape.name} b{case.block_size} tokens empty-{groups} t{tile} w{w}"
            print(f"{label:<52} {us:9.3f} us", flush=True)
            results.append(dict(label=label, us=us))


def ladder(results):
    for programs in (257, 1025):
        qsl = torch.arange(programs, dtype=torch.int32, device="cuda")
        pos = torch.randint(0, 4096, (programs,), dtype=torch.int64, device="cuda")
        table = torch.randint(0, 2**20, (64,), dtype=torch.int32, device="cuda")
        out = torch.empty(programs, dtype=torch.int32, device="cuda")
        for warps in (1, 4):
            us = time_graph(
                lambda p=programs, w=warps: _empty_kernel[(p,)](num_warps=w), CALLS, False
            )
            label = f"ladder n{programs} w{warps} empty"
            print(f"{label:<48} {us:9.3f} us", flush=True)
            results.append(dict(label=label, us=us))
            for steps in (0, 1, 2, 3):

                def run(steps=steps, warps=warps):
                    _ladder_kernel[(programs,)](qsl, pos, table, out, STEPS=steps, num_warps=warps)  # noqa: B023

                us = time_graph(run, CALLS, False)
                label = f"ladder n{programs} w{warps} loads{steps}+store"
                print(f"{label:<48} {us:9.3f} us", flush=True)
                results.append(dict(label=label, us=us))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="sweep.json")
    parser.add_argument("--parts", nargs="+", default=["ladder", "big", "small", "fused"])
    args = parser.parse_args()
    results = []
    if "tokens" in args.parts:
        # The first timing in a process reads low (benchmarks/NOTES.md): take one to discard.
        warm = build_case(SHAPES["decode256"], 128, "cuda")
        sweep_tokens(warm, [(64, 1)], [], (0,))
        # The token grid over tile x warps on every shape, the request grid beside it.
        small = [(32, 1), (64, 1), (64, 2), (128, 1), (128, 2), (128, 4), (256, 4), (512, 4)]
        for shape, block in (
            ("decode256", 128),
            ("decode1024", 128),
            ("mixed", 128),
            ("mixed", 16),
            ("prefill8192", 128),
            ("decode256", 16),
            ("decode1024", 16),
        ):
            case = build_case(SHAPES[shape], block, "cuda")
            sweep_tokens(case, small, results)
            sweep_single(case, "direct", [(None, None, None)], results)
        if "huge" in args.parts:
            for block in (128, 16):
                case = build_case(SHAPES["huge"], block, "cuda")
                sweep_tokens(case, [(1024, 8), (1024, 4), (2048, 8), (512, 4)], results, (0, 1))
                sweep_single(case, "direct", [(None, None, None)], results)
    if "ladder" in args.parts:
        ladder(results)
    if "lanes" in args.parts:
        ladder_lanes(results)
    if "defaults" in args.parts:
        # The launchers' own choices next to a few alternatives, on the latency-bound shapes.
        for shape in ("decode256", "decode1024", "mixed", "prefill8192"):
            case = build_case(SHAPES[shape], 128, "cuda")
            configs = [
                (None, None, None),
                (None, 4, None),
                (1024, 4, 2),
                (1024, 8, 2),
                (64, 2, None),
                (32, 1, None),
                (512, 4, None),
            ]
            for name in ("direct", "window"):
                sweep_single(case, name, configs, results)
            sweep_fused(case, [(None, None, None), (None, 4, None), (1024, 4, None)], results)
    if "big" in args.parts:
        big = [
            (1024, 4, 1),
            (1024, 4, None),
            (1024, 8, None),
            (2048, 8, None),
            (4096, 8, None),
            (4096, 16, None),
            (512, 2, None),
            (512, 4, None),
        ]
        for block in (128, 16):
            case = build_case(SHAPES["huge"], block, "cuda")
            for name in ("direct", "window"):
                sweep_single(case, name, big, results)
        case = build_case(SHAPES["prefill8192"], 128, "cuda")
        prefill = [
            (1024, 4, 1),
            (1024, 4, None),
            (512, 2, None),
            (256, 1, None),
            (512, 4, None),
            (2048, 8, None),
            (128, 1, None),
            (256, 2, None),
        ]
        for name in ("direct", "window"):
            sweep_single(case, name, prefill, results)
    if "small" in args.parts:
        small = [
            (1024, 4, 1),
            (1024, 1, 1),
            (256, 1, 1),
            (128, 1, 1),
            (64, 1, 1),
            (32, 1, 1),
            (16, 1, 1),
        ]
        for shape in ("decode256", "decode1024", "mixed"):
            case = build_case(SHAPES[shape], 128, "cuda")
            extra = (
                [(1024, 4, 2), (2048, 8, 1), (512, 2, 3), (256, 1, 6)] if shape == "mixed" else []
            )
            for name in ("direct", "window"):
                sweep_single(case, name, small + extra, results)
    if "fused" in args.parts:
        fused = [(None, None, None), (None, 4, None), (1024, 4, None), (16, 1, 1), (32, 1, 1)]
        for shape in ("decode256", "mixed", "huge"):
            case = build_case(SHAPES[shape], 128, "cuda")
            sweep_fused(case, fused, results)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
