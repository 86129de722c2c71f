"""``slotmap bench``: time every slot-mapping kernel against the floor, on the active backend.

For each reference shape (``SHAPES``, docs/performance.md) and block size it times, eagerly
and as replays of a captured graph of ``--graph-calls`` calls (CUDA graphs on a GPU; on an
NPU, torch_npu's ACL graphs, written against their documented API and not yet run on
hardware: ``GRAPH_CAPTURES``):

* ``window``: the production bounded-window kernel (``compute_slot_mapping``);
* ``direct``: one block-table load per token (``compute_slot_mapping_direct``);
* ``fused-1``, ``fused-2``, ``fused-4``: the multi-group kernel with 1, 2 and 4 groups;
* ``torch``: the vectorised PyTorch reference (``slot_mapping_torch``);
* ``empty``: an empty Triton kernel on the window kernel's grid (the launch floor);
* ``copy``: a device-to-device copy of as many bytes as the kernels must move (the
  bandwidth floor).

Every variant is hot-path: ``validate=False``, ``num_tokens`` given, a persistent ``out``.
Each is checked exactly against the reference before timing (output poisoned first) and
after timing (the output the timed calls left, poisoned before they ran). The launchers'
own Python cost is measured against a raw ``kernel[grid](...)`` launch, with validation on
and off. Results: a JSON file (``{"hardware": ..., "records": [...], "launcher": [...]}``),
a markdown table with the project's performance targets (docs/performance.md), and a plot.
Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from torch import Tensor

import slotmap
from slotmap.kernels import c_launch
from slotmap.kernels.fused_groups import group_metadata, plan_slot_mappings
from slotmap.kernels.launch import LaunchKnobs, Plan, launch_shape
from slotmap.kernels.slot_mapping import (
    _compute_slot_mapping_kernel,
    slot_mapping_args,
    window_kernel_constants,
)
from slotmap.layout import SlotLayout, group_layouts
from slotmap.serving import GroupsMapper, SlotMapper, Step, serving_trace, step_tensors

POISON = -999  # fills every output before a run: never a slot, never pad_id
VARIANTS = [
    "window",
    "direct",
    "fused-1",
    "fused-2",
    "fused-4",
    "fused-3-cp2",
    "torch",
    "empty",
    "copy",
]
# fused-3-cp2: a hybrid model's three kinds of group under context parallelism 2 (rank 0):
# full attention sharded across the ranks, a sliding window unsharded, a state group disabled.
GROUP_KINDS = dict(
    cp_world_size=2,
    cp_rank=0,
    dcp_sharded=[True, False, False],
    slot_mapping_enabled=[True, True, False],
)
MODES = ["eager", "graph"]


@dataclass(frozen=True)
class Shape:
    name: str
    lengths: tuple[int, ...]  # tokens of each request
    max_num_tokens: int  # the persistent output buffer's length (>= sum of lengths)
    about: str

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)


SHAPES = {
    s.name: s
    for s in [
        Shape("decode256", (1,) * 256, 256, "256 requests x 1 token"),
        Shape("decode1024", (1,) * 1024, 1024, "1024 requests x 1 token"),
        Shape("mixed", (1536,) * 4 + (1,) * 256, 8192, "4 x 1536 + 256 x 1, padded to 8192"),
        Shape("prefill8192", (8192,), 8192, "1 request x 8192 tokens"),
        Shape("huge", (65536,) * 64, 65536 * 64, "64 requests x 65536 tokens"),
    ]
}
# Small enough for Triton's CPU interpreter (the test suite runs the bench on these).
TINY_SHAPES = {
    s.name: s
    for s in [
        Shape("tiny-decode", (1,) * 5, 8, "5 requests x 1 token, padded to 8"),
        Shape("tiny-mixed", (37, 1, 0, 70, 1), 128, "37 + 1 + 0 + 70 + 1, padded to 128"),
    ]
}
DEFAULT_BLOCK_SIZES = (128, 16)
# The project's targets (docs/performance.md), graph mode, µs per call, latency-bound shapes.
LATENCY_TARGETS = {"decode256": 1.68, "decode1024": 2.0, "mixed": 2.0, "prefill8192": 4.0}
BANDWIDTH_TARGET_GBPS = 2000.0
BANDWIDTH_TARGET_OF_COPY = 2 / 3
FUSED_TARGET = 1.3
GROUP_KINDS_TARGET = 1.1
LAUNCHER_TARGET = 1.15
TARGETS_HEADING = "## Performance targets (docs/performance.md)"


@triton.jit
def _empty_kernel():
    # The launch floor: a kernel that does nothing, on the same grid as the real one.
    pass


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
@dataclass
class Case:
    shape: Shape
    block_size: int
    query_start_loc: Tensor
    positions: Tensor
    block_tables: list[Tensor]  # one per group, 4 groups
    expected: Tensor  # [4, max_num_tokens] int32, from the reference

    @property
    def num_reqs(self) -> int:
        return len(self.shape.lengths)

    def bytes_moved(self, groups: int = 1) -> int:
        """The fewest bytes a slot mapping must move: positions read once, outputs written."""
        return 8 * self.shape.num_tokens + 4 * groups * self.shape.max_num_tokens


def build_case(shape: Shape, block_size: int, device: str, seed: int = 0) -> Case:
    """Realistic positions (prefill chunks contiguous, decode tokens at random context
    lengths) and random physical block numbers up to the int32 limit of the slots."""
    generator = torch.Generator().manual_seed(seed)
    context = 4096  # decode tokens sit somewhere in a 4096-token context
    positions, starts = [], [0]
    for n in shape.lengths:
        if n == 1:
            first = int(torch.randint(0, context, (1,), generator=generator))
        else:
            first = int(torch.randint(0, 512, (1,), generator=generator)) if n < 8192 else 0
        positions.append(torch.arange(first, first + n, dtype=torch.int64))
        starts.append(starts[-1] + n)
    positions = torch.cat(positions) if positions else torch.zeros(0, dtype=torch.int64)
    largest = int(positions.max()) if positions.numel() else 0
    width = largest // block_size + 1
    limit = (2**31 - 1) // block_size - 1  # every slot fits in int32
    tables = [
        torch.randint(0, limit, (len(shape.lengths), width), generator=generator).to(torch.int32)
        for _ in range(4)
    ]
    qsl = torch.tensor(starts, dtype=torch.int32)
    expected = slotmap.slot_mappings_torch(
        qsl, positions, tables, [block_size] * 4, max_num_tokens=shape.max_num_tokens
    )
    return Case(
        shape,
        block_size,
        qsl.to(device),
        positions.to(device),
        [t.to(device) for t in tables],
        expected.to(device),
    )


# ---------------------------------------------------------------------------------------------
# Variants: each is (run, check) where run() launches once and check() compares the output
# ---------------------------------------------------------------------------------------------
@dataclass
class Variant:
    name: str
    run: Callable[[], object]
    poison: Callable[[], None]
    check: Callable[[], bool]  # exact against the reference (copy: against its source)
    bytes: int | None  # what the GB/s column counts (None: no bytes, the empty kernel)


def single_group_args(case: Case) -> tuple[tuple, dict]:
    args = (case.query_start_loc, case.positions, case.block_tables[0], case.block_size)
    options = dict(
        num_tokens=case.shape.num_tokens, max_num_tokens=case.shape.max_num_tokens, validate=False
    )
    return args, options


def make_variants(case: Case, names: list[str]) -> list[Variant]:
    device = case.positions.device
    m = case.shape.max_num_tokens
    args, options = single_group_args(case)
    variants = []
    for name in names:
        if name in ("window", "direct", "torch"):
            launcher = {
                "window": slotmap.compute_slot_mapping,
                "direct": slotmap.compute_slot_mapping_direct,
                "torch": slotmap.slot_mapping_torch,
            }[name]
            out = torch.empty(m, dtype=torch.int32, device=device)
            want = case.expected[0]

            def run(launcher=launcher, out=out):
                return launcher(*args, **options, out=out)

            variants.append(
                Variant(
                    name,
                    run,
                    lambda out=out: out.fill_(POISON),
                    lambda out=out, want=want: torch.equal(out, want),
                    case.bytes_moved(1),
                )
            )
        elif name.startswith("fused-"):
            groups = int(name.split("-")[1])
            out = torch.empty(groups, m, dtype=torch.int32, device=device)
            want = case.expected[:groups]
            tables = case.block_tables[:groups]

            def run(out=out, tables=tables, groups=groups):
                return slotmap.compute_slot_mappings(
                    case.query_start_loc,
                    case.positions,
                    tables,
                    [case.block_size] * groups,
                    **options,
                    out=out,
                )

            variants.append(
                Variant(
                    name,
                    run,
                    lambda out=out: out.fill_(POISON),
                    lambda out=out, want=want: torch.equal(out, want),
                    case.bytes_moved(groups),
                )
            )
        elif name == "fused-3-cp2":
            out = torch.empty(3, m, dtype=torch.int32, device=device)
            tables = [*case.block_tables[:2], None]
            fused = (case.query_start_loc, case.positions, tables, [case.block_size] * 3)
            want = slotmap.slot_mappings_torch(*fused, **GROUP_KINDS, max_num_tokens=m)

            def run(out=out, fused=fused):
                return slotmap.compute_slot_mappings(*fused, **GROUP_KINDS, **options, out=out)

            variants.append(
                Variant(
                    name,
                    run,
                    lambda out=out: out.fill_(POISON),
                    lambda out=out, want=want: torch.equal(out, want),
                    case.bytes_moved(3),
                )
            )
        elif name == "empty":
            grid, launch_options = empty_launch(case)
            variants.append(
                Variant(
                    name,
                    lambda grid=grid, o=launch_options: _empty_kernel[grid](**o),
                    lambda: None,
                    lambda: True,
                    None,
                )
            )
        elif name == "copy":
            # A copy reads and writes n bytes: 2n = the bytes the kernels must move.
            n = max(case.bytes_moved(1) // 2, 1)
            source = torch.randint(1, 256, (n,), dtype=torch.uint8, device=device)
            target = torch.empty_like(source)
            variants.append(
                Variant(
                    name,
                    lambda s=source, t=target: t.copy_(s),
                    lambda t=target: t.fill_(0),  # the source holds no zero
                    lambda s=source, t=target: torch.equal(s, t),
                    2 * n,
                )
            )
        else:
            raise ValueError(f"unknown variant {name!r}")
    return variants


def empty_launch(case: Case) -> tuple[tuple[int, int], dict]:
    """The window launcher's default grid and warps for this batch (the floor's launch)."""
    _, parallel, options = launch_shape(case.shape.num_tokens, case.num_reqs, None, None, None)
    return (case.num_reqs + 1, parallel), options


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------
def synchronize() -> None:
    if slotmap.BACKEND.name == "cuda":
        torch.cuda.synchronize()
    elif slotmap.BACKEND.name == "npu":
        torch.npu.synchronize()  # type: ignore[attr-defined]


def time_eager(run: Callable[[], object], quick: bool) -> float:
    """µs per call of back-to-back Python launches, synchronised at the end: the larger of
    the host's enqueue cost and the device's work, as an eager caller sees it."""
    if not slotmap.BACKEND.interpreted:
        n = 100 if quick else 500
        return host_us_per_call({"run": run}, {"run": n}, 3 if quick else 7)[0]["run"]
    samples = []
    for _ in range(1 if quick else 20):
        start = time.perf_counter()
        run()
        synchronize()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


@dataclass(frozen=True)
class GraphCapture:
    """One backend's graph capture behind one interface: the same stream, capture and replay
    calls on ``torch.cuda`` (CUDA graphs) or on ``torch.npu`` (torch_npu's ACL graphs:
    ``torch.npu.NPUGraph`` and the ``torch.npu.graph`` context manager)."""

    backend: str  # "cuda" or "npu": the torch module that holds the API
    label: str  # how reports name it
    graph_class: str  # the graph object's class in that module
    verified: bool  # whether this path has run on hardware

    def device_module(self):
        return getattr(torch, self.backend)  # torch.npu exists once torch_npu is imported


GRAPH_CAPTURES = {
    "cuda": GraphCapture("cuda", "CUDA graph", "CUDAGraph", verified=True),
    # Written against torch_npu's documented graph API; no NPU has run it.
    "npu": GraphCapture("npu", "NPU graph (torch_npu ACL graph)", "NPUGraph", verified=False),
}


def graph_capture(backend: str) -> GraphCapture | None:
    """The backend's graph capture, or None where there is none (the CPU interpreter)."""
    return GRAPH_CAPTURES.get(backend)


def bench_modes(requested: list[str], backend: str) -> tuple[list[str], list[str]]:
    """(modes that run, modes skipped): graph mode needs a graph capture."""
    runs = [m for m in requested if m == "eager" or graph_capture(backend) is not None]
    return runs, [m for m in requested if m not in runs]


def time_graph(run: Callable[[], object], calls: int, quick: bool, capture: GraphCapture) -> float:
    """Median µs per call inside a captured graph of ``calls`` calls (device cost)."""
    from triton.testing import do_bench

    device = capture.device_module()
    stream = device.Stream()
    stream.wait_stream(device.current_stream())
    with device.stream(stream):  # warm up outside the capture (compiles, caches)
        for _ in range(3):
            run()
    device.current_stream().wait_stream(stream)
    graph = getattr(device, capture.graph_class)()
    with device.graph(graph):
        for _ in range(calls):
            run()
    graph.replay()
    device.synchronize()
    warmup, rep = (5, 20) if quick else (25, 100)
    return do_bench(graph.replay, warmup=warmup, rep=rep, return_mode="median") * 1e3 / calls


def measure_case(
    case: Case, names: list[str], modes: list[str], graph_calls: int, quick: bool, log
) -> list[dict]:
    records = []
    for variant in make_variants(case, names):
        variant.poison()
        variant.run()
        synchronize()
        if not variant.check():
            raise AssertionError(
                f"{variant.name} on {case.shape.name}/b{case.block_size}: "
                "output differs from the reference before timing"
            )
        for mode in modes:
            variant.poison()
            synchronize()
            if mode == "graph":
                capture = graph_capture(slotmap.BACKEND.name)
                us = time_graph(variant.run, graph_calls, quick, capture)
            else:
                us = time_eager(variant.run, quick)
            synchronize()
            if not variant.check():
                raise AssertionError(
                    f"{variant.name} on {case.shape.name}/b{case.block_size} ({mode}): "
                    "output differs from the reference after timing"
                )
            gbps = None if variant.bytes is None else variant.bytes / (us * 1e-6) / 1e9
            record = dict(
                shape=case.shape.name,
                block_size=case.block_size,
                variant=variant.name,
                mode=mode,
                us=round(us, 4),
                gbps=None if gbps is None else round(gbps, 2),
                exact=True,
                bytes=variant.bytes,
            )
            records.append(record)
            log(
                f"  {case.shape.name:<12} b{case.block_size:<4} {variant.name:<8} {mode:<6}"
                f" {us:10.3f} us" + ("" if gbps is None else f" {gbps:9.1f} GB/s")
            )
    return records


# ---------------------------------------------------------------------------------------------
# The launcher's own cost
# ---------------------------------------------------------------------------------------------
def raw_window_launch(case: Case, out: Tensor) -> Callable[[], object]:
    """``kernel[grid](...)`` with exactly what the launcher would pass, worked out once."""
    num_tokens, m = case.shape.num_tokens, case.shape.max_num_tokens
    tile, parallel, options = launch_shape(num_tokens, case.num_reqs, None, None, None)
    grid = (case.num_reqs + 1, parallel)
    args = slot_mapping_args(
        num_tokens,
        m,
        case.query_start_loc,
        case.positions,
        case.block_tables[0],
        case.block_size,
        out,
    )
    constants = dict(
        **window_kernel_constants(SlotLayout.of(case.block_size), tile, parallel),
        window_trace_ptr=None,
        window_trace_width=0,
        TRACE_WINDOWS=False,
        **options,
    )
    return lambda: _compute_slot_mapping_kernel[grid](*args, **constants)


def host_us_per_call(
    runs: dict[str, Callable[[], object]], calls: dict[str, int], repeats: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Wall time per call of ``calls[name]`` back-to-back calls of each run, the runs taking
    turns (in a rotated order) ``repeats`` times, so that a drift of the host's speed lands
    on all of them alike. Returns each run's median µs per call and the median over the turns
    of its ratio to the first run's time in the same turn."""
    names = list(runs)
    for name in names:
        for _ in range(min(calls[name], 20)):
            runs[name]()
    synchronize()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(repeats):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            start = time.perf_counter()
            for _ in range(calls[name]):
                runs[name]()
            synchronize()
            samples[name].append((time.perf_counter() - start) * 1e6 / calls[name])
    base = samples[names[0]]
    us = {name: statistics.median(samples[name]) for name in names}
    ratios = {
        name: statistics.median(t / b for t, b in zip(samples[name], base, strict=True))
        for name in names
    }
    return us, ratios


def raw_fused_launch(case: Case, out: Tensor) -> Callable[[], object]:
    """The fused kernel's ``kernel[grid](...)`` with the plan its launcher works out, once."""
    tables = case.block_tables[: out.shape[0]]
    layouts = group_layouts(
        len(tables),
        [case.block_size] * len(tables),
        None,
        cp_world_size=1,
        cp_rank=0,
        cp_interleave=1,
        pad_id=slotmap.PAD_SLOT_ID,
    )
    n, m = case.shape.num_tokens, case.shape.max_num_tokens
    qsl, positions = case.query_start_loc, case.positions
    plan, _, _ = plan_slot_mappings(
        layouts, LaunchKnobs(), qsl, positions, tuple(tables), None, n, m, out, False
    )
    meta = group_metadata(tables, layouts)
    rows = min(t.shape[0] for t in tables)
    args = (n, m, case.num_reqs, qsl, positions, qsl, rows, meta, out, out.stride(0))
    return lambda: raw_launch(plan, args)


def measure_launcher(case: Case, quick: bool, log) -> list[dict]:
    """Host µs per call of the window and the fused (2 groups) launchers, validation off and
    on, each against its own raw ``kernel[grid](...)`` in the same turns."""
    m = case.shape.max_num_tokens
    out = torch.empty(m, dtype=torch.int32, device=case.positions.device)
    out2 = torch.empty(2, m, dtype=torch.int32, device=case.positions.device)
    args, options = single_group_args(case)
    tables, sizes = case.block_tables[:2], [case.block_size] * 2
    fused = (case.query_start_loc, case.positions, tables, sizes)
    groups = {
        "": (
            out,
            case.expected[0],
            {
                "raw": raw_window_launch(case, out),
                "validate-off": lambda: slotmap.compute_slot_mapping(*args, **options, out=out),
                "validate-on": lambda: slotmap.compute_slot_mapping(
                    *args, **dict(options, validate=True), out=out
                ),
            },
        ),
        "fused-2 ": (
            out2,
            case.expected[:2],
            {
                "raw": raw_fused_launch(case, out2),
                "validate-off": lambda: slotmap.compute_slot_mappings(*fused, **options, out=out2),
            },
        ),
    }
    interpreted = slotmap.BACKEND.interpreted
    if interpreted:  # the interpreter's launches take milliseconds: one call shows the path
        calls, repeats = (1, 1) if quick else (3, 3)
    else:
        calls, repeats = (500, 3) if quick else (2000, 7)
    records = []
    for prefix, (target, want, runs) in groups.items():
        for name, run in runs.items():
            target.fill_(POISON)
            run()
            synchronize()
            if not torch.equal(target, want):
                raise AssertionError(f"launcher check ({prefix}{name}) differs from the reference")
        counts = {name: calls if name != "validate-on" else calls // 4 or 1 for name in runs}
        results, ratios = host_us_per_call(runs, counts, repeats)
        for name, us in results.items():
            ratio = ratios[name]
            records.append(
                dict(
                    shape=case.shape.name,
                    block_size=case.block_size,
                    launch=prefix + name,
                    host_us=round(us, 3),
                    ratio_to_raw=round(ratio, 3),
                )
            )
            log(f"  launcher {prefix + name:<21} {us:9.2f} us/call host  {ratio:6.3f}x raw")
    return records


# ---------------------------------------------------------------------------------------------
# What one launch costs the host: the ladder, and a serving trace
# ---------------------------------------------------------------------------------------------
SERVING = dict(steps=300, max_num_reqs=256, max_num_tokens=8192, block_size=128)
TINY_SERVING = dict(
    steps=6, max_num_reqs=4, max_num_tokens=32, block_size=16, prompt=(2, 24), output=(1, 4)
)
SERVING_RUNS = (
    "raw",
    "c-launcher",
    "mapper",
    "mapper-jit",
    "launcher",
    "empty",
    "groups-c-launcher",
    "groups-mapper",
)
# The host ladder's step: production's decode (256 requests of one token, block 16), the
# window plan: one launch, on every rung of the ladder.
LADDER = dict(num_reqs=256, block_size=16)
TINY_LADDER = dict(num_reqs=5, block_size=16)
MAPPER_TARGET = 1.3  # the mappers' host µs per step, against Triton's own C launcher


def raw_launch(plan: Plan, args: tuple) -> object:
    """``kernel[grid](...)`` exactly as the plan's launcher makes it: its compile-time
    constants and its runtime keyword arguments (programs per request, say)."""
    return plan.kernel[plan.grid](*args, **plan.constants, **plan.runtime)


def c_launcher(kernel, grid: tuple, args: tuple, kwargs: dict) -> Callable[[], object] | None:
    """Triton's own C launcher for the variant ``kernel[grid](*args, **kwargs)`` launches:
    ``CompiledKernel.run`` with the arguments bound beforehand as Triton binds them
    (tensors), the stream read once, no launch hooks. None where there is none (the CPU
    interpreter, an unverified Triton)."""
    if not c_launch.supported():
        return None
    compiled, bound = c_launch.bind(kernel, args, kwargs)
    if compiled is None:
        return None
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    stream = c_launch.current_stream(c_launch.current_device())
    x, y, z = (*grid, 1, 1)[:3]
    values = tuple(bound.values())
    return lambda: run(x, y, z, stream, function, metadata, None, None, None, *values)


def serving_table(rows: int, reach: int, block_size: int, device: str) -> Tensor:
    """A block table whose rows cover ``reach`` positions, blocks distinct and shuffled."""
    width = -(-reach // block_size) + 1
    table = torch.randperm(rows * width + 5)[: rows * width].view(rows, width).to(torch.int32)
    return table.to(device)


def groups_mapper(tables: list[Tensor], block_size: int, max_num_tokens: int, **options):
    layouts = group_layouts(
        len(tables),
        [block_size] * len(tables),
        None,
        cp_world_size=1,
        cp_rank=0,
        cp_interleave=1,
        pad_id=slotmap.PAD_SLOT_ID,
    )
    return GroupsMapper(tables, layouts, max_num_tokens=max_num_tokens, **options)


def quantiles(values: list[float]) -> dict[str, float]:
    """Median, p95 and max of per-step values."""
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"median": round(at(0.5), 3), "p95": round(at(0.95), 3), "max": round(ordered[-1], 3)}


def measure_ladder(device: str, quick: bool, log) -> dict:
    """Host µs per call of one decode step (``LADDER``) launched every way there is, the ways
    taking turns: an empty kernel through ``kernel[grid]()``, the slot-mapping kernel through
    ``kernel[grid](...)`` (raw JIT), the same compiled kernel through Triton's own C launcher,
    one ATen op (``fill_``), the replay of a graph of one mapper step, ``SlotMapper`` (C
    launch where it runs, ``mapper-jit`` without it) and ``GroupsMapper`` (one group) with its
    own C launcher. Each output is checked exactly first."""
    interpreted = slotmap.BACKEND.interpreted
    config = TINY_LADDER if interpreted else LADDER
    r, block_size = config["num_reqs"], config["block_size"]
    generator = torch.Generator().manual_seed(1)
    firsts = torch.randint(0, 4096, (r,), generator=generator).tolist()
    step = Step(tuple((first, 1) for first in firsts))
    qsl, positions = step_tensors(step, device)
    table = serving_table(r, 4097, block_size, device)
    mapper = SlotMapper(table, block_size, max_num_tokens=r)
    jit_mapper = SlotMapper(table, block_size, max_num_tokens=r)
    jit_mapper.c_launch = False
    groups = groups_mapper([table], block_size, r)
    want = slotmap.slot_mapping_torch(qsl, positions, table, block_size, max_num_tokens=r)
    for run, result in ((mapper, mapper.out), (jit_mapper, jit_mapper.out), (groups, groups.out)):
        result.fill_(POISON)
        run(qsl, positions, r)
        synchronize()
        if not torch.equal(result.view(-1), want):
            raise AssertionError("host ladder: a mapper differs from the reference")
    kernel, grid, args, kwargs = mapper.jit_call(qsl, positions, r)
    warps = {k: v for k, v in kwargs.items() if k == "num_warps"}
    scratch = torch.empty(r, dtype=torch.int32, device=device)
    runs: dict[str, Callable[[], object]] = {}
    c_run = c_launcher(kernel, grid, args, kwargs)
    groups_c_run = c_launcher(*groups.jit_call(qsl, positions, r))
    if c_run is not None:
        runs["c-launcher"] = c_run
    runs.update(
        {
            "empty-jit": lambda: _empty_kernel[grid](**warps),
            "raw-jit": lambda: kernel[grid](*args, **kwargs),
            "aten-fill": lambda: scratch.fill_(0),
        }
    )
    capture = graph_capture(slotmap.BACKEND.name)
    if capture is not None and capture.verified:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            mapper(qsl, positions, r)
        runs["graph-replay"] = graph.replay
    runs.update(
        {
            "mapper": lambda: mapper(qsl, positions, r),
            "mapper-jit": lambda: jit_mapper(qsl, positions, r),
            "groups-mapper": lambda: groups(qsl, positions, r),
        }
    )
    if groups_c_run is not None:
        runs["groups-c-launcher"] = groups_c_run
    for name in ("c-launcher", "raw-jit", "groups-c-launcher", "graph-replay"):
        if name in runs:  # every way that writes a mapper's output, checked
            target = groups.out if name.startswith("groups") else mapper.out
            target.fill_(POISON)
            runs[name]()
            synchronize()
            if not torch.equal(target.view(-1), want):
                raise AssertionError(f"host ladder: {name} differs from the reference")
    if interpreted:
        calls, repeats = (1, 1) if quick else (2, 3)
    else:
        calls, repeats = (300, 3) if quick else (1000, 7)
    us, _ = host_us_per_call(runs, dict.fromkeys(runs, calls), repeats)
    base = us.get("c-launcher")
    result = {
        "step": f"decode, {r} requests x 1 token, block {block_size}, the window plan",
        "host_us": {name: round(value, 3) for name, value in us.items()},
        "over_c_launcher": None
        if base is None
        else {name: round(value / base, 3) for name, value in us.items()},
        "groups_over_c_launcher": None
        if groups_c_run is None
        else round(us["groups-mapper"] / us["groups-c-launcher"], 3),
        "exact": True,
    }
    log(
        "  host ladder (µs/call): "
        + ", ".join(f"{name} {value:.2f}" for name, value in result["host_us"].items())
    )
    return result


def measure_serving(device: str, quick: bool, log) -> dict:
    """Host µs per step of a synthetic serving trace (chunked prefill beside decode, a new
    ``num_tokens`` and fresh tensors every step) for: the raw ``kernel[grid](...)`` with the
    step's plan worked out beforehand, Triton's C launcher of the same compiled kernel with
    its arguments bound beforehand, ``SlotMapper`` (and without its C launch:
    ``mapper-jit``), the launcher with ``validate=False``, an empty kernel (the floor), and
    ``GroupsMapper`` (2 groups) against its own C launcher; the runs take turns step by step.
    On a GPU also the device µs per step, in graphs, on a sample of steps. Every run is
    checked exactly."""
    interpreted = slotmap.BACKEND.interpreted
    config = dict(TINY_SERVING if interpreted else SERVING)
    steps_wanted, block_size = config.pop("steps"), config.pop("block_size")
    steps = list(serving_trace(steps_wanted, **config, seed=0))
    rows, tokens = config["max_num_reqs"], config["max_num_tokens"]
    reach = (config.get("prompt") or (0, 2048))[1] + (config.get("output") or (0, 256))[1]
    table = serving_table(rows, reach, block_size, device)
    mapper = SlotMapper(table, block_size, max_num_tokens=tokens)
    jit_mapper = SlotMapper(table, block_size, max_num_tokens=tokens)
    jit_mapper.c_launch = False
    groups = groups_mapper([table, table], block_size, tokens)
    warm = slotmap.warmup(mapper, groups)
    out = torch.empty(tokens, dtype=torch.int32, device=device)
    inputs = [(step.num_tokens, *step_tensors(step, device)) for step in steps]
    plans = [mapper.plan(n, qsl.shape[0] - 1) for n, qsl, _ in inputs]
    c_runs = [c_launcher(*mapper.jit_call(qsl, pos, n)) for n, qsl, pos in inputs]
    groups_c_runs = [c_launcher(*groups.jit_call(qsl, pos, n)) for n, qsl, pos in inputs]
    names = [
        name for name in SERVING_RUNS if c_runs[0] is not None or not name.endswith("c-launcher")
    ]

    def runs_of(i: int) -> dict[str, Callable[[], object]]:
        n, qsl, pos = inputs[i]
        plan = plans[i]
        args = (n, tokens, qsl, pos, table, table.stride(0), block_size, out)
        warps = {k: v for k, v in plan.constants.items() if k == "num_warps"}
        return {
            "raw": lambda: raw_launch(plan, args),
            "c-launcher": c_runs[i],
            "mapper": lambda: mapper(qsl, pos, n),
            "mapper-jit": lambda: jit_mapper(qsl, pos, n),
            "launcher": lambda: slotmap.compute_slot_mapping(
                qsl,
                pos,
                table,
                block_size,
                num_tokens=n,
                max_num_tokens=tokens,
                out=out,
                validate=False,
            ),
            "empty": lambda: _empty_kernel[plan.grid](**warps),
            "groups-c-launcher": groups_c_runs[i],
            "groups-mapper": lambda: groups(qsl, pos, n),
        }

    exact = True
    targets_of = {"mapper": mapper.out, "c-launcher": mapper.out, "mapper-jit": jit_mapper.out}
    for i, (_, qsl, pos) in enumerate(inputs):
        want = slotmap.slot_mapping_torch(qsl, pos, table, block_size, max_num_tokens=tokens)
        for name, run in runs_of(i).items():
            if name == "empty" or name not in names:
                continue
            target = groups.out if name.startswith("groups") else targets_of.get(name, out)
            target.fill_(POISON)
            run()
            synchronize()
            exact &= all(torch.equal(row, want) for row in target.view(-1, tokens))
    if not exact:
        raise AssertionError("serving trace: a run differs from the reference")
    repeats = 1 if interpreted else (3 if quick else 7)
    samples: dict[str, list[list[float]]] = {name: [[] for _ in steps] for name in names}
    for repeat in range(repeats):
        for i in range(len(steps)):
            runs = runs_of(i)
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                start = time.perf_counter()
                runs[name]()
                samples[name][i].append((time.perf_counter() - start) * 1e6)
        synchronize()
    host = {name: [statistics.median(s) for s in samples[name]] for name in names}

    def over(name: str, base: str) -> dict[str, float] | None:
        if name not in host or base not in host:
            return None
        return quantiles([a / b for a, b in zip(host[name], host[base], strict=True)])

    result = dict(
        steps=len(steps),
        tokens_per_step=[n for n, _, _ in inputs],
        variants_warmed=warm,
        exact=exact,
        c_launch=mapper.c_launch,
        host_us_per_step={name: round(statistics.mean(host[name]), 3) for name in names},
        host_us_quantiles={name: quantiles(host[name]) for name in names},
        mapper_over_c_launcher=over("mapper", "c-launcher"),
        groups_over_c_launcher=over("groups-mapper", "groups-c-launcher"),
        mapper_over_raw=over("mapper", "raw"),
        launcher_over_raw=over("launcher", "raw"),
        device_us_per_step=None,
    )
    capture = graph_capture(slotmap.BACKEND.name)
    if capture is not None:
        sample = range(0, len(steps), max(len(steps) // 16, 1))
        device_us = {"raw": [], "empty": []}
        for i in sample:
            runs = runs_of(i)
            for name in device_us:
                device_us[name].append(time_graph(runs[name], 20, quick, capture))
        result["device_us_per_step"] = {
            name: round(statistics.mean(values), 3) for name, values in device_us.items()
        }
    ratio = result["mapper_over_c_launcher"] or result["mapper_over_raw"]
    log(
        f"  serving trace: {len(steps)} steps, {warm} variants warmed; host µs/step "
        + ", ".join(f"{k} {v:.2f}" for k, v in result["host_us_per_step"].items())
        + f"; mapper/{'c-launcher' if result['mapper_over_c_launcher'] else 'raw'} "
        f"median {ratio['median']:.3f} p95 {ratio['p95']:.3f} max {ratio['max']:.3f}"
    )
    return result


GRAPH_BUCKETS = (8, 16, 32, 64, 128, 256)  # token buckets a decode step is padded to


def measure_graph_steps(device: str, quick: bool, log) -> dict | None:
    """Decode steps replayed from CUDA graphs captured once per token bucket, as serving
    engines capture them: ``GroupsMapper`` (2 groups, ``idx_mapping``) on persistent input
    buffers, a step of r requests padded to the bucket's B tokens and B requests (the padding
    requests empty, their ``idx_mapping`` -1); the fused kernel maps the real
    ``query_start_loc[B]`` tokens and pads the rest. Each step copies its inputs into the
    buffers, replays, and is checked exactly; the host µs of ``replay()`` is recorded."""
    capture = graph_capture(slotmap.BACKEND.name)
    if capture is None or not capture.verified:
        return None
    rows, block_size, largest = 256, 16, GRAPH_BUCKETS[-1]
    tables = [serving_table(rows, 4097, block_size, device) for _ in range(2)]
    groups = groups_mapper(tables, block_size, largest, idx_mapping=True)
    groups.warmup()
    qsl_buffer = torch.zeros(largest + 1, dtype=torch.int32, device=device)
    positions_buffer = torch.zeros(largest, dtype=torch.int64, device=device)
    idx_buffer = torch.full((largest,), -1, dtype=torch.int32, device=device)
    graphs = {}
    for bucket in GRAPH_BUCKETS:
        args = (qsl_buffer[: bucket + 1], positions_buffer[:bucket], bucket)
        groups(*args, idx_mapping=idx_buffer[:bucket])  # warm, outside the capture
        synchronize()
        graphs[bucket] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[bucket]):
            groups(*args, idx_mapping=idx_buffer[:bucket])
    generator = torch.Generator().manual_seed(2)
    count = 24 if quick else 96
    replay_us, exact, used = [], True, set()
    for _ in range(count):
        r = int(torch.randint(1, largest + 1, (1,), generator=generator))
        bucket = next(b for b in GRAPH_BUCKETS if b >= r)
        used.add(bucket)
        firsts = torch.randint(0, 4096, (r,), generator=generator)
        rows_of = torch.randperm(rows, generator=generator)[:r].to(torch.int32)
        qsl_buffer.copy_(torch.arange(largest + 1, dtype=torch.int32).clamp_(max=r))
        positions_buffer[:r].copy_(firsts)
        idx_buffer.fill_(-1)
        idx_buffer[:r].copy_(rows_of)
        groups.out.fill_(POISON)
        synchronize()
        start = time.perf_counter()
        graphs[bucket].replay()
        replay_us.append((time.perf_counter() - start) * 1e6)
        synchronize()
        want = slotmap.slot_mappings_oracle(
            torch.arange(r + 1, dtype=torch.int32),
            firsts,
            [t.cpu() for t in tables],
            [block_size] * 2,
            idx_mapping=rows_of,
            max_num_tokens=largest,
        )
        exact &= torch.equal(groups.out.cpu(), want)
    if not exact:
        raise AssertionError("graph replay: a replayed step differs from the reference")
    result = {
        "buckets": list(GRAPH_BUCKETS),
        "buckets_used": sorted(used),
        "steps": count,
        "exact": exact,
        "replay_host_us": quantiles(replay_us),
    }
    replay = result["replay_host_us"]
    log(
        f"  graph steps: {count} decode steps over buckets {sorted(used)}, exact; replay host "
        f"µs median {replay['median']:.2f} max {replay['max']:.2f}"
    )
    return result


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def hardware() -> dict:
    info = {
        "backend": slotmap.BACKEND.name,
        "gpu": None,
        "driver": None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.processor() or platform.machine(),
    }
    if slotmap.BACKEND.name == "cuda":
        properties = torch.cuda.get_device_properties(0)
        info["gpu"] = torch.cuda.get_device_name(0)
        info["sms"] = properties.multi_processor_count
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            info["driver"] = done.stdout.strip().splitlines()[0] if done.stdout else None
        except (OSError, subprocess.SubprocessError):
            pass
        info["cuda"] = torch.version.cuda
    elif slotmap.BACKEND.name == "cpu":
        info["gpu"] = "none (Triton's CPU interpreter)"
    return info


def lookup(records: list[dict], shape: str, block: int, variant: str, mode: str) -> dict | None:
    for r in records:
        if (r["shape"], r["block_size"], r["variant"], r["mode"]) == (shape, block, variant, mode):
            return r
    return None


def blocks_of(records: list[dict], shape: str) -> list[int]:
    """The block sizes measured on this shape, smallest first."""
    return sorted({r["block_size"] for r in records if r["shape"] == shape})


def targets(
    records: list[dict],
    launcher: list[dict],
    serving: dict | None = None,
    ladder: dict | None = None,
    graph_steps: dict | None = None,
) -> list[dict]:
    """Every performance target (docs/performance.md) with the number reached and its ratio to
    the same run's floor."""
    rows = []
    for shape, goal in LATENCY_TARGETS.items():
        for block in blocks_of(records, shape):
            empty = lookup(records, shape, block, "empty", "graph")
            for variant in ("direct", "window"):
                r = lookup(records, shape, block, variant, "graph")
                if r is None or empty is None:
                    continue
                rows.append(
                    dict(
                        target=f"{shape} b{block} {variant}, graph: <= {goal} us",
                        reached=f"{r['us']:.2f} us",
                        floor=f"empty {empty['us']:.2f} us ({r['us'] / empty['us']:.2f}x)",
                        met=r["us"] <= goal,
                    )
                )
    for block in blocks_of(records, "huge"):
        copy = lookup(records, "huge", block, "copy", "graph")
        for variant in ("direct", "window"):
            r = lookup(records, "huge", block, variant, "graph")
            if r is None or copy is None:
                continue
            share = r["gbps"] / copy["gbps"]
            rows.append(
                dict(
                    target=f"huge b{block} {variant}, graph: >= 2000 GB/s, >= 2/3 of copy",
                    reached=f"{r['gbps']:.0f} GB/s",
                    floor=f"copy {copy['gbps']:.0f} GB/s ({share:.2f} of it)",
                    met=r["gbps"] >= BANDWIDTH_TARGET_GBPS and share >= BANDWIDTH_TARGET_OF_COPY,
                )
            )
    # Fused launches against another in the same run: (variant, its base, what, bound).
    pairs = (
        ("fused-4", "fused-1", "fused-4 in one launch", FUSED_TARGET),
        (
            "fused-3-cp2",
            "fused-2",
            "fused-3-cp2 (sharded, unsharded, disabled)",
            GROUP_KINDS_TARGET,
        ),
    )
    for shape in dict.fromkeys(r["shape"] for r in records):
        for block in blocks_of(records, shape):
            for variant, base, what, bound in pairs:
                new = lookup(records, shape, block, variant, "graph")
                old = lookup(records, shape, block, base, "graph")
                if new is None or old is None:
                    continue
                ratio = new["us"] / old["us"]
                rows.append(
                    dict(
                        target=f"{shape} b{block} {what}: <= {bound}x {base}",
                        reached=f"{new['us']:.2f} us = {ratio:.2f}x",
                        floor=f"{base} {old['us']:.2f} us",
                        met=ratio <= bound,
                    )
                )
    for r in launcher:
        if r["launch"].endswith("validate-off"):
            which = r["launch"].removesuffix("validate-off") or "window "
            rows.append(
                dict(
                    target=f"{which}launcher, validate off ({r['shape']} b{r['block_size']}): "
                    "<= 1.15x raw",
                    reached=f"{r['host_us']:.2f} us = {r['ratio_to_raw']:.3f}x",
                    floor="raw kernel[grid](...)",
                    met=r["ratio_to_raw"] <= LAUNCHER_TARGET,
                )
            )
    if ladder is not None and ladder["over_c_launcher"] is not None:
        ratio = ladder["over_c_launcher"]["mapper"]
        rows.append(
            dict(
                target=f"host ladder ({ladder['step']}): SlotMapper <= {MAPPER_TARGET}x "
                "Triton's C launcher",
                reached=f"{ladder['host_us']['mapper']:.2f} us = {ratio:.3f}x; GroupsMapper "
                f"{ladder['groups_over_c_launcher']:.3f}x its own",
                floor=f"C launcher {ladder['host_us']['c-launcher']:.2f} us",
                met=ratio <= MAPPER_TARGET and ladder["groups_over_c_launcher"] <= MAPPER_TARGET,
            )
        )
    if serving is not None:
        for name, key, base in (
            ("SlotMapper", "mapper_over_c_launcher", "c-launcher"),
            ("GroupsMapper (2 groups)", "groups_over_c_launcher", "groups-c-launcher"),
        ):
            ratio = serving.get(key)
            if ratio is None:
                continue
            rows.append(
                dict(
                    target=f"serving trace ({serving['steps']} steps), {name} host per step: "
                    f"<= {MAPPER_TARGET}x Triton's C launcher at every step",
                    reached=f"median {ratio['median']:.3f}x, p95 {ratio['p95']:.3f}x, "
                    f"max {ratio['max']:.3f}x",
                    floor=f"C launcher {serving['host_us_per_step'][base]:.2f} us a step "
                    "(mean), arguments bound beforehand",
                    met=ratio["max"] <= MAPPER_TARGET,
                )
            )
    if graph_steps is not None:
        replay = graph_steps["replay_host_us"]
        rows.append(
            dict(
                target="decode steps replayed from CUDA graphs of padded token buckets: exact",
                reached=f"{graph_steps['steps']} steps exact; replay host median "
                f"{replay['median']:.2f} us, max {replay['max']:.2f}",
                floor="-",
                met=graph_steps["exact"],
            )
        )
    rows.append(
        dict(
            target="every variant exact against the reference, before and after timing",
            reached=f"{sum(bool(r['exact']) for r in records)} of {len(records)} exact",
            floor="-",
            met=all(r["exact"] for r in records),
        )
    )
    return rows


def graph_line(result: dict) -> str:
    """How the report's numbers were taken; a graph API that has not run on hardware says so
    (results written before the field existed used CUDA graphs)."""
    graph = result.get("graph") or {"api": "CUDA graph", "verified_on_hardware": True}
    unverified = "" if graph["verified_on_hardware"] else " (never run on hardware before this)"
    return (
        f"- graph: µs per call inside a captured {graph['api']}{unverified} of "
        f"{result['graph_calls']} calls (`triton.testing.do_bench` median of replays); eager: "
        "wall µs per call of back-to-back Python calls, synchronised at the end (median of 7 "
        "runs of 500)"
    )


def markdown(result: dict) -> str:
    hw = result["hardware"]
    records = result["records"]
    lines = [
        f"# slotmap bench: {hw.get('gpu') or hw['backend']}",
        "",
        f"- hardware: {hw.get('gpu')} ({hw.get('sms', '?')} SMs), driver {hw.get('driver')}, "
        f"backend {hw['backend']}",
        f"- software: torch {hw['torch']}, triton {hw['triton']}, python {hw['python']}",
        f"- date: {hw['date']}; command: `{result['command']}`",
        "- every variant checked exactly against the reference before and after timing "
        "(output poisoned first); hot path: `validate=False`, `num_tokens` given, `out` given",
        graph_line(result),
        "",
    ]
    shapes = list(dict.fromkeys(r["shape"] for r in records))
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in records)]
    for mode in MODES:
        if not any(r["mode"] == mode for r in records):
            continue
        lines += [f"## µs per call, {mode}", ""]
        lines.append("| shape | block | " + " | ".join(variants) + " |")
        lines.append("| --- | --- | " + " | ".join("---" for _ in variants) + " |")
        for shape in shapes:
            for block in blocks_of(records, shape)[::-1]:
                cells = []
                for v in variants:
                    r = lookup(records, shape, block, v, mode)
                    cells.append("-" if r is None else f"{r['us']:.2f}")
                lines.append(f"| {shape} | {block} | " + " | ".join(cells) + " |")
        lines.append("")
    big = [r for r in records if r["gbps"] is not None and r["mode"] == "graph"]
    if big:
        lines += ["## GB/s in a graph (positions 8 B + slot 4 B per token and group)", ""]
        lines.append("| shape | block | " + " | ".join(v for v in variants if v != "empty") + " |")
        lines.append("| --- | --- | " + " | ".join("---" for v in variants if v != "empty") + " |")
        for shape in shapes:
            for block in blocks_of(records, shape)[::-1]:
                cells = []
                for v in variants:
                    if v == "empty":
                        continue
                    r = lookup(records, shape, block, v, "graph")
                    cells.append("-" if r is None else f"{r['gbps']:.0f}")
                lines.append(f"| {shape} | {block} | " + " | ".join(cells) + " |")
        lines.append("")
    if result["launcher"]:
        lines += [
            "## The launcher's own cost (host µs per call, back-to-back calls)",
            "",
            "The three launches take turns; × raw is the median of the turns' ratios.",
            "",
        ]
        lines += [
            "| shape | block | launch | host µs | × raw |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in result["launcher"]:
            lines.append(
                f"| {r['shape']} | {r['block_size']} | {r['launch']} | {r['host_us']:.2f} "
                f"| {r['ratio_to_raw']:.3f} |"
            )
        lines.append("")
    ladder = result.get("ladder")
    if ladder:
        lines += [
            f"## What one launch costs the host ({ladder['step']})",
            "",
            "Host µs per call of back-to-back calls, the ways taking turns (median of the "
            "turns); × C launcher: against Triton's own C launcher of the same compiled kernel, "
            "arguments bound beforehand.",
            "",
            "| way | host µs | × C launcher |",
            "| --- | --- | --- |",
        ]
        over = ladder["over_c_launcher"] or {}
        for name, us in ladder["host_us"].items():
            shown = over.get(name)
            lines.append(f"| {name} | {us:.2f} | {'-' if shown is None else f'{shown:.3f}'} |")
        lines.append("")
    serving = result.get("serving")
    if serving:
        device = serving["device_us_per_step"] or {}
        lines += [
            f"## A serving trace ({serving['steps']} steps, a new num_tokens and fresh tensors "
            "every step)",
            "",
            f"{serving['variants_warmed']} kernel variants warmed; the runs take turns each step; "
            "the mappers' C launch "
            + ("on." if serving.get("c_launch") else "off (not on this backend)."),
            "",
            "| run | host µs per step (mean) | median | p95 | max | device µs per step (graph) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        quantiles_of = serving.get("host_us_quantiles", {})
        for name, us in serving["host_us_per_step"].items():
            shown = device.get(name)
            q = quantiles_of.get(name, {})
            cells = " | ".join(f"{q[k]:.2f}" if k in q else "-" for k in ("median", "p95", "max"))
            lines.append(
                f"| {name} | {us:.2f} | {cells} | {'-' if shown is None else f'{shown:.2f}'} |"
            )
        lines.append("")
        lines += ["| ratio per step | median | p95 | max |", "| --- | --- | --- | --- |"]
        for key in (
            "mapper_over_c_launcher",
            "groups_over_c_launcher",
            "mapper_over_raw",
            "launcher_over_raw",
        ):
            ratio = serving.get(key)
            if ratio:
                cells = " | ".join(f"{ratio[k]:.3f}" for k in ("median", "p95", "max"))
                lines.append(f"| {key.replace('_', ' ')} | {cells} |")
        lines.append("")
    graph_steps = result.get("graph_steps")
    if graph_steps:
        replay = graph_steps["replay_host_us"]
        lines += [
            "## Decode steps replayed from graphs of padded token buckets",
            "",
            f"GroupsMapper (2 groups, idx_mapping) captured once per bucket "
            f"{graph_steps['buckets']}; {graph_steps['steps']} steps over buckets "
            f"{graph_steps['buckets_used']}, every one exact; host µs of `replay()`: median "
            f"{replay['median']:.2f}, p95 {replay['p95']:.2f}, max {replay['max']:.2f}.",
            "",
        ]
    lines += [TARGETS_HEADING, "", "| target | reached | floor (same run) | met |"]
    lines.append("| --- | --- | --- | --- |")
    for row in result["targets"]:
        met = "yes" if row["met"] else "**no**"
        lines.append(f"| {row['target']} | {row['reached']} | {row['floor']} | {met} |")
    lines.append("")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> bool:
    """Graph-mode µs per call by shape (left) and GB/s of the huge shape (right)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    records = result["records"]
    mode = "graph" if any(r["mode"] == "graph" for r in records) else "eager"
    keys = list(dict.fromkeys((r["shape"], r["block_size"]) for r in records))
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in records)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5), width_ratios=[3, 1.3])
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        values = [(lookup(records, s, b, v, mode) or {"us": math.nan})["us"] for s, b in keys]
        left.bar([k + i * width for k in range(len(keys))], values, width, label=v)
    left.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))])
    left.set_xticklabels([f"{s}\nb{b}" for s, b in keys], fontsize=8)
    left.set_yscale("log")
    left.set_ylabel(f"µs per call ({mode})")
    left.set_title(f"slotmap bench on {result['hardware'].get('gpu')}, {mode}")
    left.legend(ncol=4, fontsize=8)
    big = [k for k in keys if k[0] == keys[-1][0]]
    shown = [v for v in variants if v != "empty"]
    for j, key in enumerate(big):
        values = [
            (lookup(records, *key, v, mode) or {"gbps": math.nan})["gbps"] or math.nan
            for v in shown
        ]
        right.bar([x + j * 0.4 for x in range(len(shown))], values, 0.4, label=f"b{key[1]}")
    right.set_xticks([x + 0.2 for x in range(len(shown))])
    right.set_xticklabels(shown, rotation=45, fontsize=8)
    right.set_ylabel("GB/s")
    right.set_title(f"{big[0][0] if big else ''}: bandwidth")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    shapes = list(SHAPES) + list(TINY_SHAPES)
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=shapes,
        default=None,
        help="default: the reference shapes on an accelerator, tiny ones on the CPU interpreter",
    )
    parser.add_argument("--block-sizes", nargs="+", type=int, default=list(DEFAULT_BLOCK_SIZES))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--graph-calls", type=int, default=20, help="calls per captured graph")
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--name", default=None, help="file stem (default: the device's name)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--no-launcher", action="store_true", help="skip the launcher timing")
    parser.add_argument("--no-serving", action="store_true", help="skip the serving trace")


def run(args: argparse.Namespace) -> int:
    backend = slotmap.BACKEND.name
    device = slotmap.DEVICE
    names = args.shapes or (list(TINY_SHAPES) if backend == "cpu" else list(SHAPES))
    shapes = [{**SHAPES, **TINY_SHAPES}[n] for n in names]
    modes, skipped = bench_modes(args.modes, backend)
    if skipped:
        print(f"bench: no {', '.join(skipped)} mode on backend {backend} (no graph capture)")
    capture = graph_capture(backend)
    if "graph" in modes and not capture.verified:
        print(f"bench: graph mode uses the {capture.label}, which has not run on hardware")
    log = lambda line: print(line, flush=True)  # noqa: E731
    result = {
        "hardware": hardware(),
        "command": "slotmap bench "
        + " ".join(
            [
                f"--shapes {' '.join(names)}",
                f"--block-sizes {' '.join(map(str, args.block_sizes))}",
            ]
        ),
        "graph_calls": args.graph_calls,
        "graph": None
        if "graph" not in modes
        else {"api": capture.label, "verified_on_hardware": capture.verified},
        "records": [],
        "launcher": [],
    }
    log(f"bench: {result['hardware']}")
    for shape in shapes:
        for block_size in args.block_sizes:
            case = build_case(shape, block_size, device)
            result["records"] += measure_case(
                case, args.variants, modes, args.graph_calls, args.quick, log
            )
            first = shape == shapes[0] and block_size == args.block_sizes[0]
            if not args.no_launcher and (first or shape.name == "huge"):
                result["launcher"] += measure_launcher(case, args.quick, log)
    if not args.no_serving:
        result["ladder"] = measure_ladder(device, args.quick, log)
        result["serving"] = measure_serving(device, args.quick, log)
        result["graph_steps"] = measure_graph_steps(device, args.quick, log)
    result["targets"] = targets(
        result["records"],
        result["launcher"],
        result.get("serving"),
        result.get("ladder"),
        result.get("graph_steps"),
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.name or _default_name(result["hardware"])
    (args.out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out_dir / f"{stem}.md").write_text(table)
    drew = plot(result, args.out_dir / f"{stem}.png")
    print(table)
    print(f"bench: wrote {args.out_dir / stem}.json, .md" + (", .png" if drew else ""))
    return 0


def _default_name(hw: dict) -> str:
    if hw["backend"] != "cuda":
        return hw["backend"]
    gpu = hw.get("gpu") or hw["backend"]
    if "H200" in gpu:
        return "h200"
    return "".join(c if c.isalnum() else "-" for c in gpu.lower()).strip("-")[:40] or "bench"
