"""Junk contents through every slot-mapping launcher with ``validate=False``, in a process of
its own (tests/test_junk_contents.py starts it): a crash (SIGSEGV, an illegal memory access
that kills the CUDA context) then fails one test instead of ending the run.

``python tests/junk_fuzz.py EXAMPLES SEED small|big [TRACE]`` draws EXAMPLES batches with
hypothesis: any int32 ``query_start_loc`` (2**31 - 1, -2**31, out of order, past
``num_tokens``), positions of any int64, block tables of any int32, ``idx_mapping`` entries of
any int32 or int64, under every launcher, grid and knob (``parallel_tiles`` up to 3), into a
poisoned output inside a poisoned guard band. Each batch must leave the guard band as it was
and write every element of the output (docs/semantics.md §5). Exit 0 when every batch held, 1
with the failing batch; TRACE is a file that holds the batch being launched, for a process
that does not survive it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import seed as seed_of
from hypothesis import strategies as st

import slotmap

DEVICE = slotmap.DEVICE
POISON = -123_456_789
GUARD = 4096
INT32 = (-(2**31), 2**31 - 1)

# Values that break a computation near them, and small ones that look valid.
EDGES = st.sampled_from(
    (INT32[1], INT32[1] - 1, INT32[1] - 15, INT32[0], INT32[0] + 1, -1, 0, 1, 2**30, -(2**30))
)


def int32s(small: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(-2, small), EDGES, st.integers(*INT32))


def int64s(small: int) -> st.SearchStrategy[int]:
    wide = st.sampled_from((2**31, 2**32 + 3, -(2**31) - 1, 2**62, -(2**63), 2**63 - 1))
    return st.one_of(st.integers(-2, small), EDGES, wide, st.integers(-(2**63), 2**63 - 1))


# Launcher -> the knobs it takes; each batch draws one launcher and one set of knobs.
WINDOW = {
    "tile_size": (None, 16),
    "parallel_tiles": (None, 1, 2, 3),
    "gather_as_float": (None, True, False),
}
DIRECT = {
    "tile_size": (None, 16, 32),
    "parallel_tiles": (None, 1, 2, 3),
    "token_parallel": (None, True, False),
}
FUSED = {
    "tile_size": (None, 16, 32),
    "parallel_tiles": (None, 1, 2, 3),
    "token_parallel": (None, True, False),
    "lane_loads": (None, True, False),
}
LAUNCHERS = {"window": WINDOW, "direct": DIRECT, "fused": FUSED}
LAYOUTS = (
    {},
    {"circular": True},
    {"kv_cache_block_size": 8},
    {"cp_world_size": 2, "cp_rank": 1},
    {"cp_world_size": 3, "cp_rank": 0, "cp_interleave": 2, "kv_cache_block_size": 4},
)


@dataclass
class Junk:
    launcher: str
    knobs: dict[str, Any]
    layout: dict[str, Any]
    qsl: list[int]
    positions: list[int]
    table: list[list[int]]
    num_tokens: int
    max_num_tokens: int
    out_dtype: torch.dtype
    idx_mapping: list[int] | None = None
    idx_dtype: torch.dtype = torch.int32
    groups: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


@st.composite
def junk(draw: st.DrawFn, big: bool = False) -> Junk:
    launcher = draw(st.sampled_from(sorted(LAUNCHERS)))
    knobs = {name: draw(st.sampled_from(values)) for name, values in LAUNCHERS[launcher].items()}
    if knobs.get("token_parallel") and knobs.get("parallel_tiles") is not None:
        knobs["parallel_tiles"] = None  # the token grid takes no parallel tiles (a named error)
    if knobs.get("lane_loads") and knobs.get("gather_as_float") is not None:
        knobs["gather_as_float"] = None
    layout = dict(draw(st.sampled_from(LAYOUTS)))
    tokens = draw(st.integers(0, 2100 if big else 40))
    num_reqs = draw(st.integers(0, 6))
    qsl = draw(st.lists(int32s(tokens + 3), min_size=num_reqs + 1, max_size=num_reqs + 1))
    positions = draw(st.lists(int64s(64), min_size=min(tokens, 64), max_size=min(tokens, 64)))
    positions = (positions * (tokens // max(len(positions), 1) + 1))[:tokens]  # long, cheap
    positions += draw(st.lists(int64s(64), max_size=3))
    rows = num_reqs + draw(st.integers(0, 2))
    width = draw(st.integers(1, 4))
    table = draw(
        st.lists(
            st.lists(int32s(50), min_size=width, max_size=width),
            min_size=max(rows, 1),
            max_size=max(rows, 1),
        )
    )
    case = Junk(
        launcher,
        knobs,
        layout,
        qsl,
        positions,
        table,
        num_tokens=tokens,
        max_num_tokens=tokens + draw(st.sampled_from((0, 1, 5, 1030))),
        out_dtype=draw(st.sampled_from((torch.int32, torch.int64))),
    )
    if launcher == "fused":
        if draw(st.booleans()):
            case.idx_mapping = draw(
                st.lists(int32s(rows + 1), min_size=num_reqs, max_size=num_reqs + 2)
            )
            case.idx_dtype = draw(st.sampled_from((torch.int32, torch.int64)))
            if case.idx_dtype == torch.int64 and draw(st.booleans()):
                case.idx_mapping = [v * 2**32 + 1 if v > 0 else v for v in case.idx_mapping]
        case.groups = draw(st.integers(1, 2))
        case.extra["padded"] = draw(st.sampled_from((0, 0, 3)))  # a padded host count
    return case


def report_batches() -> list[Junk]:
    """The batches the report found crashing (SIGSEGV under the interpreter): a
    query_start_loc entry of 2**31 - 1 with parallel tiles, through each launcher."""
    batches = []
    for qsl in ([INT32[1], 4, 10], [0, INT32[1], 10], [INT32[0], INT32[1], 10]):
        for launcher, extra in (("window", {}), ("direct", {"token_parallel": False})):
            for parallel in (2, 3):
                knobs = {"tile_size": 16, "parallel_tiles": parallel, **extra}
                table = [[1, 2, 3, 4], [5, 6, 7, 8]]
                batches.append(
                    Junk(launcher, knobs, {}, qsl, list(range(10)), table, 10, 12, torch.int32)
                )
        for lanes in (True, False):
            knobs = {"tile_size": 16, "parallel_tiles": 2, "lane_loads": lanes}
            table = [[1, 2, 3, 4], [5, 6, 7, 8]]
            batches.append(
                Junk("fused", knobs, {}, qsl, list(range(10)), table, 10, 12, torch.int32)
            )
    return batches


def tensor(values, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def launch(case: Junk, out: torch.Tensor) -> None:
    qsl = tensor(case.qsl, torch.int32)
    positions = tensor(case.positions, torch.int64)
    table = tensor(case.table, torch.int32)
    common = dict(
        validate=False, out=out, num_tokens=case.num_tokens, max_num_tokens=case.max_num_tokens
    )
    knobs = {k: v for k, v in case.knobs.items() if v is not None}
    if case.launcher == "window":
        slotmap.compute_slot_mapping(qsl, positions, table, 4, **case.layout, **common, **knobs)
    elif case.launcher == "direct":
        slotmap.compute_slot_mapping_direct(
            qsl, positions, table, 4, **case.layout, **common, **knobs
        )
    else:
        layout = dict(case.layout)
        circular = [layout.pop("circular", False)] * case.groups
        kv = layout.pop("kv_cache_block_size", None)
        sizes = [kv or 4] * case.groups
        kernel = [4] * case.groups
        if layout.get("cp_world_size", 1) > 1:
            circular = [False] * case.groups
        idx = None if case.idx_mapping is None else tensor(case.idx_mapping, case.idx_dtype)
        slotmap.compute_slot_mappings(
            qsl,
            positions,
            [table] * case.groups,
            sizes,
            circular=circular,
            kernel_block_sizes=kernel,
            idx_mapping=idx,
            **layout,
            **common,
            **knobs,
        )


def check(case: Junk, trace: str | None) -> None:
    if case.extra.get("padded"):
        # A padded host count (the fused launcher's): num_tokens past the batch's tokens.
        case.num_tokens = min(case.num_tokens + case.extra["padded"], len(case.positions))
        case.max_num_tokens = max(case.max_num_tokens, case.num_tokens)
    shape = (
        (case.max_num_tokens,) if case.launcher != "fused" else (case.groups, case.max_num_tokens)
    )
    numel = shape[0] if len(shape) == 1 else shape[0] * shape[1]
    buffer = torch.full((numel + 2 * GUARD,), POISON, dtype=case.out_dtype, device=DEVICE)
    out = buffer[GUARD : GUARD + numel].view(shape)
    if trace:  # what was running, should the process not survive the launch
        with open(trace, "w") as file:
            file.write(repr(case))
    launch(case, out)
    verify(buffer, out, case)


def verify(buffer: torch.Tensor, out: torch.Tensor, case: Junk) -> None:
    host = buffer.cpu()
    numel = out.numel()
    assert torch.all(host[:GUARD] == POISON), f"wrote before out: {case}"
    assert torch.all(host[GUARD + numel :] == POISON), f"wrote after out: {case}"
    unwritten = (out.cpu() == POISON).nonzero().tolist()
    assert not unwritten, f"{len(unwritten)} elements of out never written {unwritten[:8]}: {case}"


def main(examples: int, seed: int, big: bool, trace: str | None) -> int:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate),  # no shrinking: a crash ends the process anyway
        suppress_health_check=list(HealthCheck),
    )
    @given(case=junk(big=big))
    @seed_of(seed)
    def run(case: Junk) -> None:
        check(case, trace)

    for batch in report_batches():
        run = example(case=batch)(run)
    run()
    print(f"junk fuzz: {examples} batches held", flush=True)
    return 0


if __name__ == "__main__":
    examples, seed, size = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    sys.exit(main(examples, seed, size == "big", sys.argv[4] if len(sys.argv) > 4 else None))
