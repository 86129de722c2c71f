"""Context-parallel decode across real processes: check it against dense attention, then time it.

One process per rank (``slotmap.distributed.run_ranks``: nccl with one GPU per rank on NVIDIA
GPUs, gloo on the CPU). Every rank builds the same batch from a seed, keeps only the positions
it owns in its own paged KV cache, and runs lesson 07's decode step:

1. the slot mapping of the new tokens (the production kernel with this rank's CP arguments);
2. ``reshape_and_cache``: the new keys and values into this rank's cache through it;
3. ``paged_decode_attention`` over the rank's local sequence, through its block table;
4. one all_gather of (out, lse) and the log-sum-exp merge.

For each shape and world size the script first checks the merged output against dense
attention over the whole sequence (float64, on the rank's device), then times the step:
median of ``--repeats`` single steps, each between a barrier and a device synchronisation,
measured with device events on a GPU and the wall clock on the CPU: eager launches (as a
decode loop without graphs runs them: the host's launch overhead included) and, on a GPU, the
same work replayed from a CUDA graph (the device's cost). It also times the local part
(steps 1-3) and the slot mapping alone, so the communication's share can be read off.

On two H200s::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        PYTHONPATH=$PWD python3 benchmarks/cp_decode.py --world-sizes 1 2 --out $OUT/cp

On the CPU (the test suite runs this): ``python benchmarks/cp_decode.py --tiny --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch

import slotmap
from slotmap.bench import hardware
from slotmap.cp_attention import (
    CPProblem,
    build_rank_state,
    check_rank,
    decode_step,
    local_decode_step,
    slot_mapping_of,
)
from slotmap.distributed import RankContext, run_ranks

# name -> (requests, context length, heads, head_dim, block size, interleave)
SHAPES = {
    "tiny": CPProblem(seq_lens=(7, 1, 19), num_heads=2, head_dim=16, block_size=4, interleave=2),
    # 32 decode requests of 4k context: a busy serving batch.
    "batch32x4k": CPProblem(
        seq_lens=(4096,) * 32,
        num_heads=8,
        head_dim=128,
        block_size=16,
        interleave=1,
        dtype="bfloat16",
    ),
    # 4 requests of 32k context: where context parallelism is meant to help.
    "long4x32k": CPProblem(
        seq_lens=(32768,) * 4,
        num_heads=8,
        head_dim=128,
        block_size=16,
        interleave=1,
        dtype="bfloat16",
    ),
}
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 5e-3}


def _timer(device: torch.device):
    """start() / stop() -> ms of one region: device events on an accelerator, else the clock."""
    if device.type == "cuda":

        def run(fn):
            torch.cuda.synchronize(device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            return start.elapsed_time(end)

        return run

    def run(fn):
        begin = time.perf_counter()
        fn()
        return (time.perf_counter() - begin) * 1e3

    return run


def _graph_of(fn, device: torch.device):
    """``fn`` captured in a CUDA graph (warmed up on a side stream first): its replay."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_decode_rank(ctx: RankContext, problem: CPProblem, repeats: int, warmup: int) -> dict:
    """Check one decode step against dense attention on this rank, then time it: eager
    launches everywhere, and on a GPU also the same work replayed from a CUDA graph (the
    device's cost without the host's launch overhead; the all_gather is in the graph too)."""
    import torch.distributed as dist

    state = build_rank_state(problem, ctx.world_size, ctx.rank, ctx.device)
    merged, local = decode_step(state)
    errors = check_rank(state, merged, local)
    timed = _timer(ctx.device)
    parts = {
        "step": lambda: decode_step(state, validate=False),
        "local": lambda: local_decode_step(state, validate=False),
        "slot_mapping": lambda: slot_mapping_of(
            state,
            state.query_start_loc,
            state.positions,
            out=state.slot_mapping,
            validate=False,
        ),
    }
    modes = ["eager", "graph"] if ctx.device.type == "cuda" else ["eager"]
    medians: dict[str, float] = {}
    for mode in modes:
        for name, fn in parts.items():
            run = _graph_of(fn, ctx.device) if mode == "graph" else fn
            samples = []
            for i in range(warmup + repeats):
                if ctx.world_size > 1:
                    dist.barrier()  # the ranks start each step together
                ms = timed(run)
                if i >= warmup:
                    samples.append(ms)
            medians[f"{mode}_{name}_ms"] = statistics.median(samples)
    # A graph replays the same step: check that what it left is still right.
    merged_again = decode_step(state)[0]
    errors["after_timing"] = max(
        float((merged_again[0] - merged[0]).abs().max()),
        float((merged_again[1] - merged[1]).abs().max()),
    )
    return {
        "rank": ctx.rank,
        "device": str(ctx.device),
        "communication": ctx.communication,
        "local_tokens": int(state.local_lens.sum()),
        "cache_blocks": int(state.key_cache.shape[0]),
        "errors": errors,
        **medians,
    }


def run_shape(name: str, problem: CPProblem, world_size: int, repeats: int, warmup: int) -> dict:
    ranks = run_ranks(time_decode_rank, world_size, problem, repeats, warmup, timeout_s=600)
    # NaN must not slip through Python's max (max(0.0, nan) is 0.0): it counts as infinite.
    worst = max(
        math.inf if math.isnan(e) else e
        for r in ranks
        for e in (r["errors"]["merged_out"], r["errors"]["merged_lse"])
    )
    timings = sorted(key for key in ranks[0] if key.endswith("_ms"))
    return {
        "shape": name,
        "world_size": world_size,
        "problem": asdict(problem),
        "ranks": ranks,
        "max_error": worst,
        "tolerance": TOLERANCE[problem.dtype],
        "ok": worst <= TOLERANCE[problem.dtype]
        and all(r["errors"]["after_timing"] == 0.0 for r in ranks),
        # The slowest rank sets the step time.
        **{key: max(r[key] for r in ranks) for key in timings},
    }


def markdown(result: dict) -> str:
    hw = result["hardware"]
    graphs = any("graph_step_ms" in r for r in result["runs"])
    lines = [
        f"# Context-parallel decode step: {hw.get('gpu')}",
        "",
        f"torch {hw['torch']}, triton {hw['triton']}, driver {hw.get('driver')}, "
        f"{hw['date']}; one process per rank over {result['communication']}. Each time is "
        "the median of single steps, each started after a barrier, on the slowest rank: "
        "eager launches"
        + (", and the same work replayed from a CUDA graph" if graphs else "")
        + ". local = steps 1-3 (slot mapping, reshape_and_cache, paged attention), "
        "step = local + all_gather + merge.",
        "",
    ]
    header = ["shape", "ranks", "tokens per rank", "eager step ms", "eager local ms"]
    if graphs:
        header += ["graph step ms", "graph local ms", "graph slot mapping ms"]
    header += ["max error", "speed-up"]
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    key = "graph_step_ms" if graphs else "eager_step_ms"
    single = {r["shape"]: r[key] for r in result["runs"] if r["world_size"] == 1}
    for r in result["runs"]:
        base = single.get(r["shape"])
        cells = [
            r["shape"],
            str(r["world_size"]),
            "/".join(str(rank["local_tokens"]) for rank in r["ranks"]),
            f"{r['eager_step_ms']:.3f}",
            f"{r['eager_local_ms']:.3f}",
        ]
        if graphs:
            cells += [
                f"{r[name]:.3f}"
                for name in ("graph_step_ms", "graph_local_ms", "graph_slot_mapping_ms")
            ]
        cells += [
            f"{r['max_error']:.1e} {'ok' if r['ok'] else 'FAIL'}",
            f"{base / r[key]:.2f}x" if base and r["world_size"] > 1 else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if graphs:
        lines += ["", "speed-up: one rank's graph step over this one's (same shape)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shapes", nargs="+", default=["batch32x4k", "long4x32k"])
    parser.add_argument("--tiny", action="store_true", help="the CPU test's size, few repeats")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.tiny:
        args.shapes, args.repeats, args.warmup = ["tiny"], 3, 1
    runs = []
    for name in args.shapes:
        for world_size in args.world_sizes:
            run = run_shape(name, SHAPES[name], world_size, args.repeats, args.warmup)
            runs.append(run)
            graph = f", graph step {run['graph_step_ms']:.3f} ms" if "graph_step_ms" in run else ""
            print(
                f"{name:>12} W={world_size}: eager step {run['eager_step_ms']:.3f} ms{graph}, "
                f"error {run['max_error']:.1e} {'ok' if run['ok'] else 'FAIL'}",
                flush=True,
            )
    communication = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}[slotmap.BACKEND.name]
    result = {"hardware": hardware(), "communication": communication, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cp_decode.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "cp_decode.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if all(run["ok"] for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
