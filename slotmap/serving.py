"""The serving loop's side of the library: a stateful mapper, warm-up, and a synthetic trace.

A model runner calls the slot mapping once per step, eagerly, in input preparation, with a
different ``num_tokens`` almost every step and fresh slices of its persistent buffers. The
launchers' plan cache is keyed by the batch's counts; ``SlotMapper`` is shaped for that loop
instead:

* it owns the persistent output buffer, and the block table (or, for several groups, the
  per-group metadata as a device tensor, built once);
* each step works out its launch from two host integers (``num_tokens`` and the number of
  requests, ``query_start_loc``'s length) by arithmetic: no plan keyed by the token count, no
  device sync, no host-to-device copy, so a step can be captured in a CUDA graph;
* ``warmup()`` compiles every kernel variant the configuration can choose, so none compiles
  in the middle of serving.

It trusts its inputs the way ``validate=False`` does (docs/semantics.md §5): the shapes are
checked once, at construction; the contents never.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from slotmap.kernels import direct, fused_groups, slot_mapping
from slotmap.kernels.launch import LaunchKnobs, Plan
from slotmap.layout import SlotLayout, as_int, cdiv
from slotmap.validate import check_tensor

# Keyword arguments of a plan that are runtime values, not compile-time constants.
KERNELS = ("window", "direct")


def variant_of(plan: Plan) -> tuple:
    """What Triton compiles a plan's launch for: the kernel and its compile-time constants
    (launch options such as ``num_warps`` included); runtime values left out."""
    constants = tuple(sorted(plan.constants.items()))
    return (f"{plan.kernel.fn.__module__}.{plan.kernel.fn.__name__}", constants)


class _Mapper(abc.ABC):
    """What both mappers share: the variants a configuration can choose, and warm-up."""

    max_num_tokens: int
    max_num_reqs: int
    out: Tensor
    pad_id: int

    @abc.abstractmethod
    def plan(self, num_tokens: int, num_reqs: int) -> Plan:
        """The launch of one step: arithmetic on two host integers."""

    def warm_call(self, n: int, r: int) -> tuple[tuple, dict]:
        """A call of r requests and n tokens (r - 1 of one token), as (args, kwargs)."""
        query_start_loc, positions = batch_tensors([1] * (r - 1) + [n - (r - 1)], self.out.device)
        return (query_start_loc, positions, n), {}

    def variants(self) -> dict[tuple, tuple[int, int]]:
        """Every kernel variant this mapper can launch, each with one (num_tokens, num_reqs)
        batch that launches it. The launch choices depend on the batch through its token
        count and mean request length, so each token count is tried with the request counts
        at which the mean crosses a threshold of the policy (and all requests of one token)."""
        found: dict[tuple, tuple[int, int]] = {}
        for n in range(1, self.max_num_tokens + 1):
            candidates = {1, n, n - 1}
            for mean in (2, 16, 64, 1024):
                candidates |= {cdiv(n, mean), cdiv(n, mean) - 1, cdiv(n, mean + 1)}
            for r in candidates:
                if 1 <= r <= min(n, self.max_num_reqs):
                    found.setdefault(variant_of(self.plan(n, r)), (n, r))
        return found

    def warmup(self) -> int:
        """Launch every variant once (on a batch of the shape that chooses it), so that none
        compiles while serving. Returns how many variants there are. Writes ``out``."""
        found = self.variants()
        for n, r in found.values():
            args, kwargs = self.warm_call(n, r)
            self(*args, **kwargs)
        self.out.fill_(self.pad_id)
        return len(found)


class SlotMapper(_Mapper):
    """One model runner's slot mapping for one KV-cache group, with its buffer and plans.

    ``block_table``: the runner's persistent [max_num_reqs, blocks] int32 table (request q of
    a step reads row q); ``layout``: the group's ``SlotLayout`` (an int: its block size);
    ``kernel``: "window" (production's) or "direct". ``mapper(query_start_loc, positions,
    num_tokens)`` writes and returns ``mapper.out``, [max_num_tokens] of ``out_dtype``.
    """

    def __init__(
        self,
        block_table: Tensor,
        layout: SlotLayout | int,
        *,
        max_num_tokens: int,
        kernel: str = "window",
        out_dtype: torch.dtype = torch.int32,
    ) -> None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
        self.layout = layout if isinstance(layout, SlotLayout) else SlotLayout.of(layout)
        check_tensor("block_table", block_table, (torch.int32,), 2, block_table.device, "it is")
        self.table = block_table
        self.kernel = kernel
        self.max_num_tokens = as_int("max_num_tokens", max_num_tokens)
        self.max_num_reqs = block_table.shape[0]
        self.pad_id = self.layout.pad_id
        self.out = torch.full(
            (max_num_tokens,), self.pad_id, dtype=out_dtype, device=block_table.device
        )
        self.knobs = LaunchKnobs()

    def plan(self, num_tokens: int, num_reqs: int) -> Plan:
        """The launch of one step: arithmetic on two host integers."""
        if self.kernel == "window":
            return slot_mapping.window_plan(self.layout, self.knobs, num_tokens, num_reqs)
        return direct.direct_plan(
            self.layout, self.knobs, num_tokens, self.max_num_tokens, num_reqs, self.max_num_reqs
        )

    def __call__(self, query_start_loc: Tensor, positions: Tensor, num_tokens: int) -> Tensor:
        plan = self.plan(num_tokens, query_start_loc.shape[0] - 1)
        plan.kernel[plan.grid](
            num_tokens,
            self.max_num_tokens,
            query_start_loc,
            positions,
            self.table,
            self.table.stride(0),
            self.layout.block_size,
            self.out,
            **plan.constants,
            **plan.runtime,
        )
        return self.out


class GroupsMapper(_Mapper):
    """A multi-group runner's slot mapping: the fused kernel, its persistent
    [groups, max_num_tokens] output and the per-group metadata as a device tensor, built once.

    ``block_tables``: one persistent int32 table a group (None for a disabled group);
    ``layouts``: one ``SlotLayout`` a group, as ``slotmap.layout.group_layouts`` builds them
    (its block sizes, circular flags, switches and CP); ``idx_mapping``: whether each step
    passes one (request q reads row ``idx_mapping[q]``, -1 a dummy request).
    ``mapper(query_start_loc, positions, num_tokens, idx_mapping=None)`` writes and returns
    ``mapper.out``.
    """

    def __init__(
        self,
        block_tables: Sequence[Tensor | None],
        layouts: Sequence[SlotLayout],
        *,
        max_num_tokens: int,
        idx_mapping: bool = False,
        out_dtype: torch.dtype = torch.int32,
    ) -> None:
        self.tables, self.layouts = tuple(block_tables), tuple(layouts)
        enabled = [
            t for t, layout in zip(self.tables, self.layouts, strict=True) if layout.enabled
        ]
        if not enabled:
            raise ValueError("at least one group must map tokens")
        for g, table in enumerate(enabled):
            check_tensor(
                f"block_tables[{g}]", table, (torch.int32,), 2, enabled[0].device, "the first is"
            )
        device = enabled[0].device
        self.max_num_tokens = as_int("max_num_tokens", max_num_tokens)
        self.max_num_reqs = fused_groups.enabled_rows(self.tables, self.layouts)
        self.idx_mapping = idx_mapping
        self.pad_id = self.layouts[0].pad_id
        self.out = torch.full(
            (len(self.tables), max_num_tokens), self.pad_id, dtype=out_dtype, device=device
        )
        self.meta = fused_groups.group_metadata(self.tables, self.layouts, device)
        self.knobs = LaunchKnobs()

    def plan(self, num_tokens: int, num_reqs: int) -> Plan:
        """The launch of one step: arithmetic on two host integers."""
        return fused_groups.fused_plan(
            self.layouts,
            self.knobs,
            num_tokens,
            self.max_num_tokens,
            num_reqs,
            self.idx_mapping,
            self.max_num_reqs,
        )

    def warm_call(self, n: int, r: int) -> tuple[tuple, dict]:
        args, kwargs = super().warm_call(n, r)
        if self.idx_mapping:
            kwargs["idx_mapping"] = torch.arange(r, dtype=torch.int32, device=self.out.device)
        return args, kwargs

    def __call__(
        self,
        query_start_loc: Tensor,
        positions: Tensor,
        num_tokens: int,
        idx_mapping: Tensor | None = None,
    ) -> Tensor:
        if (idx_mapping is not None) != self.idx_mapping:
            raise ValueError(f"this mapper was built with idx_mapping={self.idx_mapping}")
        num_reqs = query_start_loc.shape[0] - 1
        plan = self.plan(num_tokens, num_reqs)
        plan.kernel[plan.grid](
            num_tokens,
            self.max_num_tokens,
            num_reqs,
            query_start_loc,
            positions,
            query_start_loc if idx_mapping is None else idx_mapping,
            self.max_num_reqs,
            self.meta,
            self.out,
            self.out.stride(0),
            **plan.constants,
            **plan.runtime,
        )
        return self.out


def warmup(*mappers: _Mapper) -> int:
    """``mapper.warmup()`` for each mapper; returns the variants compiled in all."""
    return sum(mapper.warmup() for mapper in mappers)


def batch_tensors(lengths: Sequence[int], device: torch.device | str) -> tuple[Tensor, Tensor]:
    """query_start_loc and positions of a batch of fresh requests of these lengths (positions
    0..n-1 each)."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    positions = [p for n in lengths for p in range(n)]
    return (
        torch.tensor(starts, dtype=torch.int32, device=device),
        torch.tensor(positions, dtype=torch.int64, device=device),
    )


@dataclass(frozen=True)
class Step:
    """One serving step: its requests in batch order, each as (first position, tokens). As in
    a v1-style runner, request q of the batch owns row q of the block table."""

    requests: tuple[tuple[int, int], ...]

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.requests)


def serving_trace(
    steps: int,
    max_num_reqs: int,
    max_num_tokens: int,
    *,
    prompt: tuple[int, int] = (64, 2048),
    output: tuple[int, int] = (16, 256),
    chunk: int | None = None,
    seed: int = 0,
) -> Iterator[Step]:
    """A synthetic serving trace: requests arrive, their prompts are prefilled in chunks
    (chunked prefill, at most ``chunk`` tokens a request a step; default the token budget)
    beside the running requests' decode tokens, under a budget of ``max_num_tokens`` tokens and
    ``max_num_reqs`` requests a step; finished requests leave the batch. ``num_tokens``
    changes almost every step, as in a real engine."""
    rng = random.Random(seed)
    chunk = max_num_tokens if chunk is None else chunk
    running: list[list[int]] = []  # [next position, prompt tokens, tokens to generate]
    for _ in range(steps):
        while len(running) < max_num_reqs and rng.random() < 0.5:
            running.append([0, rng.randint(*prompt), rng.randint(*output)])
        budget, scheduled = max_num_tokens, []
        for state in running:
            position, prompt_len, _ = state
            want = min(prompt_len - position, chunk) if position < prompt_len else 1
            take = min(want, budget)
            if take <= 0:
                break
            scheduled.append((position, take))
            budget -= take
            state[0] += take
        if scheduled:
            yield Step(tuple(scheduled))
        running = [state for state in running if state[0] < state[1] + state[2]]


def step_tensors(step: Step, device: torch.device | str) -> tuple[Tensor, Tensor]:
    """query_start_loc and positions of a step, as fresh tensors."""
    starts, positions = [0], []
    for first, n in step.requests:
        starts.append(starts[-1] + n)
        positions.extend(range(first, first + n))
    return (
        torch.tensor(starts, dtype=torch.int32, device=device),
        torch.tensor(positions, dtype=torch.int64, device=device),
    )
