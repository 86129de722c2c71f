"""Lesson 05's exercises: context parallelism.

* ``05.is_local``: steps 1 and 2, in Python: does rank ``r`` store position ``p``? It returns
  step 1's virtual block and offset too: under the launchers' rule (``I`` divides the kv
  block) the shortcut ``(p // I) % W`` owns every position as the steps do, so the answer
  alone cannot show step 1.
* ``05.local_block_and_offset``: steps 3 and 4, in Python: the logical block and block offset
  of a position on the rank that stores it (the rank's segments packed one after another).
* ``05.cp_kernel``: all of it inside a teaching kernel (lesson 02's kernel, one block-table
  load per lane), run once per rank; the judge checks the ranks together.
* ``05.rank_fn``: a function ``rank_fn(ctx, batch)`` that each process of
  ``slotmap.distributed.run_ranks`` runs (so it lives in a module): this rank's slot mapping
  with ``cp_rank=ctx.rank``. The judge starts two real ranks per case (named cases only: a
  spawn costs seconds) and proves the partition from what they return.

The judges speak in the partition invariant's words: a position with no owner, a position two
ranks claim, two positions that land in the same place on one rank, a rank whose positions are
not packed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from torch import Tensor

from slotmap.cp import CPBatch, expected_slots, five_steps, local_position, owner_of
from slotmap.exercises.cases import (
    GUARD,
    SlotCase,
    explain_slot_mapping,
    guarded_output,
    launch_learner_kernel,
    slot_cases,
)
from slotmap.exercises.core import Exercise, Skipped, Wrong, plural, register
from slotmap.i18n import N_, _, tr
from slotmap.layout import PAD_SLOT_ID
from slotmap.reference import slot_mapping_oracle

TILE = 8  # tokens per tile in this lesson's kernel exercise


@dataclass(frozen=True)
class CPConfig:
    """A context-parallel configuration: what the Python exercises are checked on."""

    world_size: int
    interleave: int
    kv_cache_block_size: int
    block_size: int | None = None  # 05.local_block_and_offset only

    def __str__(self) -> str:
        text = (
            f"world_size={self.world_size}, interleave={self.interleave}, "
            f"kv_cache_block_size={self.kv_cache_block_size}"
        )
        if self.block_size is not None:
            text += f", block_size={self.block_size}"
        return text + f" (positions 0..{_span(self.world_size, self.kv_cache_block_size) - 1})"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _span(world_size: int, kv_cache_block_size: int) -> int:
    """Positions a check walks through: two virtual blocks and a bit of a third."""
    return 2 * world_size * kv_cache_block_size + 3


def why_owner(position: int, world_size: int, interleave: int, kv_cache_block_size: int) -> str:
    """Steps 1 and 2 for one position, in words."""
    s = five_steps(position, kv_cache_block_size, kv_cache_block_size, world_size, interleave)
    return _(
        "V = {kv_cache_block_size}·{world_size} = {virtual_block_size}, virtual offset "
        "{position} % {virtual_block_size} = {virtual_offset}, segment {virtual_offset} "
        "// {interleave} = {segment}, owner {segment} % {world_size} = {owner}"
    ).format(
        kv_cache_block_size=kv_cache_block_size,
        world_size=world_size,
        virtual_block_size=s.virtual_block_size,
        position=position,
        virtual_offset=s.virtual_offset,
        interleave=interleave,
        segment=s.segment,
        owner=s.owner,
    )


# ---------------------------------------------------------------------------------------------
# 05.is_local
# ---------------------------------------------------------------------------------------------
IS_LOCAL_HINT = N_(
    "Step 1: which virtual block (W physical blocks of kv_cache_block_size "
    "positions, one per rank) holds p, and where does p sit inside it? Return both "
    "with the answer. Step 2: which segment of I positions is that? The segments are "
    "dealt out to the ranks in turn, round after round."
)


def _is_local_cases() -> list[tuple[str, CPConfig]]:
    return [
        (N_("two ranks, interleave 1: positions alternate"), CPConfig(2, 1, 4)),
        (N_("two ranks, interleave 2"), CPConfig(2, 2, 4)),
        (N_("three ranks, interleave 2, kv block 4"), CPConfig(3, 2, 4)),
        (N_("interleave = kv block: whole blocks per rank"), CPConfig(2, 4, 4)),
        (N_("one rank: no context parallelism"), CPConfig(1, 1, 4)),
        (N_("four ranks, interleave 3, kv block 6"), CPConfig(4, 3, 6)),
        (N_("production sizes: eight ranks, interleave 16, kv block 64"), CPConfig(8, 16, 64)),
    ]


@st.composite
def _cp_config(draw: st.DrawFn) -> CPConfig:
    kv = draw(st.sampled_from((1, 2, 3, 4, 6, 8)))
    return CPConfig(draw(st.integers(1, 4)), draw(st.sampled_from(_divisors(kv))), kv)


def _as_bool(value: Any, call: str) -> bool:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    if type(value).__name__ == "bool_":  # numpy
        return bool(value)
    raise Wrong(
        _("{call} returned {value!r}, not True or False").format(call=call, value=value),
        _("True or False"),
        repr(value),
    )


def _as_int(value: Any, call: str, what: str) -> int:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if type(value).__name__.startswith("int") and not isinstance(value, bool):
        return int(value)  # int, or numpy's integers
    raise Wrong(
        _("{call} returned {what} {value!r}, not an integer").format(
            call=call, what=what, value=value
        ),
        _("an integer"),
        repr(value),
    )


def _is_local_answer(value: Any, call: str) -> tuple[int, int, bool]:
    """The learner's (virtual_block, virtual_offset, stored), each checked for its type."""
    if isinstance(value, list):
        value = tuple(value)
    if not (isinstance(value, tuple) and len(value) == 3):
        raise Wrong(
            _("{call} returned {value!r}, not (virtual_block, virtual_offset, stored)").format(
                call=call, value=value
            ),
            _("(virtual_block, virtual_offset, True or False)"),
            repr(value),
            _(
                "Return step 1's virtual block and virtual offset with the answer: under the "
                "launchers' rule a shortcut gives the same owners, and the check reads step 1 "
                "from them."
            ),
        )
    block = _as_int(value[0], call, "a virtual block")
    offset = _as_int(value[1], call, "a virtual offset")
    return block, offset, _as_bool(value[2], call)


def _check_step_one(p: int, r: int, got: tuple[int, int], case: CPConfig) -> None:
    world, kv = case.world_size, case.kv_cache_block_size
    s = five_steps(p, kv, kv, world, case.interleave)
    if got != (s.virtual_block, s.virtual_offset):
        raise Wrong(
            _(
                "position {p} sits in virtual block {virtual_block} at virtual offset "
                "{virtual_offset}, but is_local({p}, {r}, {world}, {interleave}, {kv}) gives "
                "virtual block {got}, offset {got2}"
            ).format(
                p=p,
                virtual_block=s.virtual_block,
                virtual_offset=s.virtual_offset,
                r=r,
                world=world,
                interleave=case.interleave,
                kv=kv,
                got=got[0],
                got2=got[1],
            ),
            _(
                "virtual block {virtual_block}, offset {virtual_offset} (V = {kv}·{world} = "
                "{virtual_block_size}: one physical block of {kv} per rank)"
            ).format(
                virtual_block=s.virtual_block,
                virtual_offset=s.virtual_offset,
                kv=kv,
                world=world,
                virtual_block_size=s.virtual_block_size,
            ),
            _("virtual block {got}, offset {got2}").format(got=got[0], got2=got[1]),
            IS_LOCAL_HINT,
        )


def _pattern(owners: dict[int, int], world: int, interleave: int, kv: int) -> str:
    """A well-known wrong rule that explains every owner the candidate chose, in words."""
    rules = {
        N_("p % W (as if the interleave were 1)"): lambda p: p % world,
        N_("(p // kv_cache_block_size) % W (whole kv blocks per rank, not segments of I)"): (
            lambda p: (p // kv) % world
        ),
        N_("(p % V) // I without the final % W (the segment, not its rank)"): (
            lambda p: (p % (kv * world)) // interleave
        ),
    }
    for words, rule in rules.items():
        if all(rule(p) == owner for p, owner in owners.items()):
            return _("; your owners follow {words}").format(words=tr(words))
    return ""


def judge_is_local(candidate: Callable[..., Any], case: CPConfig) -> None:
    world, interleave, kv = case.world_size, case.interleave, case.kv_cache_block_size
    owners: dict[int, int] = {}
    for p in range(_span(world, kv)):
        claimed = []
        for r in range(world):
            call = f"is_local({p}, {r}, {world}, {interleave}, {kv})"
            block, offset, stored = _is_local_answer(candidate(p, r, world, interleave, kv), call)
            _check_step_one(p, r, (block, offset), case)
            if stored:
                claimed.append(r)
        owner = owner_of(p, world, interleave, kv)
        if not claimed:
            raise Wrong(
                _(
                    "position {p} has no owner: is_local({p}, r, {world}, {interleave}, {kv}) is "
                    "False for every rank r in 0..{value}"
                ).format(p=p, world=world, interleave=interleave, kv=kv, value=world - 1),
                _("True on rank {owner} ({why_owner})").format(
                    owner=owner, why_owner=why_owner(p, world, interleave, kv)
                ),
                _("False on every rank"),
                IS_LOCAL_HINT,
            )
        if len(claimed) > 1:
            ranks = _("{first} and {last}").format(
                first=", ".join(map(str, claimed[:-1])), last=claimed[-1]
            )
            raise Wrong(
                _(
                    "position {p} is claimed by ranks {ranks}: exactly one rank may store it"
                ).format(p=p, ranks=ranks),
                _("only rank {owner} ({why_owner})").format(
                    owner=owner, why_owner=why_owner(p, world, interleave, kv)
                ),
                _("ranks {claimed}").format(claimed=claimed),
                IS_LOCAL_HINT,
            )
        owners[p] = claimed[0]
    for p, got in owners.items():
        owner = owner_of(p, world, interleave, kv)
        if got != owner:
            raise Wrong(
                _(
                    "position {p} is stored by rank {owner}, but your is_local puts it on rank "
                    "{got}{pattern}"
                ).format(
                    p=p, owner=owner, got=got, pattern=_pattern(owners, world, interleave, kv)
                ),
                _("rank {owner} ({why_owner})").format(
                    owner=owner, why_owner=why_owner(p, world, interleave, kv)
                ),
                _("rank {got}").format(got=got),
                IS_LOCAL_HINT,
            )


register(
    Exercise(
        id="05.is_local",
        title=N_("steps 1 and 2: which rank stores a position"),
        cases=_is_local_cases,
        strategy=_cp_config,
        judge=judge_is_local,
        hint=IS_LOCAL_HINT,
        max_examples=60,
    )
)


# ---------------------------------------------------------------------------------------------
# 05.local_block_and_offset
# ---------------------------------------------------------------------------------------------
LOCAL_HINT = N_(
    "Step 3 packs this rank's segments one after another: how many whole rounds of "
    "W·I positions came before the virtual offset (each gave this rank I positions), "
    "plus the offset inside the current segment. Step 4: every earlier virtual block "
    "filled one physical block of this rank, that is kv_cache_block_size // "
    "block_size logical blocks; the local offset then splits into a block and an "
    "offset like any position."
)


def _local_cases() -> list[tuple[str, CPConfig]]:
    return [
        (N_("two ranks, interleave 1, blocks of 4"), CPConfig(2, 1, 4, 4)),
        (N_("two ranks, interleave 2, blocks of 4"), CPConfig(2, 2, 4, 4)),
        (N_("three ranks, interleave 2: into the third virtual block"), CPConfig(3, 2, 4, 4)),
        (N_("interleave = block size: whole blocks per rank"), CPConfig(2, 4, 4, 4)),
        (N_("hybrid blocks: a kv block of 8 holds 2 blocks of 4"), CPConfig(2, 2, 8, 4)),
        (N_("one rank: the plain formula"), CPConfig(1, 1, 4, 4)),
        (
            N_(
                "production sizes: four ranks, interleave 8, a kv block of 64 holds 4 blocks of 16"
            ),
            CPConfig(4, 8, 64, 16),
        ),
    ]


@st.composite
def _local_config(draw: st.DrawFn) -> CPConfig:
    config = draw(_cp_config())
    per = draw(st.sampled_from((1, 1, 2)))
    kv = config.kv_cache_block_size
    return CPConfig(config.world_size, config.interleave, kv * per, kv)


def _where(block: int, offset: int, block_size: int) -> str:
    return _("logical block {block}, offset {offset} (local position {value})").format(
        block=block, offset=offset, value=block * block_size + offset
    )


def _block_and_offset(candidate: Callable[..., Any], call_args: tuple) -> tuple[int, int]:
    got = candidate(*call_args)
    call = f"local_block_and_offset{call_args}"
    if isinstance(got, list):
        got = tuple(got)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise Wrong(
            _("{call} returned {got!r}, not a (block, offset) pair").format(call=call, got=got),
            _("(block, offset)"),
            got,
        )
    values = []
    for value in got:
        if isinstance(value, Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(value, int) or isinstance(value, bool):
            raise Wrong(
                _("{call} returned {got!r}: block and offset must be integers").format(
                    call=call, got=got
                )
            )
        values.append(value)
    return values[0], values[1]


def judge_local_block_and_offset(candidate: Callable[..., Any], case: CPConfig) -> None:
    world, interleave, kv = case.world_size, case.interleave, case.kv_cache_block_size
    block_size = case.block_size
    span = _span(world, kv)
    placed: dict[tuple[int, int, int], int] = {}  # (rank, block, offset) -> position
    got_of: dict[int, tuple[int, int]] = {}
    for p in range(span):
        block, offset = _block_and_offset(candidate, (p, block_size, kv, world, interleave))
        rank = owner_of(p, world, interleave, kv)
        if not 0 <= offset < block_size or block < 0:
            raise Wrong(
                _(
                    "position {p} got block offset {offset} in logical block {block}: an offset "
                    "is "
                    "in 0..{value} and a block is >= 0"
                ).format(p=p, offset=offset, block=block, value=block_size - 1),
                _where(*divmod(local_position(p, world, interleave, kv), block_size), block_size),
                _("logical block {block}, offset {offset}").format(block=block, offset=offset),
                LOCAL_HINT,
            )
        if (rank, block, offset) in placed:
            first = placed[(rank, block, offset)]
            raise Wrong(
                _(
                    "positions {first} and {p} both land on rank {rank} at logical block {block}, "
                    "offset {offset}: they would share a slot"
                ).format(first=first, p=p, rank=rank, block=block, offset=offset),
                _("position {first}: ").format(first=first)
                + _where(
                    *divmod(local_position(first, world, interleave, kv), block_size), block_size
                )
                + _("; position {p}: ").format(p=p)
                + _where(
                    *divmod(local_position(p, world, interleave, kv), block_size), block_size
                ),
                _("both at logical block {block}, offset {offset}").format(
                    block=block, offset=offset
                ),
                LOCAL_HINT,
            )
        placed[(rank, block, offset)] = p
        got_of[p] = (block, offset)
    # Packed: a rank's positions fill its local positions 0, 1, 2, ... without a hole.
    for rank in range(world):
        mine = sorted(b * block_size + o for (r, b, o) in placed if r == rank)
        holes = sorted(set(range(len(mine))) - set(mine))
        if holes:
            hole = holes[0]
            beyond = next(
                p
                for (r, b, o), p in placed.items()
                if r == rank and b * block_size + o >= len(mine)
            )
            raise Wrong(
                _(
                    "rank {rank} is not packed: its local position {hole} (logical block {value}, "
                    "offset {value2}) stays empty while position {beyond} is placed at local "
                    "position {value3}"
                ).format(
                    rank=rank,
                    hole=hole,
                    value=hole // block_size,
                    value2=hole % block_size,
                    beyond=beyond,
                    value3=got_of[beyond][0] * block_size + got_of[beyond][1],
                ),
                _("rank {rank}'s {positions} at local positions 0..{value}").format(
                    rank=rank, positions=plural(len(mine), N_("position")), value=len(mine) - 1
                ),
                _("local positions {mine}").format(mine=mine),
                LOCAL_HINT,
            )
    for p, (block, offset) in got_of.items():
        expected = divmod(local_position(p, world, interleave, kv), block_size)
        if (block, offset) != expected:
            s = five_steps(p, block_size, kv, world, interleave)
            raise Wrong(
                _("position {p} on rank {owner} should be at {where}, got {where2}").format(
                    p=p,
                    owner=s.owner,
                    where=_where(*expected, block_size),
                    where2=_where(block, offset, block_size),
                ),
                _(
                    "vo = {virtual_offset}, lo = {local_offset}, block = {virtual_block}·{value} "
                    "+ "
                    "{local_offset} // {block_size} = {block}, offset {offset}"
                ).format(
                    virtual_offset=s.virtual_offset,
                    local_offset=s.local_offset,
                    virtual_block=s.virtual_block,
                    value=kv // block_size,
                    block_size=block_size,
                    block=s.block,
                    offset=s.offset,
                ),
                _("logical block {block}, offset {offset}").format(block=block, offset=offset),
                LOCAL_HINT,
            )


register(
    Exercise(
        id="05.local_block_and_offset",
        title=N_("steps 3 and 4: where a position goes on its rank"),
        cases=_local_cases,
        strategy=_local_config,
        judge=judge_local_block_and_offset,
        hint=LOCAL_HINT,
        max_examples=60,
    )
)


# ---------------------------------------------------------------------------------------------
# 05.cp_kernel
# ---------------------------------------------------------------------------------------------
KERNEL_HINT = N_(
    "The five steps of 05.is_local and 05.local_block_and_offset, on a whole tile of "
    "positions at once: step 1 the virtual block and offset, step 2 has_slot (is the "
    "segment's rank TOTAL_CP_RANK?), step 3 the packed local offset, step 4 "
    "block_indices (each earlier virtual block counts BLOCKS_PER_KV_BLOCK blocks) "
    "and slot_offsets."
)


def _cp_case(qsl, positions, table, block_size, world, interleave, kv=None, max_num_tokens=None):
    options = {
        "kv_cache_block_size": kv or block_size,
        "cp_world_size": world,
        "cp_interleave": interleave,
    }
    return SlotCase(qsl, positions, table, block_size, max_num_tokens, options)


def _cp_kernel_cases() -> list[tuple[str, SlotCase]]:
    return [
        (
            N_("two ranks, interleave 1, one request of 12"),
            _cp_case([0, 12], list(range(12)), [[5, 2, 7]], 4, 2, 1),
        ),
        (
            N_("two ranks, interleave 2, into the second virtual block"),
            _cp_case([0, 14], list(range(14)), [[5, 2, 7]], 4, 2, 2),
        ),
        (
            N_("three ranks, interleave 2, two requests, a decode step at 21"),
            _cp_case(
                [0, 13, 14],
                list(range(13)) + [21],
                [[5, 2, 7], [9, 1, 3]],
                4,
                3,
                2,
                max_num_tokens=17,
            ),
        ),
        (
            N_("hybrid: a kv block of 8 holds 2 blocks of 4"),
            _cp_case([0, 20], list(range(20)), [[6, 7, 2, 3, 10, 11]], 4, 2, 2, kv=8),
        ),
        (N_("one rank: the plain kernel"), _cp_case([0, 9], list(range(9)), [[4, 8, 1]], 4, 1, 1)),
    ]


@st.composite
def _cp_kernel_strategy(draw: st.DrawFn) -> SlotCase:
    case = draw(
        slot_cases(block_sizes=(1, 2, 3, 4), max_requests=2, max_length=20, large_blocks=True)
    )
    world = draw(st.integers(1, 4))
    # The block size divides the kv block: kv = block_size * blocks_per_kv_block.
    per = draw(st.sampled_from((1, 1, 2)))
    kv = case.block_size * per
    interleave = draw(st.sampled_from(_divisors(kv)))
    case.options = {"kv_cache_block_size": kv, "cp_world_size": world, "cp_interleave": interleave}
    return case


def launch_cp_kernel(kernel, case: SlotCase, rank: int) -> list[int]:
    """Run a learner's CP kernel as rank ``rank`` on a poisoned, guarded output; returns the
    whole buffer (guard + output + guard)."""
    qsl, positions, table = case.tensors()
    kv = case.options["kv_cache_block_size"]
    buffer, out = guarded_output(case.padded_length, positions.device)
    launch_learner_kernel(
        kernel,
        qsl,
        positions,
        table,
        case.block_size,
        num_tokens=case.num_tokens,
        max_num_tokens=case.padded_length,
        out=out,
        tile_size=TILE,
        KV_CACHE_BLOCK_SIZE=kv,
        BLOCKS_PER_KV_BLOCK=kv // case.block_size,
        TOTAL_CP_WORLD_SIZE=case.options["cp_world_size"],
        TOTAL_CP_RANK=rank,
        CP_KV_CACHE_INTERLEAVE_SIZE=case.options["cp_interleave"],
    )
    return buffer.tolist()


def judge_cp_kernel(kernel, case: SlotCase) -> None:
    if not hasattr(kernel, "__getitem__"):
        raise Wrong(
            _("expected a @triton.jit kernel, got {name}").format(name=type(kernel).__name__),
            hint=_("Pass the kernel itself: check('05.cp_kernel', cp_kernel)."),
        )
    world = case.options["cp_world_size"]
    interleave = case.options["cp_interleave"]
    kv = case.options["kv_cache_block_size"]
    qsl, positions, table = case.tensors("cpu")
    counts = {"num_tokens": case.num_tokens, "max_num_tokens": case.padded_length}
    expected, got = [], []
    for rank in range(world):
        expected.append(
            slot_mapping_oracle(
                qsl, positions, table, case.block_size, cp_rank=rank, **counts, **case.options
            ).tolist()
        )
        buffer = launch_cp_kernel(kernel, case, rank)
        wrong = explain_slot_mapping(case, expected[rank], buffer)
        if wrong is not None and wrong.kind in ("lane", "unwritten", "padding"):
            wrong.invariant = _("on rank {rank}: {invariant}").format(
                rank=rank, invariant=wrong.invariant
            )
            raise wrong  # out-of-bounds writes, unwritten elements, a bad padding tail
        got.append(buffer[GUARD : GUARD + case.padded_length])
    # The partition: every token stored by exactly one rank.
    for token in range(case.num_tokens):
        p = case.positions[token]
        claimed = [r for r in range(world) if got[r][token] != PAD_SLOT_ID]
        owner = owner_of(p, world, interleave, kv)
        where = _("token {token} (request {request_of}, position {p})").format(
            token=token, request_of=case.request_of(token), p=p
        )
        if not claimed:
            raise Wrong(
                _("{where} has no owner: every rank wrote PAD_ID").format(where=where),
                _("a slot on rank {owner} ({why_owner})").format(
                    owner=owner, why_owner=why_owner(p, world, interleave, kv)
                ),
                _("PAD_ID on every rank"),
                KERNEL_HINT,
            )
        if len(claimed) > 1:
            raise Wrong(
                _("{where} is stored by ranks {claimed}: exactly one rank may store it").format(
                    where=where, claimed=claimed
                ),
                _("only rank {owner} ({why_owner})").format(
                    owner=owner, why_owner=why_owner(p, world, interleave, kv)
                ),
                _("slots {value} on ranks {claimed}").format(
                    value=[got[r][token] for r in claimed], claimed=claimed
                ),
                KERNEL_HINT,
            )
        if claimed[0] != owner:
            raise Wrong(
                _("{where} is stored by rank {claimed}, but it belongs to rank {owner}").format(
                    where=where, claimed=claimed[0], owner=owner
                ),
                _("rank {owner} ({why_owner})").format(
                    owner=owner, why_owner=why_owner(p, world, interleave, kv)
                ),
                _("rank {claimed}").format(claimed=claimed[0]),
                KERNEL_HINT,
            )
    # On each rank: distinct positions of a request get distinct slots, and the right ones.
    for rank in range(world):
        seen: dict[int, int] = {}
        for token in range(case.num_tokens):
            slot = got[rank][token]
            if slot == PAD_SLOT_ID:
                continue
            if slot in seen and case.positions[seen[slot]] != case.positions[token]:
                first = seen[slot]
                raise Wrong(
                    _(
                        "positions {value} and {value2} (tokens {first} and {token}) both land "
                        "on rank "
                        "{rank} in slot {slot}"
                    ).format(
                        value=case.positions[first],
                        value2=case.positions[token],
                        first=first,
                        token=token,
                        rank=rank,
                        slot=slot,
                    ),
                    _("slots {value} and {value2}").format(
                        value=expected[rank][first], value2=expected[rank][token]
                    ),
                    _("slot {slot} twice").format(slot=slot),
                    KERNEL_HINT,
                )
            seen[slot] = token
        for token in range(case.num_tokens):
            if got[rank][token] != expected[rank][token]:
                p = case.positions[token]
                s = five_steps(p, case.block_size, kv, world, interleave)
                raise Wrong(
                    _(
                        "token {token} (position {p}) on rank {rank} should be in slot {value}, "
                        "got "
                        "{value2}"
                    ).format(
                        token=token,
                        p=p,
                        rank=rank,
                        value=expected[rank][token],
                        value2=got[rank][token],
                    ),
                    _("slot {value} (logical block {block}, offset {offset})").format(
                        value=expected[rank][token], block=s.block, offset=s.offset
                    ),
                    got[rank][token],
                    KERNEL_HINT,
                )


register(
    Exercise(
        id="05.cp_kernel",
        title=N_("the context-parallel branch of the kernel"),
        cases=_cp_kernel_cases,
        strategy=_cp_kernel_strategy,
        judge=judge_cp_kernel,
        hint=KERNEL_HINT,
        max_examples=25,
    )
)


# ---------------------------------------------------------------------------------------------
# 05.rank_fn
# ---------------------------------------------------------------------------------------------
RANK_FN_HINT = N_(
    "Each process runs rank_fn(ctx, batch) and sees only itself: build this rank's "
    "tensors with batch.tensors(ctx.rank, ctx.device) (its own block table), then "
    "call slotmap.compute_slot_mapping with the batch's kv_cache_block_size, "
    "interleave and max_num_tokens, cp_world_size=ctx.world_size and "
    "cp_rank=ctx.rank; return the slots as a list of ints."
)


def _rank_fn_cases() -> list[tuple[str, CPBatch]]:
    return [
        (
            N_("two ranks, interleave 2, two requests, a padding tail"),
            CPBatch(
                lengths=(11, 1),
                starts=(0, 9),
                block_size=2,
                kv_cache_block_size=4,
                world_size=2,
                interleave=2,
                max_num_tokens=14,
                seed=3,
            ),
        ),
        (
            N_("two ranks, interleave 1, hybrid: a kv block of 8 holds 2 blocks of 4"),
            CPBatch(
                lengths=(13,),
                block_size=4,
                kv_cache_block_size=8,
                world_size=2,
                interleave=1,
                seed=4,
            ),
        ),
    ]


def _rank_slots(value: Any, rank: int, length: int) -> list[int]:
    if isinstance(value, Tensor):
        value = value.tolist()
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise Wrong(
            _("rank {rank}'s rank_fn returned {name}, not a list of slots").format(
                rank=rank, name=type(value).__name__
            ),
            _("a list of {ints}").format(ints=plural(length, N_("int"))),
            repr(value)[:80],
            RANK_FN_HINT,
        )
    if len(value) != length:
        raise Wrong(
            _(
                "rank {rank}'s rank_fn returned {slots}, the batch has max_num_tokens {length}"
            ).format(rank=rank, slots=plural(len(value), N_("slot")), length=length),
            plural(length, N_("slot")),
            plural(len(value), N_("slot")),
            RANK_FN_HINT,
        )
    return list(value)


IN_A_MODULE_HINT = N_(
    "Keep the %%writefile my_rank_fn.py line at the top of the exercise's cell (it "
    "writes the function into my_rank_fn.py next to the notebook instead of defining "
    "it here), run that cell, then check my_rank_fn.rank_fn: a spawned rank imports "
    "the function by its module's name."
)


def _defined_in_a_notebook(fn: Callable[..., Any]) -> bool:
    """``fn`` lives in an interactive ``__main__`` (a notebook cell), which a spawned rank
    cannot import. Triton's interpreter may have lent ``__main__`` its own ``__file__``
    (``slotmap.distributed`` explains), which makes the notebook look like a script."""
    if getattr(fn, "__module__", None) != "__main__":
        return False
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    interpreter = sys.modules.get("triton.runtime.interpreter")
    return not main_file or main_file == getattr(interpreter, "__file__", "")


def judge_rank_fn(fn: Callable[..., Any], batch: CPBatch) -> None:
    from slotmap import cp
    from slotmap.backend import BACKEND
    from slotmap.distributed import RankFailed, UnimportableRankFunction, run_ranks

    if _defined_in_a_notebook(fn):
        raise Wrong(
            _(
                "{getattr!r} is defined in a notebook cell: a rank is a new process that imports "
                "its function by module and name, and it cannot import this notebook (each rank "
                "would die with \"Can't get attribute '{getattr}' on <module '__main__'>\"); rank "
                "functions must live in a module"
            ).format(getattr=getattr(fn, "__name__", fn)),
            hint=IN_A_MODULE_HINT,
        )
    world, length = batch.world_size, batch.max_num_tokens or batch.num_tokens
    available = cp.max_ranks()
    if available < world:
        # One rank per device: the machine, not the learner's function, is short of ranks.
        raise Skipped(
            _(
                "the check runs {world} ranks, one per {name} device, and this machine has "
                "{devices}; it runs on a machine with {world} or more, or on the CPU "
                "(SLOTMAP_BACKEND=cpu, where the ranks talk over gloo)"
            ).format(world=world, name=BACKEND.name, devices=plural(available, N_("device")))
        )
    try:
        returned = run_ranks(fn, world, batch, timeout_s=120)
    except UnimportableRankFunction as error:
        raise Wrong(
            _("run_ranks cannot start {getattr!r}: {error}").format(
                getattr=getattr(fn, "__name__", fn), error=error
            ),
            hint=IN_A_MODULE_HINT,
        ) from None
    except RankFailed as error:
        if "raise NotImplementedError" in str(error):
            raise NotImplementedError(str(error)) from None
        raise
    slots = [_rank_slots(value, rank, length) for rank, value in enumerate(returned)]
    positions, config = batch.positions, (world, batch.interleave, batch.kv_cache_block_size)
    for token, p in enumerate(positions):
        claimed = [r for r in range(world) if slots[r][token] != PAD_SLOT_ID]
        owner = owner_of(p, *config)
        why = why_owner(p, *config)
        if not claimed:
            raise Wrong(
                _(
                    "token {token} (position {p}) has no owner: every rank's slot mapping has "
                    "PAD_ID "
                    "there"
                ).format(token=token, p=p),
                _("a slot on rank {owner} ({why})").format(owner=owner, why=why),
                _("PAD_ID on every rank"),
                RANK_FN_HINT,
            )
        if len(claimed) > 1:
            raise Wrong(
                _(
                    "token {token} (position {p}) is stored by ranks {claimed}: exactly one rank "
                    "may "
                    "store it (does every rank pass its own cp_rank?)"
                ).format(token=token, p=p, claimed=claimed),
                _("only rank {owner} ({why})").format(owner=owner, why=why),
                _("slots {value} on ranks {claimed}").format(
                    value=[slots[r][token] for r in claimed], claimed=claimed
                ),
                RANK_FN_HINT,
            )
    for rank in range(world):
        expected = expected_slots(batch, rank)
        if slots[rank] != expected:
            token = next(t for t in range(length) if slots[rank][t] != expected[t])
            raise Wrong(
                _(
                    "rank {rank}'s slot mapping differs from the reference at token {token}: each "
                    "rank uses its own block table, batch.tensors(ctx.rank, ctx.device)"
                ).format(rank=rank, token=token),
                _("slot {expected}").format(expected=expected[token]),
                _("slot {value}").format(value=slots[rank][token]),
                RANK_FN_HINT,
            )


register(
    Exercise(
        id="05.rank_fn",
        title=N_("a rank function for run_ranks: each rank's own slot mapping"),
        cases=_rank_fn_cases,
        strategy=None,  # every case spawns processes: named cases only
        judge=judge_rank_fn,
        hint=RANK_FN_HINT,
    )
)
