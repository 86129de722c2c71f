"""Constants and small layout helpers shared by the reference, the kernels and the lessons.

Glossary (used everywhere, code and prose): a *position* is a token's index inside its own
request's sequence; the *logical block* is ``position // block_size`` and the *block offset*
``position % block_size``; the *block table* maps (request, logical block) to a *physical
block*; the *slot* is ``physical_block * block_size + block_offset``. A *tile* is the group
of tokens one Triton program handles at once; the *window* is the run of block-table entries
a tile loads. Under context parallelism a *rank* owns the positions of every
*interleave*-sized segment whose index is congruent to it modulo the world size.

``SlotLayout`` is the one definition of a group's configuration (block sizes, context
parallelism, circular, pad id): every launcher, reference, check and plan-cache key uses it.
The torch form of the per-position formula lives here too, below the checks that need it; the
tests hold it to the plain-Python oracle in ``slotmap.reference``.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Sequence

import torch
from torch import Tensor

from slotmap.i18n import N_, _, tr

PAD_SLOT_ID = -1  # "no slot": vLLM's PAD_SLOT_ID, passed to kernels as PAD_ID
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
PRODUCTION_TILE = 1024  # TILE_BLOCK_SIZE in vLLM and vllm-ascend


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def next_power_of_2(value: int) -> int:
    """Smallest power of two >= value (1 for value <= 1)."""
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def window_size(tile_size: int, block_size: int) -> int:
    """BLOCK_TABLE_WINDOW_SIZE: block-table entries a tile of contiguous positions can touch.

    A tile of ``tile_size`` contiguous positions spans at most ``cdiv(tile_size, block_size)``
    blocks when it starts on a block boundary, and one more when it starts in the middle of a
    block: hence the ``+ 1``. Rounded up to a power of two because Triton tensor shapes must
    be powers of two.
    """
    return next_power_of_2(cdiv(tile_size, block_size) + 1)


def expand_block_table(
    block_table: torch.Tensor, blocks_per_kv_block: int, *, validate: bool = True
) -> torch.Tensor:
    """Hybrid blocks: turn a table of physical KV blocks into a table of attention blocks.

    One physical block of ``kv_cache_block_size = blocks_per_kv_block * block_size`` tokens
    holds ``blocks_per_kv_block`` attention ("kernel") blocks of ``block_size`` tokens; physical
    block ``k`` holds attention blocks ``k * blocks_per_kv_block + j``. The slot-mapping
    kernels index the expanded table with attention-block indices.

    block_table: [rows, n] int32  ->  [rows, n * blocks_per_kv_block] int32. ``validate=False``
    skips the overflow check, which reads the table's largest entry (a device sync).
    """
    if blocks_per_kv_block < 1:
        raise ValueError(
            _("{name} must be >= 1, got {number}").format(
                name="blocks_per_kv_block", number=blocks_per_kv_block
            )
        )
    if not isinstance(block_table, torch.Tensor):
        raise ValueError(
            _("{name} must be a torch.Tensor, got {type}").format(
                name="block_table", type=type(block_table).__name__
            )
        )
    if block_table.is_meta:
        # A meta tensor has a shape but no entries: nothing to expand or to check.
        raise ValueError(_("block_table is a meta tensor: it holds no block numbers to expand"))
    if block_table.dtype not in (torch.int32, torch.int64) or block_table.dim() != 2:
        raise ValueError(
            _(
                "block_table must be a 2-D int32 or int64 tensor, got {dtype} of shape {shape}"
            ).format(dtype=block_table.dtype, shape=tuple(block_table.shape))
        )
    if validate and block_table.numel():
        # k * B + B - 1 must fit the table's dtype: a wrapped-around number would be a small,
        # valid-looking block of some other request, which no later check can catch.
        largest = int(block_table.max())
        limit = torch.iinfo(block_table.dtype).max
        if largest * blocks_per_kv_block + blocks_per_kv_block - 1 > limit:
            raise ValueError(
                _(
                    "block_table holds physical block {largest}: its attention blocks "
                    "{largest} * {blocks} + j pass {dtype}'s largest value {limit}"
                ).format(
                    largest=largest,
                    blocks=blocks_per_kv_block,
                    dtype=str(block_table.dtype)[6:],
                    limit=limit,
                )
            )
    j = torch.arange(blocks_per_kv_block, dtype=block_table.dtype, device=block_table.device)
    expanded = block_table.unsqueeze(-1) * blocks_per_kv_block + j
    rows, entries = block_table.shape
    return expanded.reshape(rows, entries * blocks_per_kv_block).contiguous()


def as_int(name: str, value: object, *, optional: bool = False) -> int | None:
    """An integer argument as a Python int that fits int32 (the kernels compute in int32).

    Anything ``operator.index`` takes is an int (numpy integers too); a bool, a float or a
    tensor is not (a tensor would hide a device sync: pass ``int(t)``), and raises a
    TypeError naming the argument; an int outside int32 a ValueError. ``optional``: None
    passes through (the launcher chooses).
    """
    if value is None and optional:
        return None
    number = None
    if not isinstance(value, (bool, Tensor)):
        try:
            number = operator.index(value)
        except TypeError:
            pass
    if number is None:
        raise TypeError(
            _("{name} must be an int, got {type} {value}").format(
                name=name, type=type(value).__name__, value=repr(value)
            )
        )
    if not INT32_MIN <= number <= INT32_MAX:
        raise ValueError(
            _("{name} {number} does not fit in int32").format(name=name, number=number)
        )
    return number


def check_at_least_one(name: str, value: object) -> int:
    """A count or size argument: an int32 (``as_int``) of at least 1."""
    number = as_int(name, value)
    if number < 1:
        raise ValueError(_("{name} must be >= 1, got {number}").format(name=name, number=number))
    return number


def check_pad_id(pad_id: object) -> int:
    """pad_id, an int32 that no slot can equal: slots are >= 0, so it must be negative."""
    pad_id = as_int("pad_id", pad_id)
    if pad_id >= 0:
        raise ValueError(
            _("pad_id must be negative, got {pad_id}: a slot >= 0 could equal it").format(
                pad_id=pad_id
            )
        )
    return pad_id


@dataclasses.dataclass(frozen=True)
class SlotLayout:
    """How one KV-cache group lays positions out in slots, checked once on construction.

    ``block_size``: tokens per attention block (the block table's unit);
    ``kv_cache_block_size``: tokens per physical block (None: ``block_size``; a multiple of it
    for hybrid blocks); ``cp_*``: context parallelism (world size, this rank, tokens per
    segment); ``circular``: a ring buffer of one block per row; ``pad_id``: the slot of a
    token that has none here; ``enabled``: False for a group that maps no token (a Mamba
    state group): every token gets ``pad_id`` and its block table is never read
    (docs/semantics.md §4).
    """

    block_size: int
    kv_cache_block_size: int | None = None
    cp_world_size: int = 1
    cp_rank: int = 0
    cp_interleave: int = 1
    circular: bool = False
    pad_id: int = PAD_SLOT_ID
    enabled: bool = True

    def __post_init__(self) -> None:
        block_size = check_at_least_one("block_size", self.block_size)
        kv = self.kv_cache_block_size
        kv = block_size if kv is None else as_int("kv_cache_block_size", kv)
        cp_rank = as_int("cp_rank", self.cp_rank)
        if kv < 1 or kv % block_size != 0:
            raise ValueError(
                _(
                    "kv_cache_block_size {kv} must be a positive multiple of block_size "
                    "{block_size} (one physical block holds whole attention blocks)"
                ).format(kv=kv, block_size=block_size)
            )
        world = check_at_least_one("cp_world_size", self.cp_world_size)
        if not 0 <= cp_rank < world:
            raise ValueError(
                _("cp_rank {rank} is not a rank of a world of {world}").format(
                    rank=cp_rank, world=world
                )
            )
        interleave = check_at_least_one("cp_interleave", self.cp_interleave)
        if world > 1 and kv % interleave != 0:
            raise ValueError(
                _(
                    "kv_cache_block_size {kv} is not a multiple of cp_interleave {interleave}: "
                    "two positions of one rank would share a slot"
                ).format(kv=kv, interleave=interleave)
            )
        if self.circular and world > 1:
            raise ValueError(
                _("a circular cache cannot be split across {world} context-parallel ranks").format(
                    world=world
                )
            )
        fields = dict(
            block_size=block_size,
            kv_cache_block_size=kv,
            cp_world_size=world,
            cp_rank=cp_rank,
            cp_interleave=interleave,
            circular=bool(self.circular),
            pad_id=check_pad_id(self.pad_id),
            enabled=bool(self.enabled),
        )
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        # Launchers key their plans by layouts on every call: hash once.
        object.__setattr__(self, "_hash", hash(tuple(fields.values())))

    def __hash__(self) -> int:
        cached = self.__dict__.get("_hash")  # an ``unchecked`` layout has none
        return hash(tuple(self.__dict__.values())) if cached is None else cached

    @staticmethod
    def of(
        block_size: int,
        kv_cache_block_size: int | None = None,
        cp_world_size: int = 1,
        cp_rank: int = 0,
        cp_interleave: int = 1,
        circular: bool = False,
        pad_id: int = PAD_SLOT_ID,
        enabled: bool = True,
    ) -> SlotLayout:
        """``SlotLayout(...)``, remembered: a launcher's hot path builds it on every call."""
        args = (block_size, kv_cache_block_size, cp_world_size, cp_rank, cp_interleave)
        try:
            return _layout_of(*args, circular, pad_id, enabled)
        except TypeError as exc:
            if "unhashable" not in str(exc):
                raise
            return SlotLayout(*args, circular, pad_id, enabled)  # names the bad argument

    @staticmethod
    def unchecked(block_size: int, kv_cache_block_size: int, *more: object) -> SlotLayout:
        """A layout built without its checks, to run what they prevent (lesson 05's demo of
        a rejected context-parallel configuration). Never for real work."""
        layout = object.__new__(SlotLayout)
        given = (block_size, kv_cache_block_size, *more)
        for i, field in enumerate(dataclasses.fields(SlotLayout)):  # the rest: the defaults
            object.__setattr__(layout, field.name, given[i] if i < len(given) else field.default)
        return layout

    def fields(self) -> dict:
        """The layout as keyword arguments of the public functions (``token_slot``...); a
        group's ``enabled`` flag is not one of them (only the multi-group functions take it)."""
        return {field: getattr(self, field) for field in _FIELDS}

    @property
    def blocks_per_kv_block(self) -> int:
        return self.kv_cache_block_size // self.block_size

    def constants(self) -> dict:
        """The compile-time constants every single-group kernel takes from the layout."""
        return dict(
            KV_CACHE_BLOCK_SIZE=self.kv_cache_block_size,
            BLOCKS_PER_KV_BLOCK=self.blocks_per_kv_block,
            TOTAL_CP_WORLD_SIZE=self.cp_world_size,
            TOTAL_CP_RANK=self.cp_rank,
            CP_KV_CACHE_INTERLEAVE_SIZE=self.cp_interleave,
            PAD_ID=self.pad_id,
            IS_CIRCULAR=self.circular,
        )

    def locate(self, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(logical block, offset, has_slot) of every position, int64/bool, on whole tensors.

        Positions that have no slot (negative in circular mode, another rank's under CP) get
        block 0 and offset 0, so the result can always index a block table.
        """
        pos = positions.to(torch.int64)
        if not self.enabled:
            zeros = torch.zeros_like(pos)
            return zeros, zeros, torch.zeros_like(pos, dtype=torch.bool)
        if self.circular:
            has_slot = pos >= 0
            # Guard before the arithmetic: torch's % floors, C's truncates; neither may see p < 0.
            safe = torch.where(has_slot, pos, 0)
            return torch.zeros_like(pos), safe % self.block_size, has_slot
        if self.cp_world_size == 1:
            block = pos // self.block_size
            return block, pos % self.block_size, torch.ones_like(pos, dtype=torch.bool)
        world, interleave = self.cp_world_size, self.cp_interleave
        virtual_block_size = self.kv_cache_block_size * world
        virtual_block, virtual_offset = pos // virtual_block_size, pos % virtual_block_size
        has_slot = (virtual_offset // interleave) % world == self.cp_rank
        local = virtual_offset // (world * interleave) * interleave + virtual_offset % interleave
        block = virtual_block * self.blocks_per_kv_block + local // self.block_size
        offset = local % self.block_size
        return torch.where(has_slot, block, 0), torch.where(has_slot, offset, 0), has_slot


# The single-group keyword arguments; ``enabled`` keeps its default in ``unchecked``.
_FIELDS = tuple(field.name for field in dataclasses.fields(SlotLayout) if field.name != "enabled")


@functools.lru_cache(maxsize=1024, typed=True)
def _layout_of(*args: object) -> SlotLayout:
    return SlotLayout(*args)


def group_layouts(
    num_groups: int,
    block_sizes: Sequence[int],
    circular: Sequence[bool] | None,
    *,
    cp_world_size: int,
    cp_rank: int,
    cp_interleave: int,
    pad_id: int,
    kernel_block_sizes: Sequence[int] | None = None,
    slot_mapping_enabled: Sequence[bool] | None = None,
    dcp_sharded: Sequence[bool] | None = None,
) -> tuple[SlotLayout, ...]:
    """One ``SlotLayout`` a KV-cache group (docs/semantics.md §4). Errors name the group.

    Group g allocates blocks of ``block_sizes[g]`` tokens (its ``kv_cache_block_size``) and
    its block table counts blocks of ``kernel_block_sizes[g]`` tokens (its ``block_size``;
    None: the allocation block). ``slot_mapping_enabled[g]`` False: the group maps no token
    (the layout's ``enabled``). ``dcp_sharded[g]`` False: the group's cache is not split
    across the context-parallel ranks, so its layout has ``cp_world_size`` 1 (as has every
    disabled group's). None: every group enabled, every group sharded (the batch's CP).
    """
    circular = [False] * num_groups if circular is None else list(circular)
    kernel = list(block_sizes) if kernel_block_sizes is None else list(kernel_block_sizes)
    enabled = [True] * num_groups if slot_mapping_enabled is None else list(slot_mapping_enabled)
    sharded = [True] * num_groups if dcp_sharded is None else list(dcp_sharded)
    pad_id = check_pad_id(pad_id)
    if num_groups < 1:
        raise ValueError(_("at least one KV-cache group is needed"))
    lists = {
        N_("block sizes"): block_sizes,
        N_("circular flags"): circular,
        N_("kernel_block_sizes"): kernel,
        N_("slot_mapping_enabled flags"): enabled,
        N_("dcp_sharded flags"): sharded,
    }
    for name, values in lists.items():
        if len(values) != num_groups:
            raise ValueError(
                _("{num_groups} block tables but {count} {name}").format(
                    num_groups=num_groups, count=len(values), name=tr(name)
                )
            )
    # The batch's CP, checked even where no group is sharded.
    check_at_least_one("cp_interleave", cp_interleave)
    SlotLayout.of(1, None, cp_world_size, cp_rank)
    layouts = []
    for g in range(num_groups):
        size = as_int(f"block_sizes[{g}]", block_sizes[g])
        kernel_size = as_int(f"kernel_block_sizes[{g}]", kernel[g])
        on, ring = bool(enabled[g]), bool(circular[g])
        split = on and bool(sharded[g])
        cp = (cp_world_size, cp_rank, cp_interleave) if split else (1, 0, 1)
        sizes_fit = False
        try:
            if kernel_size >= 1 and size >= 1 and size % kernel_size:
                raise ValueError(
                    _(
                        "kernel block size {kernel_size} does not divide block size {size} (an "
                        "allocation block holds whole kernel blocks)"
                    ).format(kernel_size=kernel_size, size=size)
                )
            if ring and kernel_size != size:
                raise ValueError(
                    _(
                        "a circular cache is one block a row: its kernel block size "
                        "{kernel_size} must be its block size {size}"
                    ).format(kernel_size=kernel_size, size=size)
                )
            sizes_fit = True
            layouts.append(SlotLayout.of(kernel_size, size, *cp, ring, pad_id, on))
        except ValueError as exc:
            hint = ""
            if split and sizes_fit and _stands_unsplit(kernel_size, size, ring, pad_id, on):
                hint = _(" (dcp_sharded=False keeps a group off the CP split)")
            raise ValueError(_("group {g}: {error}").format(g=g, error=exc) + hint) from None
    return tuple(layouts)


def _stands_unsplit(kernel_size: int, size: int, ring: bool, pad_id: int, on: bool) -> bool:
    """Whether a group's layout that the CP split refused stands without it: then the split
    is to blame, and ``dcp_sharded=False`` is the way out."""
    try:
        SlotLayout.of(kernel_size, size, 1, 0, 1, ring, pad_id, on)
    except ValueError:
        return False
    return True


def group_layouts_of(num_groups: int, *lists: Sequence | None, **batch: int) -> tuple:
    """``group_layouts``, remembered: the fused launcher's hot path builds the groups on every
    call. ``lists`` are its per-group sequences in order (block sizes, circular, kernel block
    sizes, enabled, sharded); ``batch`` its context parallelism and pad id."""
    # Keyed with each value's type: 4.0 and True hash as 4 and 1, and must still be refused.
    key = tuple(None if x is None else tuple((type(v), v) for v in x) for x in lists)
    batch_key = tuple((name, type(v), v) for name, v in batch.items())
    try:
        return _group_layouts(num_groups, key, batch_key)
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return _group_layouts.__wrapped__(num_groups, key, batch_key)


@functools.lru_cache(maxsize=256, typed=True)
def _group_layouts(num_groups: int, lists: tuple, batch: tuple) -> tuple[SlotLayout, ...]:
    sizes, circular, kernel, enabled, sharded = (
        None if x is None else [v for _, v in x] for x in lists
    )
    return group_layouts(
        num_groups,
        sizes,
        circular,
        kernel_block_sizes=kernel,
        slot_mapping_enabled=enabled,
        dcp_sharded=sharded,
        **{name: v for name, _, v in batch},
    )


def request_of_tokens(query_start_loc: Tensor, num_tokens: int) -> Tensor:
    """[num_tokens] int64: the request each batch token belongs to."""
    lengths = (query_start_loc[1:] - query_start_loc[:-1]).to(torch.int64)
    requests = torch.arange(lengths.numel(), device=query_start_loc.device)
    return torch.repeat_interleave(requests, lengths, output_size=num_tokens)
