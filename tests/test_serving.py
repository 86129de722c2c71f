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


def under_policy(code: str, policy: str) -> dict:
    """Run ``code`` on the CPU interpreter under a backend's launch choices; its last line of
    output, as JSON."""
    environment = {
        k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SLOTMAP_BACKEND")
    }
    environment.update(SLOTMAP_BACKEND="cpu", SLOTMAP_LAUNCH_POLICY=policy, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_serving_trace_compiles_few_variants_and_warmup_has_them_all() -> None:
    """400 steps of chunked prefill and decode, 256 request slots, 8,192 tokens a step, under
    the GPU's launch choices: the window kernel has 2 variants (the decode tile and the
    production tile), the direct kernels 3 (the request grid, and the token grid with and
    without early request ends), the fused kernel (2 groups) at most 4. The trace uses only
    warmed variants."""
    counts = under_policy(COUNT, "cuda")
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


# ---------------------------------------------------------------------------------------------
# A step's launch: the step's arithmetic is the planner's, on every batch
# ---------------------------------------------------------------------------------------------
STEP_EQUALS_PLAN = """
import json
import torch
from slotmap.layout import group_layouts
from slotmap.serving import GroupsMapper, SlotMapper, variant_of
table = torch.zeros(40, 64, dtype=torch.int32)
layouts = group_layouts(2, [16, 128], None, cp_world_size=1, cp_rank=0, cp_interleave=1,
                        pad_id=-1)
mappers = {
    "window": SlotMapper(table, 16, max_num_tokens=3000),
    "direct": SlotMapper(table, 16, max_num_tokens=3000, kernel="direct"),
    "fused": GroupsMapper([table, table], layouts, max_num_tokens=3000),
    "fused-idx": GroupsMapper([table, table], layouts, max_num_tokens=3000, idx_mapping=True),
}
checked, keys = 0, {}
for name, mapper in mappers.items():
    variants = {}
    for n in list(range(0, 300)) + list(range(300, 3001, 7)):
        for r in range(0, min(n, 40) + 1):
            if r == 0 and n:
                continue
            plan = mapper.plan(n, r)
            key, grid, value = mapper.step(n, r)
            assert (*plan.grid, 1, 1)[:3] == grid, (name, n, r, plan.grid, grid)
            runtime = plan.runtime
            assert runtime in ({}, {next(iter(runtime), ""): value}), (name, n, r, runtime, value)
            if not runtime:
                assert value == r  # the token kernels' num_reqs
            variant = variant_of(plan)
            assert variants.setdefault((name, key), variant) == variant, (name, n, r, key)
            checked += 1
    keys[name] = len({k for k in variants})
print(json.dumps({"checked": checked, "keys": keys}))
"""


@pytest.mark.parametrize("policy", ["cuda", "cpu"])
def test_a_step_launches_what_the_planner_plans(policy) -> None:
    """For every batch of up to 3,000 tokens and 40 requests (every token count to 300, then
    every 7th), under the GPU's and the interpreter's launch choices: the step's grid and
    runtime value are the planner's, and its key names one compiled variant only."""
    result = under_policy(STEP_EQUALS_PLAN, policy)
    assert result["checked"] > 50_000
    # The GPU's choices give every mapper several variants (the interpreter's, fewer).
    assert all(count >= (2 if policy == "cuda" else 1) for count in result["keys"].values())


def test_a_step_whose_arithmetic_disagrees_with_the_planner_is_refused(monkeypatch) -> None:
    # The first launch of a variant compares the step with the planner: a step that drifts
    # from it (here: one program too few) is an error, not a wrong launch.
    table = trace_table(4, 4)
    mapper = SlotMapper(table, 4, max_num_tokens=48)
    real = mapper.step

    def drifted(num_tokens, num_reqs):
        key, (x, y, z), value = real(num_tokens, num_reqs)
        return key, (x - 1, y, z), value

    monkeypatch.setattr(mapper, "step", drifted)
    query_start_loc, positions = step_tensors(next(serving_trace(**TRACE, seed=3)), DEVICE)
    with pytest.raises(RuntimeError, match="disagrees with the planner"):
        mapper(query_start_loc, positions, int(positions.numel()))


# ---------------------------------------------------------------------------------------------
# What a step refuses (host integers only): nothing outside the mapper's buffers
# ---------------------------------------------------------------------------------------------
def one_step():
    step = next(iter(serving_trace(**TRACE, seed=3)))
    query_start_loc, positions = step_tensors(step, DEVICE)
    return query_start_loc, positions, step.num_tokens


def all_mappers():
    table = trace_table(TRACE["max_num_reqs"], 4)
    yield "window", SlotMapper(table, 4, max_num_tokens=48), {}
    yield "direct", SlotMapper(table, 4, max_num_tokens=48, kernel="direct"), {}
    mapper, _ = group_kinds_mapper()
    yield "groups", mapper, {}
    mapper, _ = group_kinds_mapper(idx_mapping=True)
    rows = torch.arange(TRACE["max_num_reqs"], dtype=torch.int32, device=DEVICE)
    yield "groups-idx", mapper, {"idx_mapping": rows}


MAPPERS = ["window", "direct", "groups", "groups-idx"]


def mapper_named(name: str):
    return next((mapper, kwargs) for n, mapper, kwargs in all_mappers() if n == name)


def bad_steps(mapper, kwargs):
    """(what, args, kwargs, message) of steps that would read or write outside a buffer."""
    query_start_loc, positions, n = one_step()
    rows = mapper.max_num_reqs
    many = torch.arange(rows + 2, dtype=torch.int32, device=DEVICE)  # rows + 1 requests
    wide = torch.zeros(2 * positions.numel(), dtype=torch.int64, device=DEVICE)
    wide[::2] = positions
    yield "above capacity", (query_start_loc, positions, 49), kwargs, "num_tokens 49"
    yield "negative", (query_start_loc, positions, -5), kwargs, "num_tokens -5"
    yield "not an int", (query_start_loc, positions, float(n)), kwargs, "num_tokens must be"
    yield "more requests than rows", (many, positions, n), kwargs, "requests"
    yield "short positions", (query_start_loc, positions[: n - 1], n), kwargs, "positions has"
    yield "non-contiguous", (query_start_loc, wide[::2], n), kwargs, "contiguous"
    yield "int32 positions", (query_start_loc, positions.int(), n), kwargs, "positions"
    yield "int64 qsl", (query_start_loc.long(), positions, n), kwargs, "query_start_loc"
    yield "2-D positions", (query_start_loc, positions[None], n), kwargs, "positions"
    yield "meta positions", (query_start_loc, positions.to("meta"), n), kwargs, "positions"
    empty = query_start_loc[:0]
    yield "empty qsl", (empty, positions, n), kwargs, "query_start_loc holds -1 requests"
    yield "0-d qsl", (query_start_loc[0], positions, n), kwargs, "query_start_loc"
    strided = torch.zeros(2 * query_start_loc.numel(), dtype=torch.int32, device=DEVICE)
    strided[::2] = query_start_loc
    yield "non-contiguous qsl", (strided[::2], positions, n), kwargs, "contiguous"
    yield "not a tensor", (query_start_loc, positions.tolist(), n), kwargs, "positions"
    if "idx_mapping" in kwargs:
        rows = kwargs["idx_mapping"]
        for what, bad, message in (
            ("short idx_mapping", rows[: query_start_loc.numel() - 2], "idx_mapping has"),
            ("int64 idx_mapping", rows.long(), "idx_mapping must be int32"),
            ("2-D idx_mapping", rows[None], "idx_mapping must have 1"),
            ("non-contiguous idx_mapping", torch.cat([rows, rows])[::2], "contiguous"),
            ("meta idx_mapping", rows.to("meta"), "idx_mapping is on meta"),
        ):
            yield what, (query_start_loc, positions, n), {"idx_mapping": bad}, message


BAD_STEPS = [
    "above capacity",
    "negative",
    "not an int",
    "more requests than rows",
    "short positions",
    "non-contiguous",
    "int32 positions",
    "int64 qsl",
    "2-D positions",
    "meta positions",
    "empty qsl",
    "0-d qsl",
    "non-contiguous qsl",
    "not a tensor",
]
# Only a mapper built with idx_mapping takes one.
BAD_IDX_MAPPINGS = [
    "short idx_mapping",
    "int64 idx_mapping",
    "2-D idx_mapping",
    "non-contiguous idx_mapping",
    "meta idx_mapping",
]


@pytest.mark.parametrize(
    ("name", "what"),
    [(name, what) for name in MAPPERS for what in BAD_STEPS]
    + [("groups-idx", what) for what in BAD_IDX_MAPPINGS],
)
def test_a_step_outside_the_buffers_is_refused_by_name(name, what) -> None:
    mapper, kwargs = mapper_named(name)
    args, step_kwargs, message = {c[0]: c[1:] for c in bad_steps(mapper, kwargs)}[what]
    mapper.out.fill_(POISON)
    with pytest.raises(ValueError, match=message):
        mapper(*args, **step_kwargs)
    assert (mapper.out.cpu() == POISON).all()  # refused before any launch


def freed(table: torch.Tensor) -> None:
    table.untyped_storage().resize_(0)


def shrunk(table: torch.Tensor) -> None:
    table.resize_(table.shape[0] - 1, table.shape[1])


def replaced(table: torch.Tensor) -> None:
    table.set_(torch.zeros(2, 3, dtype=torch.int32, device=table.device))


@pytest.mark.parametrize("change", [freed, shrunk, replaced])
@pytest.mark.parametrize("name", MAPPERS)
def test_a_table_resized_or_freed_after_construction_is_refused(name, change) -> None:
    mapper, kwargs = mapper_named(name)
    query_start_loc, positions, n = one_step()
    mapper(query_start_loc, positions, n, **kwargs)  # a good step first
    table = mapper.table if name in ("window", "direct") else mapper.tables[0]
    change(table)
    with pytest.raises(ValueError, match=r"block_table.* was resized, replaced or freed"):
        mapper(query_start_loc, positions, n, **kwargs)


def test_an_output_resized_after_construction_is_refused() -> None:
    mapper, _ = mapper_named("window")
    query_start_loc, positions, n = one_step()
    mapper.out.resize_(4)
    with pytest.raises(ValueError, match="out was resized"):
        mapper(query_start_loc, positions, n)


HELD_CHANGES = {"block table freed": freed, "block table shrunk": shrunk}
HELD_CHANGES["block table replaced"] = replaced


def held_changed(name: str, what: str):
    """A mapper after a good step, its block table or output then changed as ``what`` says."""
    mapper, kwargs = mapper_named(name)
    query_start_loc, positions, n = one_step()
    mapper(query_start_loc, positions, n, **kwargs)
    if what == "out resized":
        mapper.out.resize_(4)
    else:
        table = mapper.table if name in ("window", "direct") else mapper.tables[0]
        HELD_CHANGES[what](table)
    return mapper, (query_start_loc, positions, n), kwargs


@pytest.mark.parametrize("name", MAPPERS)
def test_a_step_and_the_mappers_check_refuse_the_same_steps_with_one_message(name) -> None:
    """A step's checks are written out inline in each mapper's ``__call__`` for speed;
    ``_check`` (which ``jit_call`` runs) is the same checks as a method. Every bad step of
    docs/semantics.md's table is refused by both, with the same message, and good steps
    (the first of a trace, and the edges) are accepted by both with the same request count."""
    mapper, kwargs = mapper_named(name)
    refused = [
        (what, mapper, args, step_kwargs)
        for what, args, step_kwargs, _ in bad_steps(mapper, kwargs)
    ]
    for what in [*HELD_CHANGES, "out resized"]:
        refused.append((what, *held_changed(name, what)))
    for what, changed, args, step_kwargs in refused:
        with pytest.raises(ValueError) as by_step:
            changed(*args, **step_kwargs)
        with pytest.raises(ValueError) as by_check:
            changed._check(*args, **step_kwargs)
        assert str(by_step.value) == str(by_check.value), what
    query_start_loc, positions, n = one_step()
    rows = kwargs.get("idx_mapping")
    for num_tokens in (0, n, mapper.max_num_tokens):
        wide = torch.zeros(max(num_tokens, n), dtype=torch.int64, device=DEVICE)
        wide[:n] = positions
        assert (
            mapper._check(query_start_loc, wide, num_tokens, rows) == query_start_loc.numel() - 1
        )
        mapper(query_start_loc, wide, num_tokens, **kwargs)  # accepted


def test_the_semantics_page_lists_every_step_the_mappers_refuse() -> None:
    """docs/semantics.md's table of a mapper step's refusals names the cases above, no more
    and no fewer: the page, the inline checks and ``_check`` describe one set of checks."""
    text = (ROOT / "docs" / "semantics.md").read_text(encoding="utf-8")
    table = text.split("<!-- mapper-refusals -->")[1]
    listed = {
        line.split("|")[1].strip().strip("`")
        for line in table.strip().splitlines()
        if line.startswith("| `")
    }
    assert listed == {*BAD_STEPS, *BAD_IDX_MAPPINGS, *HELD_CHANGES, "out resized"}


def test_a_good_step_at_the_edges_is_accepted() -> None:
    # The checks refuse only what leaves the buffers: max_num_tokens itself, every row,
    # positions longer than num_tokens (a persistent buffer's slice) all map.
    table = trace_table(3, 4)
    mapper = SlotMapper(table, 4, max_num_tokens=6)
    query_start_loc = torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=DEVICE)
    positions = torch.tensor([0, 1, 0, 1, 0, 1, 9, 9], dtype=torch.int64, device=DEVICE)
    result = mapper(query_start_loc, positions, 6)
    want = slotmap.slot_mapping_oracle(query_start_loc, positions[:6], table, 4, max_num_tokens=6)
    assert result.cpu().tolist() == want.tolist()


# ---------------------------------------------------------------------------------------------
# The C launch: where it runs, and that it launches Triton's own variant
# ---------------------------------------------------------------------------------------------
def test_the_c_launch_runs_only_on_a_verified_triton_on_cuda(monkeypatch) -> None:
    from slotmap.kernels import c_launch

    monkeypatch.delenv(c_launch.ENV, raising=False)
    assert c_launch.supported("3.6.0", "cuda")
    assert not c_launch.supported("3.9.0", "cuda")  # unverified: the JIT path
    assert not c_launch.supported("3.6.0", "cpu")  # the interpreter has no compiled kernel
    assert not c_launch.supported("3.6.0", "npu")  # triton-ascend's launcher differs
    monkeypatch.setenv(c_launch.ENV, "0")
    assert not c_launch.supported("3.6.0", "cuda")


def test_on_the_interpreter_every_step_takes_the_jit_path() -> None:
    if slotmap.BACKEND.name == "cuda":
        pytest.skip("the CPU interpreter's case")
    for _, mapper, _ in all_mappers():
        assert mapper.c_launch is False


def alignment_cases(query_start_loc, positions, idx_mapping):
    """The step's tensors as given (16-byte aligned), and as slices 4 or 8 bytes in: Triton
    compiles a variant for each pattern of aligned pointers."""
    yield "aligned", query_start_loc, positions, idx_mapping
    qsl = torch.zeros(query_start_loc.numel() + 1, dtype=torch.int32, device=DEVICE)[1:]
    qsl.copy_(query_start_loc)
    pos = torch.zeros(positions.numel() + 1, dtype=torch.int64, device=DEVICE)[1:]
    pos.copy_(positions)
    yield "positions off", query_start_loc, pos, idx_mapping
    yield "both off", qsl, pos, idx_mapping
    if idx_mapping is not None:
        rows = torch.zeros(idx_mapping.numel() + 1, dtype=torch.int32, device=DEVICE)[1:]
        rows.copy_(idx_mapping)
        yield "idx_mapping off", query_start_loc, positions, rows


@needs_cuda
@pytest.mark.parametrize("name", MAPPERS)
def test_the_c_launch_takes_tritons_variant_and_matches_the_jit_on_every_variant(name) -> None:
    from slotmap.kernels import c_launch

    mapper, kwargs = mapper_named(name)
    jit, _ = mapper_named(name)
    jit.c_launch = False
    assert mapper.c_launch is c_launch.supported()
    mapper.warmup()
    launched = 0
    for n, r in mapper.variants().values():
        args, extra = mapper.warm_call(n, r)
        query_start_loc, positions, _ = args
        idx = extra.get("idx_mapping")
        for what, qsl, pos, rows in alignment_cases(query_start_loc, positions, idx):
            step_kwargs = {} if rows is None else {"idx_mapping": rows}
            results = []
            for runner in (mapper, jit, mapper):  # the second C launch: the variant found
                runner.out.fill_(POISON)
                runner(qsl, pos, n, **step_kwargs)
                results.append(runner.out.cpu().tolist())
            assert results[0] == results[1] == results[2], (name, n, r, what)
            kernel, grid, jit_args, jit_kwargs = mapper.jit_call(qsl, pos, n, **step_kwargs)
            variant = mapper._variants[mapper.step(n, r)[0]]
            aligned = tuple(
                t.data_ptr() % 16 == 0 for t in mapper._arguments(qsl, pos, n, r, rows)[1]
            )
            launch = variant.launches[aligned]
            if mapper.c_launch:
                assert launch, (name, n, r, what)  # the C launch took this step
                assert launch.compiled is c_launch.triton_choice(kernel, jit_args, jit_kwargs)
                launched += 1
    assert launched or not mapper.c_launch
    # And against the reference: the JIT path's output is the oracle's (the trace tests).


@needs_cuda
def test_a_warm_mapper_makes_no_jit_launch_on_the_gpu(monkeypatch) -> None:
    import triton

    mappers = [mapper for _, mapper, _ in all_mappers()]
    for mapper in mappers:
        mapper.warmup()
    steps = [(step, *step_tensors(step, DEVICE)) for step in serving_trace(**TRACE, seed=5)]
    rows = torch.arange(TRACE["max_num_reqs"], dtype=torch.int32, device=DEVICE)
    for step, query_start_loc, positions in steps:  # the variants' C launches found
        for mapper in mappers:
            extra = {"idx_mapping": rows} if mapper is mappers[-1] else {}
            mapper(query_start_loc, positions, step.num_tokens, **extra)
    jit = []
    real = triton.runtime.jit.JITFunction.run
    monkeypatch.setattr(
        triton.runtime.jit.JITFunction,
        "run",
        lambda self, *a, **k: jit.append(1) or real(self, *a, **k),
    )
    for step, query_start_loc, positions in steps:
        for mapper in mappers:
            extra = {"idx_mapping": rows} if mapper is mappers[-1] else {}
            mapper(query_start_loc, positions, step.num_tokens, **extra)
    torch.cuda.synchronize()
    assert jit == []


@needs_cuda
def test_a_launch_hook_sends_steps_the_jit_way() -> None:
    import triton

    mapper, _ = mapper_named("window")
    query_start_loc, positions, n = one_step()
    mapper(query_start_loc, positions, n)
    seen = []
    hook = lambda metadata: seen.append(metadata)  # noqa: E731
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        mapper(query_start_loc, positions, n)
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    assert len(seen) == 1  # a profiler still sees the launch


@needs_cuda
@pytest.mark.parametrize("block_size", [1, 16])
def test_integers_that_triton_specialises_get_their_own_variant(block_size) -> None:
    # A block size of 1 (a constexpr under Triton's rule) or 16 (divisible by 16), a table of
    # one column (stride 1): the C launch takes the variant Triton compiled for them.
    from slotmap.kernels import c_launch

    for width in (1, 5, 16):
        table = torch.arange(4 * width, dtype=torch.int32, device=DEVICE).view(4, width)
        mapper = SlotMapper(table, block_size, max_num_tokens=8)
        query_start_loc = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
        positions = torch.tensor([0, block_size * width - 1], dtype=torch.int64, device=DEVICE)
        for _ in range(2):
            mapper.out.fill_(POISON)
            mapper(query_start_loc, positions, 2)
            want = slotmap.slot_mapping_oracle(
                query_start_loc, positions, table, block_size, max_num_tokens=8
            )
            assert mapper.out.cpu().tolist() == want.tolist()
        kernel, _, args, kwargs = mapper.jit_call(query_start_loc, positions, 2)
        launch = next(iter(mapper._variants.values())).launches[(True, True)]
        assert launch.compiled is c_launch.triton_choice(kernel, args, kwargs)


@needs_cuda
def test_a_padded_decode_step_replays_from_a_graph_with_new_inputs() -> None:
    """As serving engines capture decode: GroupsMapper on persistent buffers, the step padded
    to a token bucket of B tokens and B requests (padding requests empty, idx_mapping -1),
    captured once; each replay maps the real query_start_loc[B] tokens of new inputs."""
    tables = [trace_table(16, 4, seed=g) for g in range(2)]
    layouts = group_layouts(
        2, [4, 4], None, cp_world_size=1, cp_rank=0, cp_interleave=1, pad_id=-1
    )
    mapper = GroupsMapper(tables, layouts, max_num_tokens=16, idx_mapping=True)
    mapper.warmup()
    bucket = 8
    qsl = torch.zeros(bucket + 1, dtype=torch.int32, device=DEVICE)
    positions = torch.zeros(bucket, dtype=torch.int64, device=DEVICE)
    rows = torch.full((bucket,), -1, dtype=torch.int32, device=DEVICE)
    mapper(qsl, positions, bucket, idx_mapping=rows)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mapper(qsl, positions, bucket, idx_mapping=rows)
    generator = torch.Generator().manual_seed(0)
    for r in (1, 3, 8, 5):
        first = torch.randint(0, 40, (r,), generator=generator)
        real_rows = torch.randperm(16, generator=generator)[:r].to(torch.int32)
        qsl.copy_(torch.arange(bucket + 1, dtype=torch.int32).clamp_(max=r))
        positions.fill_(1 << 40)  # stale positions past the real count: never mapped
        positions[:r].copy_(first)
        rows.fill_(-1)
        rows[:r].copy_(real_rows)
        mapper.out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        want = slotmap.slot_mappings_oracle(
            torch.arange(r + 1, dtype=torch.int32),
            first,
            [t.cpu() for t in tables],
            [4, 4],
            idx_mapping=real_rows,
            max_num_tokens=16,
        )
        assert mapper.out.cpu().tolist() == want.tolist(), r
