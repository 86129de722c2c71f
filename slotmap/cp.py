"""Context parallelism (lesson 05): who owns a position, where it goes on its owner, and a real
multi-process run in which the ranks prove the partition invariant together.

Under context parallelism (docs/semantics.md §2) ``W`` ranks share one request's KV cache. A
*virtual block* of ``V = kv_cache_block_size * W`` positions is made of one physical block on
each rank; it is cut into segments of ``interleave`` positions dealt out round robin, so
segment ``s`` lives on rank ``s % W``. Each rank packs its segments one after another: the
positions a rank owns form, in order, its own *local* sequence ``0, 1, 2, ...``, which its
block table maps as if context parallelism did not exist.

Pure helpers (they answer with ``slotmap.reference.token_block_and_offset``, the definition):

* ``owner_of(position, W, I, kv)``: the rank that stores a position;
* ``local_position(position, W, I, kv)``: where it goes in its owner's packed local sequence
  (step 3's *local offset* ``lo`` is ``local_position % kv`` for a valid configuration);
* ``local_length(seq_len, W, rank, I, kv)``: how many of positions ``0..seq_len-1`` rank
  ``rank`` holds. Its local positions are exactly ``0..local_length - 1``.
* ``five_steps(position, block_size, kv, W, I)``: every intermediate value of the five
  context-parallel steps (docs/semantics.md §2), for the lesson's tables and the checks' messages.

The rank side (for ``slotmap.distributed.run_ranks``):

* ``CPBatch``: a small, picklable description of a batch from which every rank builds the
  same positions and its own block table (each rank has its own KV cache);
* ``cp_slot_mapping_rank(ctx, batch)``: computes this rank's slot mapping with the production
  kernel on its own device, then proves the partition invariant with the other ranks through
  collectives, and returns a ``RankEvidence``;
* ``launch_unchecked``: the production kernel past the launcher's checks, to watch the
  configuration the launchers reject (``kv_cache_block_size % interleave != 0``) collide.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from slotmap.i18n import _
from slotmap.layout import (
    PAD_SLOT_ID,
    PRODUCTION_TILE,
    SlotLayout,
    as_int,
    cdiv,
    check_at_least_one,
    expand_block_table,
)
from slotmap.reference import CPSteps, cp_steps, token_block_and_offset, token_slot

if TYPE_CHECKING:
    from slotmap.distributed import RankContext


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------
def _check_world(world_size: int, interleave: int, kv_cache_block_size: int) -> None:
    if world_size < 1 or interleave < 1 or kv_cache_block_size < 1:
        raise ValueError(
            _(
                "world_size, interleave and kv_cache_block_size must be >= 1, got "
                "{world_size}, {interleave}, {kv_cache_block_size}"
            ).format(
                world_size=world_size,
                interleave=interleave,
                kv_cache_block_size=kv_cache_block_size,
            )
        )


def _located(
    position: int, world_size: int, rank: int, interleave: int, kv_cache_block_size: int
) -> tuple[int, int] | None:
    """The reference's (block, offset) of ``position`` on ``rank`` with blocks as large as the
    physical block (so ``block * kv + offset`` is the local position), or None."""
    return token_block_and_offset(
        position,
        kv_cache_block_size,
        kv_cache_block_size=kv_cache_block_size,
        cp_world_size=world_size,
        cp_rank=rank,
        cp_interleave=interleave,
    )


def owner_of(position: int, world_size: int, interleave: int, kv_cache_block_size: int) -> int:
    """The rank that stores ``position`` (>= 0): ``((position % V) // I) % W``, V = kv * W.

    When ``kv_cache_block_size % interleave == 0`` (what the launchers accept) this is simply
    ``(position // I) % W``: a virtual block holds a whole number of rounds of segments.
    """
    _check_world(world_size, interleave, kv_cache_block_size)
    if position < 0:
        raise ValueError(_("position must be >= 0, got {position}").format(position=position))
    for rank in range(world_size):
        if _located(position, world_size, rank, interleave, kv_cache_block_size) is not None:
            return rank
    # Unreachable: every position has exactly one owner (docs/semantics.md §2).
    raise AssertionError(f"the reference gives position {position} no owner")


def local_position(
    position: int, world_size: int, interleave: int, kv_cache_block_size: int
) -> int:
    """Where ``position`` goes in its owner's packed local sequence.

    ``(position // V) * kv + lo``, with the local offset of step 3 (docs/semantics.md §2)
    ``lo = (vo // (W * I)) * I + vo % I`` and ``vo = position % V``. On its owner, position
    ``p`` is at logical block ``local_position // block_size``, block offset
    ``local_position % block_size`` (also with hybrid blocks).
    """
    rank = owner_of(position, world_size, interleave, kv_cache_block_size)
    block, offset = _located(position, world_size, rank, interleave, kv_cache_block_size)
    return block * kv_cache_block_size + offset


def local_length(
    seq_len: int, world_size: int, rank: int, interleave: int, kv_cache_block_size: int
) -> int:
    """How many of positions ``0..seq_len-1`` rank ``rank`` stores.

    They sit at local positions ``0..local_length - 1`` on that rank, in order (packed; the
    lesson's property test checks it against the reference). A virtual block of
    ``V = kv * W`` positions is whole rounds of ``W * I`` positions, and rank ``r`` owns
    positions ``[r * I, (r + 1) * I)`` of each round, so::

        count(m) = (m // (W * I)) * I + clamp(m % (W * I) - r * I, 0, I)   # m <= V
        local_length = (seq_len // V) * count(V) + count(seq_len % V)
    """
    _check_world(world_size, interleave, kv_cache_block_size)
    if not 0 <= rank < world_size:
        raise ValueError(
            _("rank {rank} is not a rank of a world of {world}").format(
                rank=rank, world=world_size
            )
        )
    if seq_len < 0:
        raise ValueError(_("seq_len must be >= 0, got {seq_len}").format(seq_len=seq_len))
    virtual_block_size = kv_cache_block_size * world_size
    round_size = world_size * interleave

    def count(m: int) -> int:
        return (m // round_size) * interleave + min(
            max(m % round_size - rank * interleave, 0), interleave
        )

    whole, rest = divmod(seq_len, virtual_block_size)
    return whole * count(virtual_block_size) + count(rest)


Steps = CPSteps  # every intermediate value of the steps of docs/semantics.md §2, named


def five_steps(
    position: int, block_size: int, kv_cache_block_size: int, world_size: int, interleave: int
) -> Steps:
    """The five steps written out, for the lesson's tables and the checks' messages: the
    reference's own ``cp_steps`` (step 5, the slot, needs the owner's block table). Sizes
    below 1 raise the launchers' ValueErrors, by this function's argument names."""
    position = as_int("position", position)
    if position < 0:
        raise ValueError(_("position must be >= 0, got {position}").format(position=position))
    for name, value in (
        ("block_size", block_size),
        ("kv_cache_block_size", kv_cache_block_size),
        ("world_size", world_size),
        ("interleave", interleave),
    ):
        check_at_least_one(name, value)
    return cp_steps(position, block_size, kv_cache_block_size, world_size, interleave)


# ---------------------------------------------------------------------------------------------
# A batch every rank can rebuild, and each rank's block table
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CPBatch:
    """A batch described by a few integers, so that every rank rebuilds the same one.

    Request ``q`` holds positions ``starts[q] .. starts[q] + lengths[q] - 1`` (a prefill
    chunk, or one decode token). Each rank draws its own block table from ``seed`` and its
    rank: a rank's KV cache, and so its physical blocks, are its own.
    """

    lengths: tuple[int, ...]
    block_size: int
    kv_cache_block_size: int
    world_size: int
    interleave: int
    starts: tuple[int, ...] = ()  # () : every request starts at position 0
    max_num_tokens: int | None = None  # None: no padding tail
    seed: int = 0
    # True: launch the production kernel itself, past every check of the launcher (even the
    # configuration check that ``validate=False`` keeps): to watch a rejected configuration.
    skip_launcher_checks: bool = False

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def first_positions(self) -> tuple[int, ...]:
        return self.starts or (0,) * len(self.lengths)

    @property
    def query_start_loc(self) -> list[int]:
        starts = [0]
        for length in self.lengths:
            starts.append(starts[-1] + length)
        return starts

    @property
    def positions(self) -> list[int]:
        return [
            p
            for first, n in zip(self.first_positions, self.lengths, strict=True)
            for p in range(first, first + n)
        ]

    def local_blocks(self, rank: int) -> list[int]:
        """Physical (kv-cache) blocks rank ``rank`` needs for each request: enough for the
        largest local position it stores."""
        needed = []
        for first, n in zip(self.first_positions, self.lengths, strict=True):
            config = (self.world_size, self.interleave, self.kv_cache_block_size)
            mine = [
                local_position(p, *config)
                for p in range(first, first + n)
                if owner_of(p, *config) == rank
            ]
            needed.append(cdiv(max(mine) + 1, self.kv_cache_block_size) if mine else 0)
        return needed

    def block_table(self, rank: int) -> list[list[int]]:
        """Rank ``rank``'s block table in attention blocks: distinct physical blocks drawn from
        ``seed`` and the rank (each rank's cache is its own)."""
        needed = self.local_blocks(rank)
        width = max(max(needed, default=1), 1)
        pool = list(range(max(sum(needed) + 4, 8)))
        random.Random(self.seed * 1009 + rank).shuffle(pool)
        rows, used = [], 0
        for n in needed:
            rows.append(pool[used : used + n] + [0] * (width - n))
            used += n
        table = torch.tensor(rows, dtype=torch.int32)
        per = self.kv_cache_block_size // self.block_size
        return expand_block_table(table, per).tolist() if per > 1 else table.tolist()

    def tensors(self, rank: int, device: torch.device | str) -> tuple[Tensor, Tensor, Tensor]:
        """(query_start_loc int32, positions int64, rank's block table int32) on ``device``."""
        qsl = torch.tensor(self.query_start_loc, dtype=torch.int32, device=device)
        positions = torch.tensor(self.positions, dtype=torch.int64, device=device)
        table = torch.tensor(self.block_table(rank), dtype=torch.int32, device=device)
        return qsl, positions, table

    def options(self, rank: int) -> dict:
        """compute_slot_mapping's keyword arguments on rank ``rank``."""
        return {
            "kv_cache_block_size": self.kv_cache_block_size,
            "cp_world_size": self.world_size,
            "cp_rank": rank,
            "cp_interleave": self.interleave,
            "max_num_tokens": self.max_num_tokens,
        }


def expected_slots(batch: CPBatch, rank: int, pad_id: int = PAD_SLOT_ID) -> list[int]:
    """Rank ``rank``'s slot mapping from the oracle's ``token_slot``, token by token (no
    checks: also for a configuration the launchers reject)."""
    table = batch.block_table(rank)
    starts = batch.query_start_loc
    slots = [pad_id] * (batch.max_num_tokens or batch.num_tokens)
    positions = batch.positions
    for q in range(len(batch.lengths)):
        for token in range(starts[q], starts[q + 1]):
            slots[token] = token_slot(
                positions[token],
                table[q],
                batch.block_size,
                kv_cache_block_size=batch.kv_cache_block_size,
                cp_world_size=batch.world_size,
                cp_rank=rank,
                cp_interleave=batch.interleave,
                pad_id=pad_id,
            )
    return slots


def local_layout(
    slots: list[int], batch: CPBatch, block_table: list[list[int]], pad_id: int = PAD_SLOT_ID
) -> list[int]:
    """Read a rank's slot mapping back: the local position each token landed at (``-1`` for
    tokens the rank does not store), through the inverse of the rank's block table."""
    starts = batch.query_start_loc
    local = [-1] * batch.num_tokens
    for q in range(len(batch.lengths)):
        logical: dict[int, int] = {}
        for b, physical in enumerate(block_table[q]):
            logical.setdefault(physical, b)  # real entries come before the row's padding
        for token in range(starts[q], starts[q + 1]):
            slot = slots[token]
            if slot != pad_id:
                block, offset = divmod(slot, batch.block_size)
                local[token] = logical[block] * batch.block_size + offset
    return local


def launch_unchecked(
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    block_size: int,
    *,
    kv_cache_block_size: int,
    cp_world_size: int,
    cp_rank: int,
    cp_interleave: int,
    max_num_tokens: int | None = None,
    tile_size: int = PRODUCTION_TILE,
) -> Tensor:
    """The production window kernel launched directly, without any of the launcher's checks.

    ``compute_slot_mapping`` rejects ``kv_cache_block_size % cp_interleave != 0`` even with
    ``validate=False`` (that flag skips only the checks that read tensor contents). This runs
    the kernel anyway, to show what the rejection prevents. Grid ``(num_reqs + 1,)`` as
    production launches it. Returns [max_num_tokens] int32.
    """
    from slotmap.kernels.slot_mapping import (
        _compute_slot_mapping_kernel,
        slot_mapping_args,
        window_kernel_constants,
    )

    num_reqs = query_start_loc.numel() - 1
    num_tokens = int(query_start_loc[-1])
    out = torch.empty(max_num_tokens or num_tokens, dtype=torch.int32, device=positions.device)
    # Unchecked on purpose: the launchers reject this configuration.
    layout = SlotLayout.unchecked(
        block_size, kv_cache_block_size, cp_world_size, cp_rank, cp_interleave
    )
    constants = window_kernel_constants(layout, tile_size)
    args = slot_mapping_args(
        num_tokens, out.numel(), query_start_loc, positions, block_table, block_size, out
    )
    _compute_slot_mapping_kernel[(num_reqs + 1, 1)](*args, **constants)
    return out


# ---------------------------------------------------------------------------------------------
# One rank of a real multi-process run
# ---------------------------------------------------------------------------------------------
def max_ranks() -> int:
    """How many ranks ``run_ranks`` can start here: one per GPU/NPU, or (on the CPU, over
    gloo) as many processes as you like; we say 8."""
    from slotmap.backend import BACKEND

    if BACKEND.name == "cuda":
        return torch.cuda.device_count()
    if BACKEND.name == "npu":
        return torch.npu.device_count()  # type: ignore[attr-defined]
    return 8


@dataclass
class RankEvidence:
    """What one rank computed and what the group proved (plain lists: easy to show and draw)."""

    rank: int
    world_size: int
    pid: int
    device: str
    communication: str  # "gloo", "nccl" or "hccl"
    positions: list[int]
    block_table: list[list[int]]  # this rank's own table
    slots: list[int]  # this rank's slot mapping, from the production kernel
    agrees_with_reference: bool  # slots == slot_mapping_oracle on this rank
    local_positions: list[int]  # where each token landed locally (-1: not stored here)
    collisions: list[tuple[int, int, int]]  # (token, token, slot) sharing a slot on this rank
    packed: bool  # each request's local positions here are one contiguous run, as predicted
    owners: list[list[int]]  # all-gathered: owners[r][t] == 1 when rank r stores token t
    owner_count: list[int]  # all-reduced: how many ranks store each token (must be 1)
    padding_ok: bool  # the tail [num_tokens, max_num_tokens) is PAD on this rank
    proved: bool  # all-reduced: every rank's checks passed and every count is 1
    seconds: float  # kernel + checks + collectives on this rank
    notes: list[str] = field(default_factory=list)  # broken invariants, in words


def _collisions(slots: list[int], num_tokens: int, pad_id: int) -> list[tuple[int, int, int]]:
    seen: dict[int, int] = {}
    found = []
    for token in range(num_tokens):
        slot = slots[token]
        if slot == pad_id:
            continue
        if slot in seen:
            found.append((seen[slot], token, slot))
        else:
            seen[slot] = token
    return found


def cp_slot_mapping_rank(ctx: RankContext, batch: CPBatch) -> RankEvidence:
    """One rank: its slot mapping with the production kernel, then the partition invariant,
    proved with the other ranks.

    ``ctx`` is ``slotmap.distributed.RankContext``. Every rank rebuilds ``batch`` (same
    positions, its own block table), runs ``slotmap.compute_slot_mapping(...,
    cp_world_size=W, cp_rank=ctx.rank, cp_interleave=I)`` on ``ctx.device``, and then:

    * ``all_reduce`` (sum) of "I store token t" over the ranks: every real token must be
      stored by exactly one rank;
    * ``all_gather`` of the same flags, so every rank (and the notebook) sees who stores what;
    * locally: no two tokens share a slot, and each request's tokens landed at the local
      positions ``local_length(start)`` .. ``local_length(end) - 1``, in order (read back
      through the inverse of the rank's block table);
    * ``all_reduce`` (max) of "something broke here": ``proved`` is the whole group's verdict.
    """
    import torch.distributed as dist

    from slotmap.kernels.slot_mapping import compute_slot_mapping

    start = time.perf_counter()
    rank, world = ctx.rank, ctx.world_size
    if world != batch.world_size:
        raise ValueError(
            _("the batch is for {batch} ranks, the group has {world}").format(
                batch=batch.world_size, world=world
            )
        )
    qsl, positions, table = batch.tensors(rank, ctx.device)
    if batch.skip_launcher_checks:
        slots = launch_unchecked(qsl, positions, table, batch.block_size, **batch.options(rank))
    else:
        slots = compute_slot_mapping(
            qsl, positions, table, batch.block_size, **batch.options(rank)
        )
    expected = expected_slots(batch, rank)
    n = batch.num_tokens
    stored = (slots[:n] != PAD_SLOT_ID).to(torch.int32)

    # Collectives: every rank takes part, on its own device.
    count = stored.clone()
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    gathered = [torch.empty_like(stored) for _rank in range(world)]
    dist.all_gather(gathered, stored)

    values = slots.cpu().tolist()
    rows = table.cpu().tolist()
    local = local_layout(values, batch, rows)
    collisions = _collisions(values, n, PAD_SLOT_ID)
    notes = [
        _("tokens {a} and {b} collide in slot {s} on rank {rank}").format(a=a, b=b, s=s, rank=rank)
        for a, b, s in collisions
    ]
    packed = True
    starts = batch.query_start_loc
    config = (batch.world_size, rank, batch.interleave, batch.kv_cache_block_size)
    for q, first in enumerate(batch.first_positions):
        mine = [local[t] for t in range(starts[q], starts[q + 1]) if local[t] >= 0]
        want = list(
            range(local_length(first, *config), local_length(first + batch.lengths[q], *config))
        )
        if mine != want:
            packed = False
            notes.append(
                _("request {q} on rank {rank}: local positions {mine}, expected {want}").format(
                    q=q, rank=rank, mine=mine, want=want
                )
            )
    counts = count.cpu().tolist()
    for token, c in enumerate(counts):
        if c != 1:
            notes.append(
                _("token {token} (position {position}) is stored by {count} ranks").format(
                    token=token, position=batch.positions[token], count=c
                )
            )
    padding_ok = all(v == PAD_SLOT_ID for v in values[n:])
    agrees = values == expected
    broken = torch.tensor(
        [int(bool(notes) or not padding_ok or not agrees)], dtype=torch.int32, device=ctx.device
    )
    dist.all_reduce(broken, op=dist.ReduceOp.MAX)
    return RankEvidence(
        rank=rank,
        world_size=world,
        pid=os.getpid(),
        device=str(ctx.device),
        communication=ctx.communication,
        positions=batch.positions,
        block_table=rows,
        slots=values,
        agrees_with_reference=agrees,
        local_positions=local,
        collisions=collisions,
        packed=packed,
        owners=[g.cpu().tolist() for g in gathered],
        owner_count=counts,
        padding_ok=padding_ok,
        proved=not bool(broken.item()),
        seconds=time.perf_counter() - start,
        notes=notes,
    )
