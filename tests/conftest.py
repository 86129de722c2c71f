"""Shared test helpers: hypothesis profiles, case builders, poisoned and guarded outputs.

Every tensor is built on ``slotmap.DEVICE``, so the same suite runs under Triton's CPU
interpreter and on a GPU. Test modules import the helpers with ``from conftest import ...``
(``tests/`` has no ``__init__.py``, so pytest puts it on ``sys.path``).

Two rules every comparison here follows:

* integer outputs compare exactly (``torch.equal``), never with a tolerance;
* every output is pre-filled with ``POISON`` and sits inside a larger ``POISON`` buffer, so an
  element the code under test forgot to write, or one it wrote outside the output, fails.

Hypothesis profiles (``HYPOTHESIS_PROFILE`` picks one; ``ci`` by default): ``ci`` is
derandomised and small enough for the interpreter on two cores; ``dev`` searches harder;
``mutants`` is ``ci`` without shrinking, for the mutation tests' subprocesses.
"""

from __future__ import annotations

import math
import os
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from torch import Tensor

import slotmap  # chooses the backend: conftest is imported before any test module

# The suite reads the course's English messages; a zh locale would choose Chinese (set before
# slotmap.DEVICE imports slotmap.i18n; tests/test_i18n.py sets the language where it means to).
os.environ["SLOTMAP_LANG"] = "en"
DEVICE = slotmap.DEVICE
# A device that is not DEVICE, for "tensors on different devices": "meta" needs no hardware.
OTHER_DEVICE = "meta" if DEVICE == "cpu" else "cpu"
POISON = -999  # pre-fills every output: never a slot (slots are >= 0) nor a pad_id we use
GUARD = 29  # poisoned elements on each side of an output (odd, so no alignment hides a write)
INT32_MAX = 2**31 - 1

# The mutation tests run this suite against a mutated copy of slotmap: make sure it is that copy.
_expected_package = os.environ.get("SLOTMAP_TEST_EXPECT_PACKAGE")
if _expected_package:
    _found = os.path.realpath(slotmap.__file__)
    if not _found.startswith(os.path.realpath(_expected_package)):
        raise RuntimeError(f"expected slotmap from {_expected_package}, imported {_found}")

# ---------------------------------------------------------------------------------------------
# Hypothesis profiles
# ---------------------------------------------------------------------------------------------
settings.register_profile(
    "ci",
    deadline=None,  # the interpreter's first call of a kernel variant is slow
    derandomize=True,
    database=None,
    max_examples=30,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", parent=settings.get_profile("ci"), derandomize=False, max_examples=400
)
settings.register_profile(
    "mutants",
    parent=settings.get_profile("ci"),
    max_examples=25,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: a failure is enough
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)


def pytest_report_header(config) -> str:
    return f"slotmap: backend {slotmap.BACKEND.name} on {DEVICE}; hypothesis profile {PROFILE}"


# The suite's longest single tests (a hub with four learners, the decks in chromium) sort last
# by name. xdist hands tests out in collection order, so these start first instead of keeping
# one worker busy while the others wait at the end.
RUN_FIRST = ("test_workshop_hub.py", "test_workshop_slides.py")
assert all((Path(__file__).parent / name).exists() for name in RUN_FIRST), RUN_FIRST


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook puts the groups in the ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test`` runs ``--dist loadgroup``) the tests of a module that
    share one of its module-scoped fixtures run on one worker: each worker would set the
    fixture up again (a JupyterLab server and chromium, ranks, a grading run). RUN_FIRST's
    modules are collected first; the order is otherwise kept."""
    items.sort(key=lambda item: item.path.name not in RUN_FIRST)
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        # name2fixturedefs: every fixture the test needs, its dependencies' included.
        shared = [
            definitions[-1]
            for definitions in item._fixtureinfo.name2fixturedefs.values()
            if definitions and definitions[-1].scope == "module"
        ]
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker under ``--dist loadgroup`` refuses to run when a grouped test's id lacks its
    group: xdist tells its scheduler the group through the id, and pytest 9.2's structured ids
    dropped it without a word (pytest-xdist#1386), spreading a group over every worker."""
    if not (
        os.environ.get("PYTEST_XDIST_WORKER")
        and getattr(session.config.option, "loadgroup", False)
    ):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if lost:
        message = (
            f"pytest-xdist's loadgroup lost the group of {len(lost)} tests ({lost[0]}, ...): "
            "this pytest and pytest-xdist do not work together (pytest-xdist#1386)"
        )
        print(message, file=sys.stderr)  # the worker's own error is not shown
        raise pytest.UsageError(message)


# ---------------------------------------------------------------------------------------------
# Poisoned, guarded outputs and exact comparison
# ---------------------------------------------------------------------------------------------
class Guarded:
    """A POISON-filled output that is the middle of a larger POISON-filled buffer.

    ``out`` is contiguous (a launcher accepts it); ``check()`` asserts that nothing outside it
    changed and that every element of it was written.
    """

    def __init__(self, shape: int | Sequence[int], dtype: torch.dtype = torch.int32) -> None:
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.numel = math.prod(self.shape)
        self.buffer = torch.full((self.numel + 2 * GUARD,), POISON, dtype=dtype, device=DEVICE)
        self.out = self.buffer[GUARD : GUARD + self.numel].view(self.shape)

    def check_guards(self) -> None:
        before = self.buffer[:GUARD].cpu()
        after = self.buffer[GUARD + self.numel :].cpu()
        assert torch.all(before == POISON), f"wrote before the output: {before.tolist()}"
        assert torch.all(after == POISON), f"wrote after the output: {after.tolist()}"

    def check(self) -> Tensor:
        self.check_guards()
        unwritten = (self.out.cpu() == POISON).nonzero().tolist()
        assert not unwritten, f"output elements never written (still POISON): {unwritten[:20]}"
        return self.out


def call_guarded(
    fn: Callable[..., Tensor],
    *args: Any,
    out_shape: int | Sequence[int],
    out_dtype: torch.dtype = torch.int32,
    **kwargs: Any,
) -> Tensor:
    """``fn(*args, out=<poisoned guarded buffer>, **kwargs)``; checks guards and full coverage."""
    guarded = Guarded(out_shape, out_dtype)
    result = fn(*args, out=guarded.out, **kwargs)
    assert result.data_ptr() == guarded.out.data_ptr(), "the result is not the out= tensor"
    assert result.shape == guarded.out.shape and result.dtype == out_dtype
    return guarded.check()


def assert_slots_equal(actual: Tensor, expected: Tensor | Sequence[int], what: str = "") -> None:
    """Exact equality of integer outputs, with the first mismatches spelled out."""
    actual = actual.cpu()
    expected = torch.as_tensor(expected).cpu() if not isinstance(expected, Tensor) else expected
    expected = expected.cpu().to(actual.dtype)
    assert actual.shape == expected.shape, f"{what} shape {actual.shape} != {expected.shape}"
    if torch.equal(actual, expected):
        return
    wrong = (actual != expected).nonzero().tolist()
    lines = [
        f"  at {tuple(i)}: got {int(actual[tuple(i)])}, expected {int(expected[tuple(i)])}"
        for i in wrong[:12]
    ]
    raise AssertionError(f"{what} {len(wrong)} element(s) differ:\n" + "\n".join(lines))


# ---------------------------------------------------------------------------------------------
# Implementations of one group's slot mapping, all with the launcher's signature
# ---------------------------------------------------------------------------------------------
def fused_single_group(
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    block_size: int,
    *,
    kv_cache_block_size: int | None = None,
    circular: bool = False,
    out: Tensor | None = None,
    **kwargs: Any,
) -> Tensor:
    """One group through the multi-group launcher ``compute_slot_mappings``.

    The multi-group launcher has no ``kv_cache_block_size``: a group's physical block is its
    block size. Without CP that changes nothing (hybrid blocks are then just an expanded
    table), so callers use this only with ``cp_world_size == 1`` or ``kv == block_size``.
    """
    if kwargs.get("cp_world_size", 1) > 1:
        assert kv_cache_block_size in (None, block_size), "multi-group has no hybrid CP"
    result = slotmap.compute_slot_mappings(
        query_start_loc,
        positions,
        [block_table],
        [block_size],
        circular=[circular],
        out=None if out is None else out.view(1, -1),
        **kwargs,
    )
    return out if out is not None else result[0]


def _window(**fixed: Any) -> Callable[..., Tensor]:
    def run(*args: Any, **kwargs: Any) -> Tensor:
        return slotmap.compute_slot_mapping(*args, **kwargs, **fixed)

    return run


def _direct(**fixed: Any) -> Callable[..., Tensor]:
    def run(*args: Any, **kwargs: Any) -> Tensor:
        return slotmap.compute_slot_mapping_direct(*args, **kwargs, **fixed)

    return run


def _fused(**fixed: Any) -> Callable[..., Tensor]:
    def run(*args: Any, **kwargs: Any) -> Tensor:
        return fused_single_group(*args, **kwargs, **fixed)

    return run


# name -> (callable factory, takes part in hybrid-CP cases). Resolved at call time, so a
# launcher that does not exist yet fails only the tests that use it.
SINGLE_GROUP_IMPLEMENTATIONS: dict[str, tuple[Callable[[], Callable[..., Tensor]], bool]] = {
    "oracle": (lambda: slotmap.slot_mapping_oracle, True),
    "torch": (lambda: slotmap.slot_mapping_torch, True),
    "window": (lambda: _window(), True),
    "window-tile16": (lambda: _window(tile_size=16), True),
    "window-float": (lambda: _window(gather_as_float=True), True),
    "window-int": (lambda: _window(gather_as_float=False), True),
    "direct": (lambda: slotmap.compute_slot_mapping_direct, True),
    "direct-requests": (lambda: _direct(token_parallel=False), True),
    "direct-tokens-tile128": (lambda: _direct(token_parallel=True, tile_size=128), True),
    "fused": (lambda: _fused(), False),
    "fused-tile16": (lambda: _fused(tile_size=16, parallel_tiles=2), False),
    "fused-lanes-tile16": (lambda: _fused(tile_size=16, parallel_tiles=2, lane_loads=True), False),
    "fused-window-tile16": (
        lambda: _fused(tile_size=16, parallel_tiles=2, lane_loads=False),
        False,
    ),
    "fused-tokens-tile128": (lambda: _fused(token_parallel=True, tile_size=128), False),
}


def implementation(name: str) -> Callable[..., Tensor]:
    return SINGLE_GROUP_IMPLEMENTATIONS[name][0]()


# ---------------------------------------------------------------------------------------------
# Case builders
# ---------------------------------------------------------------------------------------------
ORDERS = ("contiguous", "tile-shuffled", "shuffled", "scattered")


@dataclass
class Case:
    """One batch for a single-group slot mapping: the launcher's arguments."""

    query_start_loc: Tensor
    positions: Tensor
    block_table: Tensor
    block_size: int
    options: dict[str, Any] = field(default_factory=dict)  # keyword arguments

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    @property
    def max_num_tokens(self) -> int:
        return self.options.get("max_num_tokens") or self.num_tokens

    def args(self) -> tuple[Tensor, Tensor, Tensor, int]:
        return self.query_start_loc, self.positions, self.block_table, self.block_size

    def run(
        self, fn: Callable[..., Tensor], out_dtype: torch.dtype = torch.int32, **extra: Any
    ) -> Tensor:
        """``fn`` on this case with a poisoned, guarded ``out``."""
        return call_guarded(
            fn,
            *self.args(),
            out_shape=self.max_num_tokens,
            out_dtype=out_dtype,
            **self.options,
            **extra,
        )

    def expected(self, out_dtype: torch.dtype = torch.int32) -> Tensor:
        return self.run(slotmap.slot_mapping_oracle, out_dtype)


@dataclass
class MultiCase:
    """One batch for a multi-group slot mapping."""

    query_start_loc: Tensor
    positions: Tensor
    block_tables: list[Tensor]
    block_sizes: list[int]
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    @property
    def max_num_tokens(self) -> int:
        return self.options.get("max_num_tokens") or self.num_tokens

    @property
    def out_shape(self) -> tuple[int, int]:
        return len(self.block_tables), self.max_num_tokens

    def args(self) -> tuple[Tensor, Tensor, list[Tensor], list[int]]:
        return self.query_start_loc, self.positions, self.block_tables, self.block_sizes

    def run(self, fn: Callable[..., Tensor], **extra: Any) -> Tensor:
        return call_guarded(fn, *self.args(), out_shape=self.out_shape, **self.options, **extra)


def tensor(values: Sequence[int] | Sequence[Sequence[int]], dtype: torch.dtype) -> Tensor:
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def qsl_of(lengths: Sequence[int]) -> Tensor:
    """query_start_loc (int32) of requests with these numbers of tokens."""
    starts = [0]
    for length in lengths:
        starts.append(starts[-1] + length)
    return tensor(starts, torch.int32)


def make_positions(
    rng: random.Random,
    lengths: Sequence[int],
    first_positions: Sequence[int],
    order: str = "contiguous",
    chunk: int = 16,
) -> list[list[int]]:
    """Positions of each request.

    ``contiguous``: ``first, first + 1, ...``; ``tile-shuffled``: the same set, shuffled inside
    each run of ``chunk`` tokens (aligned to the request's first token, like the kernels'
    tiles, so every tile of a power-of-two size >= chunk still holds a contiguous set);
    ``shuffled``: shuffled across the whole request; ``scattered``: distinct positions
    anywhere in ``[first, first + 4 * length + 8)``.
    """
    result = []
    for length, first in zip(lengths, first_positions, strict=True):
        if order == "scattered":
            pos = rng.sample(range(first, first + 4 * length + 8), length)
        else:
            pos = list(range(first, first + length))
            if order == "shuffled":
                rng.shuffle(pos)
            elif order == "tile-shuffled":
                for start in range(0, length, chunk):
                    piece = pos[start : start + chunk]
                    rng.shuffle(piece)
                    pos[start : start + chunk] = piece
            else:
                assert order == "contiguous", order
        result.append(pos)
    return result


def blocks_needed(
    max_position: int,
    block_size: int,
    blocks_per_kv_block: int = 1,
    cp_world_size: int = 1,
    circular: bool = False,
) -> int:
    """Attention blocks a block-table row needs for positions up to ``max_position``, on any
    rank. An upper bound derived independently of slotmap: a virtual block of
    ``kv * W`` positions holds ``blocks_per_kv_block`` attention blocks on each rank."""
    if circular or max_position < 0:
        return 1
    virtual_block_size = block_size * blocks_per_kv_block * cp_world_size
    return (max_position // virtual_block_size + 1) * blocks_per_kv_block


def largest_block(block_size: int) -> int:
    """The largest physical block whose every slot fits in int32."""
    return (INT32_MAX - (block_size - 1)) // block_size


def make_block_table(
    rng: random.Random,
    rows: int,
    row_blocks: int,
    block_size: int,
    blocks_per_kv_block: int = 1,
    large: bool = False,
) -> Tensor:
    """[rows, >= row_blocks] int32 table of distinct physical (attention) blocks.

    With ``blocks_per_kv_block > 1`` it is a table of distinct physical KV blocks expanded by
    ``slotmap.expand_block_table``. ``large`` draws block numbers above 2**24 (float32 cannot
    hold them exactly).
    """
    kv_blocks = -(-max(row_blocks, 1) // blocks_per_kv_block)
    count = rows * kv_blocks
    top = (largest_block(block_size) - (blocks_per_kv_block - 1)) // blocks_per_kv_block
    low = 2**24 + 1 if large and top - 2**24 > count else 0
    high = top if large else min(top, max(4 * count, 64))
    numbers = rng.sample(range(low, high + 1), count)
    table = tensor(numbers, torch.int32).view(rows, kv_blocks)
    if blocks_per_kv_block > 1:
        table = slotmap.expand_block_table(table, blocks_per_kv_block)
    return table.contiguous()


def make_case(
    lengths: Sequence[int],
    block_size: int,
    *,
    seed: int = 0,
    first_positions: Sequence[int] | None = None,
    order: str = "contiguous",
    chunk: int = 16,
    blocks_per_kv_block: int = 1,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    circular: bool = False,
    extra_tokens: int = 0,
    extra_positions: int = 0,
    extra_rows: int = 0,
    extra_row_blocks: int = 0,
    large_blocks: bool = False,
    pad_id: int = -1,
    explicit_num_tokens: bool = False,
) -> Case:
    """A random valid batch. ``first_positions`` default: random, crossing a few virtual blocks
    (negative ones too in circular mode). ``extra_tokens``: padding tail (max_num_tokens -
    num_tokens); ``extra_positions``: garbage positions past num_tokens that must be ignored."""
    rng = random.Random(seed)
    kv_cache_block_size = block_size * blocks_per_kv_block
    reach = 2 * kv_cache_block_size * cp_world_size + 2 * block_size
    if first_positions is None and circular:
        # About half the requests start with a padded tail of negative positions.
        first_positions = [rng.randint(-length - 2, length + 2) for length in lengths]
    elif first_positions is None:
        first_positions = [rng.randint(0, reach) for _ in lengths]
    per_request = make_positions(rng, lengths, first_positions, order, chunk)
    flat = [p for request in per_request for p in request]
    garbage = [rng.choice([-5, 2**40, 3, -(2**40)]) for _ in range(extra_positions)]
    row_blocks = blocks_needed(
        max(flat, default=0), block_size, blocks_per_kv_block, cp_world_size, circular
    )
    table = make_block_table(
        rng,
        len(lengths) + extra_rows,
        row_blocks + extra_row_blocks,
        block_size,
        blocks_per_kv_block,
        large_blocks,
    )
    num_tokens = len(flat)
    options: dict[str, Any] = {}
    if extra_tokens:
        options["max_num_tokens"] = num_tokens + extra_tokens
    if explicit_num_tokens:
        options["num_tokens"] = num_tokens
    if blocks_per_kv_block > 1 or cp_world_size > 1:
        options["kv_cache_block_size"] = kv_cache_block_size
    if cp_world_size > 1:
        options.update(cp_world_size=cp_world_size, cp_rank=cp_rank, cp_interleave=cp_interleave)
    if circular:
        options["circular"] = True
    if pad_id != -1:
        options["pad_id"] = pad_id
    return Case(qsl_of(lengths), tensor(flat + garbage, torch.int64), table, block_size, options)


def make_multi_case(
    lengths: Sequence[int],
    block_sizes: Sequence[int],
    *,
    seed: int = 0,
    circular: Sequence[bool] | None = None,
    first_positions: Sequence[int] | None = None,
    order: str = "contiguous",
    chunk: int = 16,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    use_idx_mapping: bool = False,
    extra_tokens: int = 0,
    extra_positions: int = 0,
    extra_rows: Sequence[int] | None = None,
    large_blocks: bool = False,
    pad_id: int = -1,
) -> MultiCase:
    """A random valid multi-group batch: one block table per group, shared positions.

    Positions are negative only when every group is circular (a non-circular group rejects
    them). ``use_idx_mapping`` sends the requests to random distinct rows of the tables.
    """
    rng = random.Random(seed)
    groups = len(block_sizes)
    circular = list(circular) if circular is not None else [False] * groups
    all_circular = all(circular)
    reach = 2 * max(block_sizes) * cp_world_size + 8
    if first_positions is None and all_circular:
        first_positions = [rng.randint(-length - 2, length + 8) for length in lengths]
    elif first_positions is None:
        first_positions = [rng.randint(0, reach) for _ in lengths]
    per_request = make_positions(rng, lengths, first_positions, order, chunk)
    flat = [p for request in per_request for p in request]
    num_reqs = len(lengths)
    extra_rows = list(extra_rows) if extra_rows is not None else [0] * groups
    tables = []
    for g in range(groups):
        row_blocks = blocks_needed(
            max(flat, default=0), block_sizes[g], 1, cp_world_size, circular[g]
        )
        tables.append(
            make_block_table(
                rng,
                num_reqs + extra_rows[g],
                row_blocks + rng.randint(0, 2),
                block_sizes[g],
                large=large_blocks,
            )
        )
    options: dict[str, Any] = {}
    if any(circular):
        options["circular"] = circular
    if use_idx_mapping:
        rows = min(t.shape[0] for t in tables)
        options["idx_mapping"] = tensor(rng.sample(range(rows), num_reqs), torch.int32)
    if extra_tokens:
        options["max_num_tokens"] = len(flat) + extra_tokens
    if cp_world_size > 1:
        options.update(cp_world_size=cp_world_size, cp_rank=cp_rank, cp_interleave=cp_interleave)
    if pad_id != -1:
        options["pad_id"] = pad_id
    garbage = [rng.choice([-5, 2**40, 3]) for _ in range(extra_positions)]
    positions = tensor(flat + garbage, torch.int64)
    return MultiCase(qsl_of(lengths), positions, tables, list(block_sizes), options)


# ---------------------------------------------------------------------------------------------
# Hypothesis strategies
# ---------------------------------------------------------------------------------------------
BLOCK_SIZES = (1, 2, 3, 4, 5, 7, 16, 48, 128)
TILES = (16, 32, 64, 1024)
PAD_IDS = (-1, -1, -1, -7)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def request_lengths(max_requests: int, max_length: int) -> st.SearchStrategy[list[int]]:
    """Mostly a few requests, some empty, many spanning several small tiles."""
    num_reqs = st.sampled_from([n for n in (0, 1, 1, 2, 2, 3, 4, 4, 5) if n <= max_requests])
    length = st.one_of(
        st.sampled_from([n for n in (0, 1, 2, 15, 16, 17, 31, 33, 40, 64) if n <= max_length]),
        st.integers(0, max_length),
    )
    return num_reqs.flatmap(lambda n: st.lists(length, min_size=n, max_size=n))


SINGLE_GROUP_MODES = ("plain", "hybrid", "cp", "cp-hybrid", "circular")
MULTI_GROUP_MODES = ("mixed", "some-circular", "all-circular", "cp")


@st.composite
def slot_mapping_cases(
    draw: st.DrawFn,
    mode: str | None = None,
    *,
    orders: Sequence[str] = ("contiguous", "tile-shuffled"),
    chunk: int = 16,
    max_requests: int = 4,
    max_length: int = 40,
    lengths: st.SearchStrategy[list[int]] | None = None,
) -> Case:
    """Any valid single-group case of one mode (``SINGLE_GROUP_MODES``; None: any).

    Block sizes incl. non-powers of two, CP with every rank and every interleave dividing the
    kv block, circular with negative positions, empty requests, padding tails, big block
    numbers, garbage positions past num_tokens, explicit num_tokens, a custom pad_id.
    ``lengths``: the requests' lengths (default: ``request_lengths``).
    """
    if mode is None:
        mode = draw(st.sampled_from(SINGLE_GROUP_MODES))
    assert mode in SINGLE_GROUP_MODES, mode
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    blocks_per_kv_block = draw(st.sampled_from((2, 3, 4))) if "hybrid" in mode else 1
    cp_world_size = draw(st.sampled_from((2, 3, 4))) if mode.startswith("cp") else 1
    kv_cache_block_size = block_size * blocks_per_kv_block
    cp_rank = draw(st.integers(0, cp_world_size - 1))
    cp_interleave = draw(st.sampled_from(divisors(kv_cache_block_size)))
    lengths = draw(request_lengths(max_requests, max_length) if lengths is None else lengths)
    return make_case(
        lengths,
        block_size,
        seed=draw(st.integers(0, 2**32 - 1)),
        order=draw(st.sampled_from(orders)),
        chunk=chunk,
        blocks_per_kv_block=blocks_per_kv_block,
        cp_world_size=cp_world_size,
        cp_rank=cp_rank,
        cp_interleave=cp_interleave,
        circular=mode == "circular",
        extra_tokens=draw(st.sampled_from((0, 0, 1, 5, 23))),
        extra_positions=draw(st.sampled_from((0, 0, 3))),
        extra_rows=draw(st.integers(0, 2)),
        extra_row_blocks=draw(st.integers(0, 3)),
        large_blocks=draw(st.booleans()),
        pad_id=draw(st.sampled_from(PAD_IDS)),
        explicit_num_tokens=draw(st.booleans()),
    )


@st.composite
def multi_group_cases(
    draw: st.DrawFn,
    mode: str | None = None,
    *,
    orders: Sequence[str] = ("contiguous", "tile-shuffled"),
    chunk: int = 16,
    max_groups: int = 3,
    max_requests: int = 4,
    max_length: int = 40,
    lengths: st.SearchStrategy[list[int]] | None = None,
) -> MultiCase:
    """Any valid multi-group case of one mode (``MULTI_GROUP_MODES``; None: any): mixed
    block sizes, circular groups (``all-circular`` has negative positions), idx_mapping, CP."""
    if mode is None:
        mode = draw(st.sampled_from(MULTI_GROUP_MODES))
    assert mode in MULTI_GROUP_MODES, mode
    groups = draw(st.integers(1, max_groups))
    block_sizes = draw(st.lists(st.sampled_from(BLOCK_SIZES), min_size=groups, max_size=groups))
    cp_world_size = draw(st.sampled_from((2, 3, 4))) if mode == "cp" else 1
    cp_rank = draw(st.integers(0, cp_world_size - 1))
    cp_interleave = draw(st.sampled_from(divisors(math.gcd(*block_sizes))))
    if mode == "all-circular":
        circular = [True] * groups
    elif mode == "some-circular":
        circular = draw(st.lists(st.booleans(), min_size=groups, max_size=groups))
        circular[draw(st.integers(0, groups - 1))] = True
    else:
        circular = [False] * groups
    lengths = draw(request_lengths(max_requests, max_length) if lengths is None else lengths)
    return make_multi_case(
        lengths,
        block_sizes,
        seed=draw(st.integers(0, 2**32 - 1)),
        circular=circular,
        order=draw(st.sampled_from(orders)),
        chunk=chunk,
        cp_world_size=cp_world_size,
        cp_rank=cp_rank,
        cp_interleave=cp_interleave,
        use_idx_mapping=draw(st.booleans()),
        extra_tokens=draw(st.sampled_from((0, 0, 1, 5, 23))),
        extra_positions=draw(st.sampled_from((0, 0, 3))),
        extra_rows=draw(st.lists(st.integers(0, 2), min_size=groups, max_size=groups)),
        large_blocks=draw(st.booleans()),
        pad_id=draw(st.sampled_from(PAD_IDS)),
    )


@pytest.fixture(autouse=True)
def _close_figures():
    """Figures a test drew are closed after it (only where matplotlib was imported)."""
    yield
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")
