"""The serving loop's side of the library: a stateful mapper, warm-up, and a synthetic trace.

A model runner calls the slot mapping once per step, eagerly, in input preparation, with a
different ``num_tokens`` almost every step and fresh slices of its persistent buffers. The
launchers' plan cache is keyed by the batch's counts; ``SlotMapper`` is shaped for that loop
instead:

* it owns the persistent output buffer, and the block table (or, for several groups, the
  per-group metadata as a device tensor, built once);
* each step works out its launch from two host integers (``num_tokens`` and the number of
  requests, ``query_start_loc``'s length) by arithmetic (``step``, which the tests hold
  equal to the launchers' planner, ``plan``), remembered by those two counts: no device
  sync, no host-to-device copy, so a step can be captured in a CUDA graph;
* on an NVIDIA GPU it launches through Triton's own C launcher (``kernels/c_launch.py``):
  the compiled variant is chosen per step by the key Triton itself would compute (the
  variant's constants, and whether each per-step pointer is 16-byte aligned; the per-step
  integers are ``do_not_specialize``), found through Triton's own cache after the variant's
  first launch through ``kernel[grid](...)``. Elsewhere (the CPU interpreter, the NPU, an
  unverified Triton, a profiler's launch hook) every step takes ``kernel[grid](...)``, as it
  does when ``mapper.c_launch`` is set False;
* ``warmup()`` compiles every kernel variant the configuration can choose, so none compiles
  in the middle of serving.

What a step checks, with host integers only (attribute reads, no device sync): the inputs'
dtypes, ranks, contiguity and device; ``num_tokens`` within ``[0, max_num_tokens]``; at most
as many requests as the tables have rows; ``positions`` at least ``num_tokens`` long and
``idx_mapping`` at least as long as the requests; and that the buffers the mapper holds (the
tables, the output) still have the address and shape they had when it was built: a table
resized, replaced by ``set_`` or freed is refused, never read. Each is refused with a
``ValueError`` naming it. The contents are trusted the way ``validate=False`` trusts them
(docs/semantics.md §5, whose table lists every step refused). ``__call__`` runs the checks
written out inline, ``_check`` as a method (``jit_call``); the tests hold them to one set.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
from torch import Tensor

from slotmap.i18n import N_, _
from slotmap.kernels import c_launch, direct, fused_groups, slot_mapping
from slotmap.kernels.launch import POLICY, LaunchKnobs, Plan, request_grid
from slotmap.kernels.token_grid import PAD_TILE, TOKENS_PER_GRID, use_token_grid
from slotmap.layout import SlotLayout, as_int, cdiv, next_power_of_2
from slotmap.validate import check_tensor

KERNELS = ("window", "direct")


def variant_of(plan: Plan) -> tuple:
    """What Triton compiles a plan's launch for: the kernel and its compile-time constants
    (launch options such as ``num_warps`` included); runtime values left out."""
    constants = tuple(sorted(plan.constants.items()))
    return (f"{plan.kernel.fn.__module__}.{plan.kernel.fn.__name__}", constants)


def token_grid_size(num_tokens: int, max_num_tokens: int) -> tuple[int, int]:
    """(tile, programs) of a token-grid launch with the backend's tile: the arithmetic of
    ``token_grid.token_launch_shape`` a serving step pays for (a test holds them equal)."""
    if POLICY == "cpu":
        tile = 1024
    else:
        tile = min(max(next_power_of_2(-(-num_tokens // TOKENS_PER_GRID)), 32), 1024)
    tiles = -(-num_tokens // tile)
    return tile, max(tiles - (-max(max_num_tokens - tiles * tile, 0) // PAD_TILE), 1)


class _Variant:
    """One compiled variant a mapper launches: the kernel, its constants, the name of its
    runtime keyword argument (None: none), and its C launches by pointer alignment."""

    __slots__ = ("kernel", "constants", "runtime", "launches", "aligned")

    def __init__(self, plan: Plan) -> None:
        self.kernel, self.constants = plan.kernel, plan.constants
        self.runtime = next(iter(plan.runtime), None)
        self.launches: dict[tuple, Any] = {}  # alignment -> CLaunch, or False: JIT only
        self.aligned: Any = None  # launches' entry for every pointer aligned, the usual step


def _geometry(tensor: Tensor) -> tuple:
    # What resize_, set_ or freeing the storage changes on a tensor the mapper holds: its
    # address or its shape (a view's strides change within the same storage only).
    return (tensor.data_ptr(), tensor.shape)


_INT32, _INT64 = torch.int32, torch.int64
STEPS_REMEMBERED = 16384  # (num_tokens, num_reqs) -> launch, worked out once each


class _Mapper(abc.ABC):
    """What both mappers share: the variants a configuration can choose, warm-up, the step's
    checks and the launch (C launcher or JIT)."""

    max_num_tokens: int
    max_num_reqs: int
    out: Tensor
    pad_id: int
    # The kernel parameters a step supplies, in ``_launch``'s order (after the launch's
    # own runtime keyword argument, appended last).
    PER_STEP: tuple[str, ...]

    def _setup(self, device: torch.device, held: Sequence[Tensor]) -> None:
        self.device = device
        self._index = -1 if device.type == "cpu" else device.index
        self._held = tuple(held)
        self._seen = tuple(_geometry(t) for t in self._held)
        self._out_ptr, self._out_shape = self._seen[-1]  # the output is held last
        self._variants: dict[Any, _Variant] = {}
        self._steps: dict[tuple[int, int], tuple] = {}
        self.c_launch = device.type == "cuda" and c_launch.supported()
        self._knobs = triton.knobs.runtime  # its launch hooks, read every step

    @abc.abstractmethod
    def plan(self, num_tokens: int, num_reqs: int) -> Plan:
        """The launch of one step, as the launchers plan it."""

    @abc.abstractmethod
    def step(self, num_tokens: int, num_reqs: int) -> tuple[Any, tuple[int, int, int], int]:
        """The launch of one step as (variant key, 3-D grid, runtime value): ``plan``'s
        answer by the arithmetic alone."""

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

    def _check(
        self,
        query_start_loc: Tensor,
        positions: Tensor,
        num_tokens: int,
        idx_mapping: Tensor | None = None,
    ) -> int:
        """The step's host checks; returns the number of requests."""
        index = self._index
        try:
            qshape, pshape = query_start_loc.shape, positions.shape
            num_reqs = qshape[0] - 1
            ok = (
                type(num_tokens) is int
                and 0 <= num_tokens <= self.max_num_tokens
                and query_start_loc.dtype is _INT32
                and positions.dtype is _INT64
                and len(qshape) == 1
                and len(pshape) == 1
                and 0 <= num_reqs <= self.max_num_reqs
                and pshape[0] >= num_tokens
                and query_start_loc.is_contiguous()
                and positions.is_contiguous()
                and query_start_loc.get_device() == index
                and positions.get_device() == index
                # get_device() is -1 on the cpu and on the meta device alike
                and (index >= 0 or (query_start_loc.is_cpu and positions.is_cpu))
            )
            if idx_mapping is not None:
                rshape = idx_mapping.shape
                ok = ok and (
                    idx_mapping.dtype is _INT32
                    and len(rshape) == 1
                    and rshape[0] >= num_reqs
                    and idx_mapping.is_contiguous()
                    and idx_mapping.get_device() == index
                    and (index >= 0 or idx_mapping.is_cpu)
                )
            for tensor, (address, shape) in zip(self._held, self._seen, strict=True):
                ok = ok and tensor.data_ptr() == address and tensor.shape == shape
        except (AttributeError, TypeError, IndexError):
            ok = False
        if not ok:
            self._refuse(query_start_loc, positions, num_tokens, idx_mapping)
        return num_reqs

    def _refuse(
        self,
        query_start_loc: Any,
        positions: Any,
        num_tokens: Any,
        idx_mapping: Any,
    ) -> None:
        """Name what ``_check`` refused (the slow path: only when a check failed)."""
        if type(num_tokens) is not int:
            raise ValueError(
                _("num_tokens must be an int, got {type}").format(type=type(num_tokens).__name__)
            )
        if not 0 <= num_tokens <= self.max_num_tokens:
            raise ValueError(
                _("num_tokens {num_tokens} is outside [0, max_num_tokens={max}]").format(
                    num_tokens=num_tokens, max=self.max_num_tokens
                )
            )
        device = self.out.device
        inputs = [("query_start_loc", query_start_loc, torch.int32)]
        inputs.append(("positions", positions, torch.int64))
        if idx_mapping is not None:
            inputs.append(("idx_mapping", idx_mapping, torch.int32))
        for name, tensor, dtype in inputs:
            check_tensor(name, tensor, (dtype,), 1, device, N_("the mapper's buffers are"))
            if not tensor.is_contiguous():
                raise ValueError(
                    _("{name} must be contiguous (stride {stride})").format(
                        name=name, stride=tensor.stride()
                    )
                )
        num_reqs = query_start_loc.shape[0] - 1
        if not 0 <= num_reqs <= self.max_num_reqs:
            raise ValueError(
                _(
                    "query_start_loc holds {num_reqs} requests: the mapper has "
                    "{rows} block-table rows (query_start_loc needs at least 1 entry)"
                ).format(num_reqs=num_reqs, rows=self.max_num_reqs)
            )
        if positions.shape[0] < num_tokens:
            raise ValueError(
                _("positions has {entries} entries, fewer than num_tokens={num_tokens}").format(
                    entries=positions.shape[0], num_tokens=num_tokens
                )
            )
        if idx_mapping is not None and idx_mapping.shape[0] < num_reqs:
            raise ValueError(
                _("idx_mapping has {entries} entries, fewer than the {num_reqs} requests").format(
                    entries=idx_mapping.shape[0], num_reqs=num_reqs
                )
            )
        for name, tensor, seen in zip(self.held_names(), self._held, self._seen, strict=True):
            if _geometry(tensor) != seen:
                raise ValueError(
                    _(
                        "{name} was resized, replaced or freed since the mapper was built "
                        "(address, shape or layout changed): build a new mapper for it"
                    ).format(name=name)
                )
        raise ValueError(_("the mapper's inputs are not what it launches on"))  # unreachable

    @abc.abstractmethod
    def held_names(self) -> tuple[str, ...]:
        """Names of the buffers the mapper holds (``_held``), for its errors."""

    def _step(self, num_tokens: int, num_reqs: int) -> tuple:
        """(variant, grid x, y, z, runtime value) of a batch, remembered: ``step``'s
        arithmetic, and for a key seen for the first time the variant from the launchers'
        planner (with a check that the step's arithmetic agrees with it)."""
        key, grid, value = self.step(num_tokens, num_reqs)
        variant = self._variants.get(key)
        if variant is None:
            plan = self.plan(num_tokens, num_reqs)
            runtime = plan.runtime
            if (*plan.grid, 1, 1)[:3] != grid or runtime not in (
                {},
                {next(iter(runtime), ""): value},
            ):
                raise RuntimeError(f"the step's launch {grid} disagrees with the planner's {plan}")
            variant = self._variants[key] = _Variant(plan)
        if len(self._steps) >= STEPS_REMEMBERED:
            self._steps.clear()
        planned = self._steps[num_tokens, num_reqs] = (variant, *grid, value)
        return planned

    @abc.abstractmethod
    def _arguments(
        self,
        query_start_loc: Tensor,
        positions: Tensor,
        num_tokens: int,
        num_reqs: int,
        idx_mapping: Tensor | None,
    ) -> tuple[tuple, tuple[Tensor, ...], tuple[int, ...]]:
        """The kernel's positional arguments for a step, the per-step tensors (in
        ``PER_STEP``'s order) and the per-step integers before them."""

    def jit_call(
        self,
        query_start_loc: Tensor,
        positions: Tensor,
        num_tokens: int,
        idx_mapping: Tensor | None = None,
    ) -> tuple[Any, tuple[int, int, int], tuple, dict]:
        """The step as ``kernel[grid](*args, **kwargs)``: (kernel, grid, args, kwargs), the
        launch the JIT path makes (checked like a step; nothing launched)."""
        num_reqs = self._check(query_start_loc, positions, num_tokens, idx_mapping)
        variant, x, y, z, value = self._step(num_tokens, num_reqs)
        args = self._arguments(query_start_loc, positions, num_tokens, num_reqs, idx_mapping)[0]
        kwargs = {variant.runtime: value} if variant.runtime else {}
        return variant.kernel, (x, y, z), args, variant.constants | kwargs

    def _jit(
        self,
        query_start_loc: Tensor,
        positions: Tensor,
        num_tokens: int,
        num_reqs: int,
        idx_mapping: Tensor | None,
        planned: tuple,
    ) -> None:
        """A step through ``kernel[grid](...)``; on the GPU, then the compiled variant's C
        launch looked up for the next step with these pointers' alignment."""
        variant, x, y, z, value = planned
        args, pointers, step = self._arguments(
            query_start_loc, positions, num_tokens, num_reqs, idx_mapping
        )
        kwargs = {variant.runtime: value} if variant.runtime else {}
        variant.kernel[x, y, z](*args, **variant.constants, **kwargs)
        if not self.c_launch:
            return
        aligned = tuple(t.data_ptr() & 15 == 0 for t in pointers)
        if aligned in variant.launches:
            return
        names = self.PER_STEP + ((variant.runtime,) if variant.runtime else ("num_reqs",))
        resolved = c_launch.resolve(variant.kernel, args, variant.constants | kwargs, names)
        variant.launches[aligned] = resolved or False
        if all(aligned):
            variant.aligned = resolved or False


class SlotMapper(_Mapper):
    """One model runner's slot mapping for one KV-cache group, with its buffer and plans.

    ``block_table``: the runner's persistent [max_num_reqs, blocks] int32 table (request q of
    a step reads row q); ``layout``: the group's ``SlotLayout`` (an int: its block size);
    ``kernel``: "window" (production's) or "direct". ``mapper(query_start_loc, positions,
    num_tokens)`` writes and returns ``mapper.out``, [max_num_tokens] of ``out_dtype``.
    """

    PER_STEP = ("num_tokens", "query_start_loc_ptr", "positions_ptr")

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
            raise ValueError(
                _("kernel must be one of {kernels}, got {kernel}").format(
                    kernels=", ".join(KERNELS), kernel=repr(kernel)
                )
            )
        self.layout = layout if isinstance(layout, SlotLayout) else SlotLayout.of(layout)
        check_tensor(
            "block_table", block_table, (torch.int32,), 2, block_table.device, N_("it is")
        )
        if not block_table.is_contiguous():
            raise ValueError(_("block_table must be contiguous"))
        self.table = block_table
        self.kernel = kernel
        self.max_num_tokens = as_int("max_num_tokens", max_num_tokens)
        self.max_num_reqs = block_table.shape[0]
        self.pad_id = self.layout.pad_id
        self.out = torch.full(
            (max_num_tokens,), self.pad_id, dtype=out_dtype, device=block_table.device
        )
        self.knobs = LaunchKnobs()
        self._setup(block_table.device, (block_table, self.out))
        self._table_ptr, self._table_shape = _geometry(block_table)

    def held_names(self) -> tuple[str, ...]:
        return ("block_table", "out")

    def plan(self, num_tokens: int, num_reqs: int) -> Plan:
        """The launch of one step, as the launchers plan it."""
        if self.kernel == "window":
            return slot_mapping.window_plan(self.layout, self.knobs, num_tokens, num_reqs)
        return direct.direct_plan(
            self.layout, self.knobs, num_tokens, self.max_num_tokens, num_reqs, self.max_num_reqs
        )

    def step(self, num_tokens: int, num_reqs: int) -> tuple[Any, tuple[int, int, int], int]:
        if self.kernel == "direct" and use_token_grid(num_tokens, num_reqs, None, None):
            tile, programs = token_grid_size(num_tokens, self.max_num_tokens)
            return (tile, num_tokens != num_reqs), (programs, 1, 1), num_reqs
        tile, parallel = request_grid(num_tokens, num_reqs)
        return tile, (num_reqs + 1, parallel, 1), parallel

    def _arguments(
        self,
        query_start_loc: Tensor,
        positions: Tensor,
        num_tokens: int,
        num_reqs: int,
        idx_mapping: Tensor | None,
    ) -> tuple[tuple, tuple[Tensor, ...], tuple[int, ...]]:
        table = self.table
        args = (
            num_tokens,
            self.max_num_tokens,
            query_start_loc,
            positions,
            table,
            table.stride(0),
            self.layout.block_size,
            self.out,
        )
        return args, (query_start_loc, positions), (num_tokens,)

    def __call__(self, query_start_loc: Tensor, positions: Tensor, num_tokens: int) -> Tensor:
        # ``_check``'s checks written out inline (a call and its lookups cost a tenth of a
        # step's host time); tests hold the two to refusing the same steps with one message.
        index, (table, out) = self._index, self._held  # the tensors the launches bound
        try:
            (num_reqs,) = query_start_loc.shape
            (num_positions,) = positions.shape
            num_reqs -= 1
            ok = (
                type(num_tokens) is int
                and 0 <= num_tokens <= self.max_num_tokens
                and query_start_loc.dtype is _INT32
                and positions.dtype is _INT64
                and 0 <= num_reqs <= self.max_num_reqs
                and num_positions >= num_tokens
                and query_start_loc.is_contiguous()
                and positions.is_contiguous()
                and query_start_loc.get_device() == index
                and positions.get_device() == index
                and (index >= 0 or (query_start_loc.is_cpu and positions.is_cpu))
                and table.data_ptr() == self._table_ptr
                and table.shape == self._table_shape
                and out.data_ptr() == self._out_ptr
                and out.shape == self._out_shape
            )
        except (AttributeError, TypeError, ValueError):
            ok = False
        if not ok:
            self._refuse(query_start_loc, positions, num_tokens, None)
        planned = self._steps.get((num_tokens, num_reqs)) or self._step(num_tokens, num_reqs)
        if self.c_launch:
            q, p = query_start_loc.data_ptr(), positions.data_ptr()
            variant = planned[0]
            if (q | p) & 15 == 0:
                launch = variant.aligned
            else:
                launch = variant.launches.get((q & 15 == 0, p & 15 == 0))
            knobs = self._knobs  # a launch hook (a profiler) gets the JIT's launch
            if (
                launch
                and c_launch.current_device() == index
                and not knobs.launch_enter_hook.calls
                and not knobs.launch_exit_hook.calls
            ):
                _variant, x, y, z, value = planned
                launch.call(x, y, z, c_launch.current_stream(index), num_tokens, q, p, value)
                return out
        self._jit(query_start_loc, positions, num_tokens, num_reqs, None, planned)
        return out


class GroupsMapper(_Mapper):
    """A multi-group runner's slot mapping: the fused kernel, its persistent
    [groups, max_num_tokens] output and the per-group metadata as a device tensor, built once.

    ``block_tables``: one persistent int32 table a group (None for a disabled group);
    ``layouts``: one ``SlotLayout`` a group, as ``slotmap.layout.group_layouts`` builds them
    (its block sizes, circular flags, switches and CP); ``idx_mapping``: whether each step
    passes one (request q reads row ``idx_mapping[q]``, -1 a dummy request).
    ``mapper(query_start_loc, positions, num_tokens, idx_mapping=None)`` writes and returns
    ``mapper.out``. ``num_tokens`` may be a padded count (a graph's token bucket): the kernel
    maps the real ``query_start_loc[num_reqs]`` tokens and pads the rest.
    """

    PER_STEP = (
        "num_tokens",
        "num_reqs",
        "query_start_loc_ptr",
        "positions_ptr",
        "idx_mapping_ptr",
    )

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
            raise ValueError(_("at least one group must map tokens"))
        for g, table in enumerate(enabled):
            check_tensor(
                f"block_tables[{g}]",
                table,
                (torch.int32,),
                2,
                enabled[0].device,
                N_("the first is"),
            )
            if not table.is_contiguous():
                raise ValueError(_("block_tables[{g}] must be contiguous").format(g=g))
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
        self._names = tuple(
            f"block_tables[{g}]" for g, layout in enumerate(self.layouts) if layout.enabled
        ) + ("out",)
        self._setup(device, (*enabled, self.out))
        self._tables_seen = tuple((t, *_geometry(t)) for t in enabled)

    def held_names(self) -> tuple[str, ...]:
        return self._names

    def plan(self, num_tokens: int, num_reqs: int) -> Plan:
        """The launch of one step, as the launchers plan it."""
        return fused_groups.fused_plan(
            self.layouts,
            self.knobs,
            num_tokens,
            self.max_num_tokens,
            num_reqs,
            self.idx_mapping,
            self.max_num_reqs,
        )

    def step(self, num_tokens: int, num_reqs: int) -> tuple[Any, tuple[int, int, int], int]:
        groups = len(self.layouts)
        if use_token_grid(num_tokens, num_reqs, None, None):
            tile, programs = token_grid_size(num_tokens, self.max_num_tokens)
            return (tile, num_tokens != num_reqs), (groups, programs, 1), num_reqs
        tile, parallel = fused_groups.choose_tiling(num_tokens, num_reqs)
        return tile, (groups, num_reqs + 1, parallel), parallel

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
            raise ValueError(
                _("this mapper was built with idx_mapping={built}").format(built=self.idx_mapping)
            )
        # ``_check``'s checks written out inline (a call and its lookups cost a tenth of a
        # step's host time); tests hold the two to refusing the same steps with one message.
        index, out = self._index, self._held[-1]  # the output the launches bound
        try:
            (num_reqs,) = query_start_loc.shape
            (num_positions,) = positions.shape
            num_reqs -= 1
            ok = (
                type(num_tokens) is int
                and 0 <= num_tokens <= self.max_num_tokens
                and query_start_loc.dtype is _INT32
                and positions.dtype is _INT64
                and 0 <= num_reqs <= self.max_num_reqs
                and num_positions >= num_tokens
                and query_start_loc.is_contiguous()
                and positions.is_contiguous()
                and query_start_loc.get_device() == index
                and positions.get_device() == index
                and (index >= 0 or (query_start_loc.is_cpu and positions.is_cpu))
                and out.data_ptr() == self._out_ptr
                and out.shape == self._out_shape
            )
            if ok and idx_mapping is not None:
                (num_rows,) = idx_mapping.shape
                ok = (
                    idx_mapping.dtype is _INT32
                    and num_rows >= num_reqs
                    and idx_mapping.is_contiguous()
                    and idx_mapping.get_device() == index
                    and (index >= 0 or idx_mapping.is_cpu)
                )
            for table, address, shape in self._tables_seen:
                ok = ok and table.data_ptr() == address and table.shape == shape
        except (AttributeError, TypeError, ValueError):
            ok = False
        if not ok:
            self._refuse(query_start_loc, positions, num_tokens, idx_mapping)
        planned = self._steps.get((num_tokens, num_reqs)) or self._step(num_tokens, num_reqs)
        if self.c_launch:
            q, p = query_start_loc.data_ptr(), positions.data_ptr()
            i = q if idx_mapping is None else idx_mapping.data_ptr()
            variant = planned[0]
            if (q | p | i) & 15 == 0:
                launch = variant.aligned
            else:
                launch = variant.launches.get((q & 15 == 0, p & 15 == 0, i & 15 == 0))
            knobs = self._knobs  # a launch hook (a profiler) gets the JIT's launch
            if (
                launch
                and c_launch.current_device() == index
                and not knobs.launch_enter_hook.calls
                and not knobs.launch_exit_hook.calls
            ):
                _variant, x, y, z, value = planned
                stream = c_launch.current_stream(index)
                launch.call(x, y, z, stream, num_tokens, num_reqs, q, p, i, value)
                return out
        self._jit(query_start_loc, positions, num_tokens, num_reqs, idx_mapping, planned)
        return out

    def _arguments(
        self,
        query_start_loc: Tensor,
        positions: Tensor,
        num_tokens: int,
        num_reqs: int,
        idx_mapping: Tensor | None,
    ) -> tuple[tuple, tuple[Tensor, ...], tuple[int, ...]]:
        rows = query_start_loc if idx_mapping is None else idx_mapping
        args = (
            num_tokens,
            self.max_num_tokens,
            num_reqs,
            query_start_loc,
            positions,
            rows,
            self.max_num_reqs,
            self.meta,
            self.out,
            self.out.stride(0),
        )
        return args, (query_start_loc, positions, rows), (num_tokens, num_reqs)


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
        return sum(n for _start, n in self.requests)


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
    for _step in range(steps):
        while len(running) < max_num_reqs and rng.random() < 0.5:
            running.append([0, rng.randint(*prompt), rng.randint(*output)])
        budget, scheduled = max_num_tokens, []
        for state in running:
            position, prompt_len, _left = state
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
