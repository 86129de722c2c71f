"""The serving loop's mapper: exact over a trace, no sync or copy once warm, few variants, all
of them warmed; on a GPU, captured in a CUDA graph and compiling nothing after warm-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import DEVICE

import slotmap
from slotmap.layout import SlotLayout, cdiv, group_layouts
from slotmap.serving import GroupsMapper, SlotMapper, serving_trace, step_tensors, variant_of

ROOT = Path(__file__).resolve().parents[1]
POISON = -999
TRACE = dict(steps=14, max_num_reqs=6, max_num_tokens=48, prompt=(3, 40), output=(1, 6))


def trace_table(rows: int, block_size: int, seed: int = 0) -> torch.Tensor:
    # Every position the trace can reach has a block; blocks are distinct and shuffled.
    width = cdiv(TRACE["prompt"][1] + TRACE["output"][1], block_size) + 1
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randperm(rows * width + 7, generator=generator)[: rows * width]
    return blocks.view(rows, width).to(torch.int32).to(DEVICE)


@pytest.mark.parametrize("out_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("kernel", ["window", "direct"])
def test_the_mapper_matches_the_reference_over_a_trace(kernel, out_dtype) -> None:
    table = trace_table(TRACE["max_num_reqs"], 4)
    mapper = SlotMapper(table, 4, max_num_tokens=48, kernel=kernel, out_dtype=out_dtype)
    steps = list(serving_trace(**TRACE, seed=3))
    assert len({step.num_tokens for step in steps}) > len(steps) // 2  # it changes
    for step in steps:
        query_start_loc, positions = step_tensors(step, DEVICE)
        mapper.out.fill_(POISON)
        result = mapper(query_start_loc, positions, step.num_tokens)
        assert result is mapper.out
        want = slotmap.slot_mapping_oracle(query_start_loc, positions, table, 4, max_num_tokens=48)
        assert result.cpu().tolist() == want.tolist()


class Stub:
    """A kernel that records its launches instead of running (the host path alone)."""

    def __init__(self, fn) -> None:
        self.fn, self.launches = fn, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))


def stub_kernels(monkeypatch, module, names: tuple[str, ...]) -> list[Stub]:
    """Replace ``module``'s kernels by stubs that record their launches."""
    stubs = [Stub(getattr(module, name).fn) for name in names]
    for name, stub in zip(names, stubs, strict=True):
        monkeypatch.setattr(module, name, stub)
    return stubs


def refuse_syncs_copies_and_allocations(monkeypatch) -> None:
    """From here on, anything that syncs with the device, copies to it or allocates fails."""

    def refuse(*args, **kwargs):
        raise AssertionError("a device sync, a host-to-device copy or an allocation")

    for target, name in [
        (torch, "tensor"),
        (torch, "empty"),
        (torch, "full"),
        (torch, "zeros"),
        (torch.Tensor, "item"),
        (torch.Tensor, "tolist"),
        (torch.Tensor, "cpu"),
        (torch.Tensor, "numpy"),
        (torch.Tensor, "__int__"),
        (torch.Tensor, "__bool__"),
        (torch.Tensor, "__index__"),
        (torch.Tensor, "to"),
        (torch.Tensor, "nonzero"),
    ]:
        monkeypatch.setattr(target, name, refuse)


@pytest.mark.parametrize("kernel", ["window", "direct"])
def test_a_warm_mapper_neither_syncs_nor_copies_nor_allocates(kernel, monkeypatch) -> None:
    table = trace_table(TRACE["max_num_reqs"], 4)
    mapper = SlotMapper(table, 4, max_num_tokens=48, kernel=kernel)
    steps = [(step, *step_tensors(step, DEVICE)) for step in serving_trace(**TRACE, seed=5)]
    stubs = stub_kernels(
        monkeypatch, slotmap.kernels.slot_mapping, ("_compute_slot_mapping_kernel",)
    ) + stub_kernels(
        monkeypatch,
        slotmap.kernels.direct,
        ("_compute_slot_mapping_direct_kernel", "_compute_slot_mapping_direct_tokens_kernel"),
    )
    refuse_syncs_copies_and_allocations(monkeypatch)
    for step, query_start_loc, positions in steps:
        mapper(query_start_loc, positions, step.num_tokens)
    launches = [call for stub in stubs for call in stub.launches]
    assert len(launches) == len(steps)
    for _, args, _ in launches:
        assert args[4] is table and args[7] is mapper.out  # the persistent buffers


COUNT = """
import json
import torch
from slotmap.layout import group_layouts
from slotmap.serving import GroupsMapper, SlotMapper, serving_trace, variant_of
result = {}
table = torch.zeros(256, 64, dtype=torch.int32)
layouts = group_layouts(2, [128, 128], None, cp_world_size=1, cp_rank=0, cp_interleave=1,
                        pad_id=-1)
for kernel in ("window", "direct", "fused"):
    mapper = (GroupsMapper([table, table], layouts, max_num_tokens=8192) if kernel == "fused"
              else SlotMapper(table, 128, max_num_tokens=8192, kernel=kernel))
    warm = set(mapper.variants())
    used = {variant_of(mapper.plan(s.num_tokens, len(s.requests)))
            for s in serving_trace(400, 256, 8192, seed=1)}
    result[kernel] = {"warm": len(warm), "used": len(used), "cold": len(used - warm)}
print(json.dumps(result))
"""


def test_a_serving_trace_compiles_few_variants_and_warmup_has_them_all() -> None:
    """400 steps of chunked prefill and decode, 256 request slots, 8,192 tokens a step, under
    the GPU's launch choices: the window kernel has 2 variants (the decode tile and the
    production tile), the direct kernels 3 (the request grid, and the token grid with and
    without early request ends), the fused kernel (2 groups) at most 4. The trace uses only
    warmed variants."""
    environment = {
        k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SLOTMAP_BACKEND")
    }
    environment.update(SLOTMAP_BACKEND="cpu", SLOTMAP_LAUNCH_POLICY="cuda", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", COUNT],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout.splitlines()[-1])
    assert counts["window"] == {"warm": 2, "used": 2, "cold": 0}
    assert counts["direct"]["warm"] <= 3 and counts["direct"]["cold"] == 0
    assert counts["direct"]["used"] >= 2
    assert counts["fused"]["warm"] <= 4 and counts["fused"]["cold"] == 0


def test_warmup_launches_every_variant_and_leaves_padding() -> None:
    table = trace_table(4, 8)
    mapper = SlotMapper(table, SlotLayout(8), max_num_tokens=24, kernel="window")
    launched = []
    real = mapper.__class__.__call__

    def spy(self, query_start_loc, positions, num_tokens):
        launched.append(variant_of(self.plan(num_tokens, query_start_loc.shape[0] - 1)))
        return real(self, query_start_loc, positions, num_tokens)

    mapper.__class__.__call__ = spy
    try:
        count = mapper.warmup()
    finally:
        mapper.__class__.__call__ = real
    assert count == len(mapper.variants()) == len(set(launched)) >= 1
    assert mapper.out.cpu().tolist() == [-1] * 24


needs_cuda = pytest.mark.skipif(slotmap.BACKEND.name != "cuda", reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("kernel", ["window", "direct"])
def test_a_cuda_graph_replays_the_mapper_on_new_inputs(kernel) -> None:
    table = trace_table(TRACE["max_num_reqs"], 4)
    mapper = SlotMapper(table, 4, max_num_tokens=48, kernel=kernel)
    mapper.warmup()
    steps = [s for s in serving_trace(**TRACE, seed=7)]
    first = steps[0]
    shape = [
        s
        for s in steps
        if len(s.requests) == len(first.requests) and s.num_tokens == first.num_tokens
    ]
    query_start_loc, positions = (t.clone() for t in step_tensors(first, DEVICE))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        mapper(query_start_loc, positions, first.num_tokens)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mapper(query_start_loc, positions, first.num_tokens)
    # Same shape, new contents: positions shifted as the next decode step's would be.
    positions += 1
    mapper.out.fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    want = slotmap.slot_mapping_oracle(query_start_loc, positions, table, 4, max_num_tokens=48)
    assert mapper.out.cpu().tolist() == want.tolist()
    assert shape  # the captured shape is one the trace schedules


@needs_cuda
def test_nothing_compiles_after_warmup() -> None:
    import triton

    table = torch.zeros(256, 64, dtype=torch.int32, device=DEVICE)
    mappers = [SlotMapper(table, 128, max_num_tokens=8192, kernel=k) for k in ("window", "direct")]
    slotmap.serving.warmup(*mappers)
    compiled = []
    previous = triton.knobs.runtime.jit_cache_hook
    triton.knobs.runtime.jit_cache_hook = lambda *a, **k: compiled.append(k.get("repr")) and False
    try:
        for step in serving_trace(200, 256, 8192, seed=1):
            query_start_loc, positions = step_tensors(step, DEVICE)
            for mapper in mappers:
                mapper(query_start_loc, positions, step.num_tokens)
        torch.cuda.synchronize()
    finally:
        triton.knobs.runtime.jit_cache_hook = previous
    assert compiled == []


def test_replay_padding_copies_its_flags_to_the_device_once(monkeypatch) -> None:
    qsl = torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)
    positions = torch.arange(3, dtype=torch.int64, device=DEVICE)
    start = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    slots = torch.zeros(2, 3, dtype=torch.int32, device=DEVICE)
    slotmap.pad_replayed_slots(slots, qsl, positions, start, 1, [True, False], validate=False)
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: pytest.fail("a copy every step"))
    slots.zero_()
    slotmap.pad_replayed_slots(slots, qsl, positions, start, 1, [True, False], validate=False)
    assert slots.cpu().tolist() == [[0, -1, 0], [0, 0, 0]]


def test_expand_block_table_without_validation_reads_nothing(monkeypatch) -> None:
    table = torch.tensor([[3, 1]], dtype=torch.int32, device=DEVICE)
    monkeypatch.setattr(torch.Tensor, "max", lambda *a, **k: pytest.fail("a device sync"))
    expanded = slotmap.expand_block_table(table, 2, validate=False)
    assert expanded.cpu().tolist() == [[6, 7, 2, 3]]


# A hybrid model's three kinds of group under CP 2 (this rank 0): full attention sharded, a
# sliding window unsharded, a state group disabled (no table).
GROUP_KINDS = dict(
    cp_world_size=2,
    cp_rank=0,
    dcp_sharded=[True, False, False],
    slot_mapping_enabled=[True, True, False],
)


def group_kinds_mapper(out_dtype=torch.int32, idx_mapping=False):
    tables = [trace_table(TRACE["max_num_reqs"], 4, seed=g) for g in range(2)] + [None]
    layouts = group_layouts(
        3,
        [4, 4, 4],
        None,
        cp_world_size=2,
        cp_rank=0,
        cp_interleave=1,
        pad_id=-1,
        dcp_sharded=GROUP_KINDS["dcp_sharded"],
        slot_mapping_enabled=GROUP_KINDS["slot_mapping_enabled"],
    )
    mapper = GroupsMapper(
        tables, layouts, max_num_tokens=48, idx_mapping=idx_mapping, out_dtype=out_dtype
    )
    return mapper, tables


@pytest.mark.parametrize("idx_mapping", [False, True], ids=["rows-in-order", "idx-mapping"])
@pytest.mark.parametrize("out_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_the_groups_mapper_matches_the_reference_over_a_trace(out_dtype, idx_mapping) -> None:
    mapper, tables = group_kinds_mapper(out_dtype, idx_mapping)
    for step in serving_trace(**TRACE, seed=11):
        query_start_loc, positions = step_tensors(step, DEVICE)
        rows = None
        if idx_mapping:  # the batch's requests in reverse row order
            rows = torch.arange(len(step.requests) - 1, -1, -1, dtype=torch.int32, device=DEVICE)
        mapper.out.fill_(POISON)
        result = mapper(query_start_loc, positions, step.num_tokens, idx_mapping=rows)
        want = slotmap.slot_mappings_oracle(
            query_start_loc,
            positions,
            tables,
            [4, 4, 4],
            idx_mapping=rows,
            max_num_tokens=48,
            **GROUP_KINDS,
        )
        assert result.cpu().tolist() == want.tolist()


def test_a_warm_groups_mapper_neither_syncs_nor_copies(monkeypatch) -> None:
    mapper, _ = group_kinds_mapper()
    steps = [(step, *step_tensors(step, DEVICE)) for step in serving_trace(**TRACE, seed=5)]
    stubs = stub_kernels(
        monkeypatch,
        slotmap.kernels.fused_groups,
        ("_compute_slot_mappings_kernel", "_compute_slot_mappings_tokens_kernel"),
    )
    refuse_syncs_copies_and_allocations(monkeypatch)
    for step, query_start_loc, positions in steps:
        mapper(query_start_loc, positions, step.num_tokens)
    launches = [call for stub in stubs for call in stub.launches]
    assert len(launches) == len(steps)
    for _, args, _ in launches:
        assert args[7] is mapper.meta and args[8] is mapper.out  # built once, persistent


@needs_cuda
def test_a_cuda_graph_replays_the_groups_mapper() -> None:
    mapper, tables = group_kinds_mapper()
    mapper.warmup()
    step = next(iter(serving_trace(**TRACE, seed=7)))
    query_start_loc, positions = (t.clone() for t in step_tensors(step, DEVICE))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mapper(query_start_loc, positions, step.num_tokens)
    positions += 1
    mapper.out.fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    want = slotmap.slot_mappings_oracle(
        query_start_loc, positions, tables, [4, 4, 4], max_num_tokens=48, **GROUP_KINDS
    )
    assert mapper.out.cpu().tolist() == want.tolist()
