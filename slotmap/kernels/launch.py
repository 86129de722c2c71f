"""How a launch is planned: the backend's launch choices, the checks every launch makes, and
the cache of plans that serves the hot path.

The hot path is ``validate=False`` with ``num_tokens`` and ``out`` given, as a serving loop
calls a launcher. Triton's own ``kernel[grid](...)`` costs tens of µs of Python, and the full
argument checks as much again. A plan (kernel, grid and compile-time constants) depends only on
the configuration and the batch's counts, so it is worked out and checked once and cached; each
hot call then only re-checks the tensors' structure (dtype, rank, device, contiguity, sizes)
before launching. Anything unusual falls through to the full checks and their errors.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

import torch
from torch import Tensor

from slotmap.backend import BACKEND
from slotmap.i18n import _
from slotmap.kernels import c_launch
from slotmap.layout import INT32_MAX, INT32_MIN, as_int

POLICY = BACKEND.policy  # read on every launch: a module constant, not an attribute
DEFAULT_GATHER_AS_FLOAT = POLICY == "npu"
# Programs one launch may spread over the parallel-tile axis (grid axis 1 allows 65535).
MAX_PARALLEL_PROGRAMS = 16384
DECODE_TILE = 64  # the GPU's tile for batches of one- or two-token requests


@dataclasses.dataclass(frozen=True)
class LaunchKnobs:
    """The launch choices a caller may force; None lets the backend choose.

    ``tile_size``: TILE_BLOCK_SIZE; ``parallel_tiles``: programs per request on the request
    grid; ``num_warps``: GPU only; ``gather_as_float``: the window gathered as exact float32
    halves (None: on the NPU); ``token_parallel``: the direct kernels' token grid;
    ``lane_loads``: the fused request grid loads one block-table entry a lane.
    """

    tile_size: int | None = None
    parallel_tiles: int | None = None
    num_warps: int | None = None
    gather_as_float: bool | None = None
    token_parallel: bool | None = None
    lane_loads: bool | None = None

    def __post_init__(self) -> None:
        for name in ("tile_size", "parallel_tiles", "num_warps"):
            object.__setattr__(self, name, as_int(name, getattr(self, name), optional=True))
        if self.tile_size is not None:
            check_tile(self.tile_size)
        if self.parallel_tiles is not None and self.parallel_tiles < 1:
            raise ValueError(
                _("{name} must be >= 1, got {number}").format(
                    name="parallel_tiles", number=self.parallel_tiles
                )
            )
        if self.num_warps is not None:
            warps_option(1, self.num_warps)  # refuses it on the NPU, or if not a power of two
        # Launchers key their plans by knobs on every call: hash once.
        object.__setattr__(self, "_hash", hash(dataclasses.astuple(self)))

    def __hash__(self) -> int:
        return self._hash

    @staticmethod
    def of(*args: Any) -> LaunchKnobs:
        """``LaunchKnobs(*args)``, remembered: the hot path builds it on every call."""
        try:
            return _knobs_of(*args)
        except TypeError as exc:
            if "unhashable" not in str(exc):
                raise
            return LaunchKnobs(*args)  # names the bad argument

    def request_grid(self) -> tuple[int | None, int | None, int | None]:
        """``launch_shape``'s knobs: tile, parallel tiles and warps."""
        return self.tile_size, self.parallel_tiles, self.num_warps

    @property
    def window_gather_as_float(self) -> bool:
        """The window's gather mode: as asked, else the backend's default."""
        if self.gather_as_float is None:
            return DEFAULT_GATHER_AS_FLOAT
        return bool(self.gather_as_float)


@functools.lru_cache(maxsize=256, typed=True)
def _knobs_of(*args: Any) -> LaunchKnobs:
    return LaunchKnobs(*args)


MAX_PARALLEL_PROGRAMS = 16384
DECODE_TILE = 64  # the GPU's tile for batches of one- or two-token requests


def launch_shape(
    num_tokens: int,
    num_reqs: int,
    tile_size: int | None,
    parallel_tiles: int | None,
    num_warps: int | None,
) -> tuple[int, int, dict]:
    """(tile, parallel tiles per request, launch options) of a single-group launch.

    Chosen by backend from the batch's size alone, without a device sync, so that a captured
    graph replays the same grid. None picks; a number is taken as given.

    * NPU: production's launch, TILE_BLOCK_SIZE 1024 and grid ``(num_reqs + 1,)`` (a grid
      should not exceed the AI-core count); no ``num_warps`` (Ascend has no warps).
    * GPU (measured on the H200, docs/performance.md):

      - tile: 1024, except a batch of one- or two-token requests on average (decode), which
        gets a 64-lane tile on one warp: a 1024-lane tile there costs 4 idle warps a request;
      - parallel tiles: a request of ``mean`` tokens is spread over ``cdiv(mean, tile)``
        programs, and a batch of more than one tile over at least 2, so that the few long
        prefills of a skewed batch (whose mean says nothing about them) walk half as many
        tiles (a few programs walking many tiles each leave the GPU's bandwidth idle);
      - warps: one per 128 lanes (1 to 8), four positions a thread (two 16-byte loads).

    * CPU interpreter: the NPU's tile (the lessons' TILE_BLOCK_SIZE), the GPU's parallel
      tiles, so that the CPU suite runs the GPU's grid.
    """
    if tile_size is not None:
        check_tile(tile_size)
    if parallel_tiles is not None and parallel_tiles < 1:
        raise ValueError(
            _("{name} must be >= 1, got {number}").format(
                name="parallel_tiles", number=parallel_tiles
            )
        )
    tile_size, parallel_tiles = request_grid(num_tokens, num_reqs, tile_size, parallel_tiles)
    return tile_size, parallel_tiles, warps_option(tile_size, num_warps)


def request_grid(
    num_tokens: int, num_reqs: int, tile_size: int | None = None, parallel_tiles: int | None = None
) -> tuple[int, int]:
    """``launch_shape``'s (tile, parallel tiles), for arguments already checked: the
    arithmetic a serving step pays for."""
    mean = -(-num_tokens // max(num_reqs, 1))
    if tile_size is None:
        tile_size = DECODE_TILE if POLICY == "cuda" and mean <= 2 else 1024
    if parallel_tiles is None:
        if POLICY == "npu":
            return tile_size, 1
        parallel_tiles = -(-mean // tile_size)
        if tile_size > DECODE_TILE and num_tokens > tile_size:
            parallel_tiles = max(parallel_tiles, 2)
        budget = max(MAX_PARALLEL_PROGRAMS // (num_reqs + 1), 1)
        parallel_tiles = min(max(parallel_tiles, 1), budget)
    return tile_size, parallel_tiles


def warps_option(tile_size: int, num_warps: int | None) -> dict:
    """Launch options: GPU (and interpreter, which ignores it) ``num_warps``; none on the NPU."""
    if POLICY == "npu":
        if num_warps is not None:
            raise ValueError(_("num_warps has no meaning on the NPU backend"))
        return {}
    if num_warps is not None and (num_warps < 1 or num_warps & (num_warps - 1)):
        raise ValueError(
            _("{name} must be a power of two, got {number}").format(
                name="num_warps", number=num_warps
            )
        )
    return {"num_warps": num_warps or min(max(tile_size // 128, 1), 8)}


def check_launch_device(tensor: Tensor) -> None:
    """Triton compiles for one device: refuse tensors on another before the launch."""
    if BACKEND.interpreted:
        if tensor.device.type != "cpu":
            raise ValueError(
                _(
                    "inputs are on {device}, but slotmap runs Triton's CPU interpreter: "
                    "move them to the cpu or choose another backend with SLOTMAP_BACKEND"
                ).format(device=tensor.device)
            )
    elif tensor.device.type != BACKEND.device:
        raise ValueError(
            _(
                "inputs are on {device}, but slotmap's backend is {backend}: move them to {target}"
            ).format(device=tensor.device, backend=BACKEND.name, target=BACKEND.device)
        )


def check_int32_extent(name: str, tensor: Tensor) -> None:
    """Kernels index in int32: a tensor they index must have fewer than 2**31 elements."""
    if tensor.numel() > INT32_MAX:
        raise ValueError(
            _("{name} has {count} elements: more than int32 indexing allows").format(
                name=name, count=tensor.numel()
            )
        )


def check_tile(tile_size: int) -> None:
    if tile_size < 1 or tile_size & (tile_size - 1):
        raise ValueError(
            _("{name} must be a power of two, got {number}").format(
                name="tile_size", number=tile_size
            )
        )


def check_grid(grid: tuple[int, ...]) -> tuple[int, ...]:
    """Launch-grid limits: axes 1 and 2 of a CUDA grid, and an Ascend coreDim, are <= 65535.
    Returns the grid."""
    for n in grid if POLICY == "npu" else grid[1:]:
        if n > 65535:
            raise ValueError(
                _("launch grid {grid} exceeds 65535 programs along an axis").format(grid=grid)
            )
    return grid


def check_window_trace(window_trace: Tensor, num_reqs: int) -> None:
    """The trace is written in place: one contiguous int32 row per request."""
    if window_trace.dtype != torch.int32 or window_trace.dim() != 2:
        raise ValueError(
            _("window_trace must be a 2-D int32 tensor, got {dtype} with shape {shape}").format(
                dtype=window_trace.dtype, shape=tuple(window_trace.shape)
            )
        )
    if window_trace.shape[0] != num_reqs or not window_trace.is_contiguous():
        raise ValueError(
            _(
                "window_trace must be contiguous with one row per request ({num_reqs}), "
                "got shape {shape}"
            ).format(num_reqs=num_reqs, shape=tuple(window_trace.shape))
        )
    check_launch_device(window_trace)


# ---------------------------------------------------------------------------------------------
# The plan cache.
# ---------------------------------------------------------------------------------------------
LAUNCH_DEVICE_TYPE = "cpu" if BACKEND.interpreted else BACKEND.device
_PLANS: dict[tuple, Plan] = {}
_PLANS_SIZE = 256
# What a launch reads and writes: query_start_loc, positions, the block tables, idx_mapping
# (or None) and the output (or None: the launcher allocates it).
Tensors = tuple[Tensor, Tensor, tuple[Tensor, ...], "Tensor | None", "Tensor | None"]


@dataclasses.dataclass
class Plan:
    """A launch worked out and checked once: the kernel, its grid, its compile-time constants
    and runtime keyword arguments, and the tensors of its last launch with the geometry they
    had then (``seen``)."""

    kernel: Any
    grid: tuple[int, ...]
    constants: dict  # shared between plans of one variant: never modified
    runtime: dict = dataclasses.field(default_factory=dict)  # runtime keyword arguments
    meta: Any = None  # what a launcher derives from the plan's tensors (fused: its metadata)
    seen: tuple = ()
    launches: dict = dataclasses.field(default_factory=dict)  # fast_launch's, by argument key


C_LAUNCH = c_launch.supported()


def fast_launch(plan: Plan, args: tuple) -> bool:
    """Launch ``plan.kernel[plan.grid](*args, **plan.constants, **plan.runtime)`` through
    Triton's own C launcher (``c_launch.py``) where this backend has it and the compiled
    variant for these arguments is known; False: the caller launches through the JIT itself
    (which compiles the variant a later call finds).

    The variant is looked up by a key holding everything Triton's specialisation reads from
    the arguments (each tensor's dtype and 16-byte alignment; each integer's equality to 1,
    divisibility by 16 and width) and the current device; a key seen for the first time
    is resolved by Triton's own binder and cache, so a key never names another variant."""
    if not C_LAUNCH or c_launch.hooks_set():
        return False
    device = c_launch.current_device()
    key: list = [device]
    values = []
    for arg in args:
        if type(arg) is int:
            width = 0 if INT32_MIN <= arg <= INT32_MAX else (2 if arg >= 2**63 else 1)
            key.append((arg == 1, arg % 16 == 0, width))
            values.append(arg)
        elif isinstance(arg, Tensor):
            address = arg.data_ptr()
            key.append((arg.dtype, address & 15 == 0))
            values.append(address)
        else:
            return False  # None, floats, bools: not in the launchers' positional arguments
    key = tuple(key)
    launch = plan.launches.get(key)
    if launch is None:
        kernel = plan.kernel
        names = tuple(param.name for param in getattr(kernel, "params", ())[: len(args)])
        launch = c_launch.resolve(kernel, args, plan.constants | plan.runtime, names)
        if launch is None:
            return False  # not compiled yet: the JIT launch compiles it
        plan.launches[key] = launch  # or False: this variant always takes the JIT
    if not launch:
        return False
    x, y, z = (*plan.grid, 1, 1)[:3]
    launch(x, y, z, c_launch.current_stream(device), tuple(values))
    return True


def remember_plan(key: tuple, plan: Plan, tensors: Tensors) -> Plan:
    """Store a plan whose arguments passed the full checks, under its launcher's ``key``,
    with the tensors it was checked with (the hot path's identity test)."""
    if len(_PLANS) >= _PLANS_SIZE:
        _PLANS.clear()
    plan.seen = (*tensors, _geometry(*tensors))
    _PLANS[key, tensors[0].shape[0]] = plan
    return plan


def hot_plan(
    key: tuple, num_tokens: int | None, max_num_tokens: int | None, tensors: Tensors
) -> Plan | None:
    """The plan cached under ``key`` for this batch, when there is one and the tensors pass
    the structural checks; else None and the caller goes the full way.

    The tensors are the last launch's very objects (a serving loop's persistent buffers) with
    the same geometry, or they pass the structural checks, which are attribute reads only.
    """
    query_start_loc, positions, tables, idx_mapping, out = tensors
    # The kernels take these as given: anything but an int goes the full way, which names it.
    if type(num_tokens) is not int or out is None:
        return None
    try:
        plan = _PLANS.get((key, query_start_loc.shape[0]))
        if plan is None:
            return None
        seen = plan.seen
        # Identity, not ``==``: on tensors ``==`` compares contents. The plan holds the
        # objects, so their ids cannot be reused while it does.
        if (
            seen[0] is query_start_loc
            and seen[1] is positions
            and seen[4] is out
            and seen[3] is idx_mapping
            and len(seen[2]) == len(tables)
            and all(map(operator.is_, seen[2], tables))
            and seen[5] == _geometry(*tensors)
        ):
            return plan
        if not _structure_ok(
            query_start_loc, positions, tables, idx_mapping, out, num_tokens, max_num_tokens
        ):
            return None
    except (AttributeError, TypeError):
        return None  # not tensors at all: the full checks name them
    plan.seen = (*tensors, _geometry(*tensors))
    plan.meta = None  # what the launcher derived from the last tensors, worked out again
    return plan


def _geometry(
    query_start_loc: Tensor,
    positions: Tensor,
    tables: tuple[Tensor, ...],
    idx_mapping: Tensor | None,
    out: Tensor,
) -> tuple:
    # What ``set_``, ``resize_`` or assigning ``.data`` can change on a tensor object and the
    # kernels' bounds rely on, in few reads: each tensor's first address and element count (a
    # new storage, dtype or device moves the address; a shrink or a re-typed view changes the
    # count), the tables' shapes (rows and row length bound the reads) and the output's
    # contiguity (a stride-0 output covers one element). Attribute reads, no device sync.
    geometry = (
        query_start_loc.data_ptr(),
        query_start_loc.numel(),
        positions.data_ptr(),
        positions.numel(),
        out.data_ptr(),
        out.numel(),
        out.is_contiguous(),
    )
    for table in tables:
        geometry += (table.data_ptr(), table.shape)
    if idx_mapping is not None:
        geometry += (idx_mapping.data_ptr(), idx_mapping.numel())
    return geometry


def _structure_ok(
    query_start_loc: Tensor,
    positions: Tensor,
    tables: tuple[Tensor, ...],
    idx_mapping: Tensor | None,
    out: Tensor,
    num_tokens: int,
    max_num_tokens: int | None,
) -> bool:
    # The structural checks the kernels rely on, as attribute reads (validate.py's, without
    # their messages). One table: ``out`` is [max_num_tokens]; several: [groups, max].
    if max_num_tokens is None:
        max_num_tokens = num_tokens
    index = positions.get_device()  # an int: cheaper to compare than torch.device objects
    num_reqs = query_start_loc.shape[0] - 1
    out_shape = (max_num_tokens,) if len(tables) == 1 else (len(tables), max_num_tokens)
    ok = (
        positions.dtype is torch.int64
        and query_start_loc.dtype is torch.int32
        and (out.dtype is torch.int32 or out.dtype is torch.int64)
        and positions.device.type == LAUNCH_DEVICE_TYPE
        and query_start_loc.get_device() == index
        and out.get_device() == index
        and positions.is_contiguous()
        and query_start_loc.is_contiguous()
        and out.is_contiguous()
        and len(positions.shape) == 1
        and len(query_start_loc.shape) == 1
        and out.shape == out_shape
        and 0 <= num_tokens <= max_num_tokens
        and positions.shape[0] >= num_tokens
    )
    if idx_mapping is not None:
        ok = ok and (
            (idx_mapping.dtype is torch.int32 or idx_mapping.dtype is torch.int64)
            and idx_mapping.get_device() == index
            and idx_mapping.is_contiguous()
            and len(idx_mapping.shape) == 1
            and idx_mapping.shape[0] >= num_reqs
        )
    for table in tables:
        ok = ok and (
            table.dtype is torch.int32
            and table.get_device() == index
            and table.is_contiguous()
            and len(table.shape) == 2
            and (idx_mapping is not None or table.shape[0] >= num_reqs)
            and 1 <= table.shape[1] <= INT32_MAX // max(table.shape[0], 1)
        )
    return ok
