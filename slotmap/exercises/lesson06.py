"""Lesson 06's exercises: hybrid blocks, replay padding and the group switches.

* ``06.expand_block_table``: turn a block table of physical KV blocks into one of attention
  blocks (``slotmap.expand_block_table``). In the course's notation (B = ``block_size``, the
  attention block; K = ``kv_cache_block_size``, the physical block; K/B =
  ``blocks_per_kv_block``), physical block ``k`` holds attention blocks
  ``k * K/B .. (k + 1) * K/B - 1``.
* ``06.replay_padding``: the lanes of the replay-padding kernel whose slot becomes PAD_ID:
  positions ``[replay_start[q], replay_start[q] + window)`` of a request with
  ``replay_start[q] > 0``, in prefix-cacheable groups only.

* ``06.group_switches``: one KV-cache group's slot mapping with production's switches
  (docs/semantics.md §4): a disabled group maps no token and never reads its table, a group
  that is not sharded ignores context parallelism, the kernel block lives inside the
  allocation block, a dummy request (``idx_mapping`` -1) reads no row, and the padding starts
  at the real token count ``query_start_loc[num_reqs]``, not at a padded host count, in a
  persistent buffer that still holds an earlier step's slots.

The judges name the classic mistakes: for the expansion, numbering attention blocks like KV
blocks, forgetting the ``+ j`` or the ``* K/B``, a strided (non-contiguous) result; for the
padding, padding a request without replay (``replay_start == 0``), a closed range, or a group
that is not prefix-cacheable; for the switches, a disabled group or a dummy request that reads
a row, CP on an unsharded group or on kernel blocks, and padding from the host count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import Tensor

from slotmap.backend import DEVICE
from slotmap.exercises.cases import GUARD, POISON, checked_launch
from slotmap.exercises.core import Exercise, Wrong, plural, register
from slotmap.i18n import N_, _
from slotmap.layout import PAD_SLOT_ID
from slotmap.reference import replay_padding_oracle, slot_mappings_oracle, token_slot

TILE = 8  # tokens per tile in this lesson's kernel exercise


# ---------------------------------------------------------------------------------------------
# 06.expand_block_table
# ---------------------------------------------------------------------------------------------
EXPAND_HINT = N_(
    "Count in attention blocks: physical KV block k holds the K/B attention blocks "
    "that start at k * K/B (K/B = blocks_per_kv_block). Each entry of a row becomes "
    "those K/B entries, in its place."
)


@dataclass
class ExpandCase:
    block_table: list[list[int]]  # the manager's table: physical KV blocks
    blocks_per_kv_block: int
    width: int  # entries per row (a table without rows still has a width)
    spare_columns: int = 0  # > 0: the table is the first columns of a wider one (strided)

    def tensor(self) -> Tensor:
        if not self.block_table:
            return torch.empty(0, self.width, dtype=torch.int32, device=DEVICE)
        rows = [row + [-1] * self.spare_columns for row in self.block_table]
        return torch.tensor(rows, dtype=torch.int32, device=DEVICE)[:, : self.width]

    def __str__(self) -> str:
        table = self.block_table or _("<0 rows of {entries}>").format(
            entries=plural(self.width, N_("entry"))
        )
        text = f"block_table={table}, blocks_per_kv_block={self.blocks_per_kv_block}"
        if self.spare_columns:
            text += (
                f" (a view of the first {self.width} columns of a table "
                f"{self.width + self.spare_columns} wide: not contiguous)"
            )
        return text


def _expand_case(rows: list[list[int]], per: int) -> ExpandCase:
    return ExpandCase(rows, per, len(rows[0]))


def _expand_cases() -> list[tuple[str, ExpandCase]]:
    return [
        (N_("one request, two KV blocks of 3 attention blocks"), _expand_case([[3, 1]], 3)),
        (N_("two requests, 4 attention blocks a KV block"), _expand_case([[3, 1], [0, 5]], 4)),
        (N_("blocks_per_kv_block 1 changes nothing"), _expand_case([[7, 2, 9]], 1)),
        (N_("KV block 0 holds attention blocks 0 .. B - 1"), _expand_case([[0, 2]], 2)),
        (N_("a table without rows"), ExpandCase([], 4, 3)),
        (N_("large block numbers"), _expand_case([[2**28, 5]], 4)),
        (
            N_("a strided table: the first columns of a persistent, wider one"),
            ExpandCase([[3, 1], [0, 5]], 2, 2, spare_columns=3),
        ),
    ]


@st.composite
def _expand_strategy(draw: st.DrawFn) -> ExpandCase:
    per = draw(st.integers(1, 5))
    width = draw(st.integers(1, 4))
    rows = draw(st.integers(1, 3))
    entries = st.integers(0, 63)
    table = draw(
        st.lists(st.lists(entries, min_size=width, max_size=width), min_size=rows, max_size=rows)
    )
    return ExpandCase(table, per, width, draw(st.sampled_from((0, 0, 2))))


def diagnose_expansion(case: ExpandCase, got: list[list[int]]) -> Wrong | None:
    """The first manager entry whose attention blocks in ``got`` are not ``k * K/B .. (k + 1)
    * K/B - 1``, explained by the mistake its K/B entries show (K/B = ``per``)."""
    per = case.blocks_per_kv_block
    for r, row in enumerate(case.block_table):
        for b, k in enumerate(row):
            expected = [k * per + j for j in range(per)]
            values = got[r][b * per : (b + 1) * per]
            if values == expected:
                continue
            j = next(i for i in range(per) if values[i] != expected[i])
            where = _(
                "entries [{r}, {value}..{value2}] are the attention blocks of the manager's "
                "entry [{r}, {b}], physical KV block {k}"
            ).format(r=r, value=b * per, value2=b * per + per - 1, b=b, k=k)
            if values == [k] * per:
                why = _(
                    "{where}: they should be {expected}..{expected2}, got {k} (the KV block's own "
                    "number) each time. KV blocks and attention blocks are numbered in different "
                    "units: attention block {k} lies in KV block {value}, another block's memory"
                ).format(
                    where=where, expected=expected[0], expected2=expected[-1], k=k, value=k // per
                )
            elif values == [k * per] * per:
                why = _(
                    "{where}: they should be {expected}..{expected2}, got {value} each time: all "
                    "{per} attention blocks point to the first one, so their tokens collide"
                ).format(
                    where=where,
                    expected=expected[0],
                    expected2=expected[-1],
                    value=k * per,
                    per=per,
                )
            elif values == [k + i for i in range(per)]:
                why = _(
                    "{where}: they should be k * K/B + j = {k} * {per} + j = "
                    "{expected}..{expected2}, got {k} + j = {values}..{values2} (the factor K/B = "
                    "{per} is missing): attention block {values} lies in KV block {value}"
                ).format(
                    where=where,
                    k=k,
                    per=per,
                    expected=expected[0],
                    expected2=expected[-1],
                    values=values[0],
                    values2=values[-1],
                    value=values[0] // per,
                )
            else:
                why = _(
                    "{where}: entry [{r}, {value}] is its attention block {j} and should be k * "
                    "K/B "
                    "+ {j} = {k} * {per} + {j} = {expected}, got {values}"
                ).format(
                    where=where,
                    r=r,
                    value=b * per + j,
                    j=j,
                    k=k,
                    per=per,
                    expected=expected[j],
                    values=values[j],
                )
            return Wrong(why, expected, values, EXPAND_HINT)
    return None


def judge_expansion(candidate: Callable[[Tensor, int], Tensor], case: ExpandCase) -> None:
    table = case.tensor()
    original = table.clone()
    per = case.blocks_per_kv_block
    got = candidate(table, per)
    rows = len(case.block_table)
    shape = (rows, case.width * per)
    if not isinstance(got, Tensor):
        raise Wrong(
            _("expected a torch.Tensor, got {name}").format(name=type(got).__name__),
            shape,
            got,
            EXPAND_HINT,
        )
    if not torch.equal(table, original):
        raise Wrong(
            _("your function changed the block table it was given (work on a new tensor)"),
            original.tolist(),
            table.tolist(),
            EXPAND_HINT,
        )
    if tuple(got.shape) != shape:
        raise Wrong(
            _(
                "the expanded table has shape {tuple}, expected {shape}: each of the {entrys} of "
                "a row becomes {attention_blocks}"
            ).format(
                tuple=tuple(got.shape),
                shape=shape,
                entrys=plural(case.width, N_("entry")),
                attention_blocks=plural(per, N_("attention block")),
            ),
            shape,
            tuple(got.shape),
            EXPAND_HINT,
        )
    if got.dtype != torch.int32:
        raise Wrong(
            _(
                "the expanded table is {removeprefix}: the kernels read block tables as int32"
            ).format(removeprefix=str(got.dtype).removeprefix("torch.")),
            _("int32"),
            str(got.dtype).removeprefix("torch."),
            _("Build it in the input's dtype (torch.arange(..., dtype=block_table.dtype))."),
        )
    wrong = diagnose_expansion(case, got.cpu().tolist())
    if wrong is not None:
        raise wrong
    if not got.is_contiguous():
        raise Wrong(
            _(
                "the expanded table has the right entries but is not contiguous (strides "
                "{tuple}; a contiguous {shape} x {shape2} table has strides ({shape2}, 1)): the "
                "launchers reject it (block_table must be contiguous), since the kernels read a "
                "row's entries side by side in memory"
            ).format(tuple=tuple(got.stride()), shape=shape[0], shape2=shape[1]),
            _("strides ({shape}, 1)").format(shape=shape[1]),
            _("strides {tuple}").format(tuple=tuple(got.stride())),
            _(
                "A transpose (or expand) changes the strides, not the memory; build the result "
                "in row order, or copy it into row order before returning it."
            ),
        )


register(
    Exercise(
        id="06.expand_block_table",
        title=N_("expand a block table of KV blocks into attention blocks"),
        cases=_expand_cases,
        strategy=_expand_strategy,
        judge=judge_expansion,
        hint=EXPAND_HINT,
        max_examples=60,
    )
)


# ---------------------------------------------------------------------------------------------
# 06.replay_padding
# ---------------------------------------------------------------------------------------------
REPLAY_HINT = N_(
    "A lane is replayed only when several things hold at once: the request mask is "
    "one of them; the group, the request and the position each add one. Lesson 06's "
    "section 4 (replay padding) names them; check which end of the replayed window "
    "is open."
)


@dataclass
class ReplayCase:
    """One batch's slot mappings and the replay of each request."""

    query_start_loc: list[int]
    positions: list[int]
    replay_start: list[int]  # per request, 0: no replay
    window: int
    prefix_cacheable: list[bool]  # per group
    slots: list[list[int]]  # [num_groups, max_num_tokens] before the padding

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1]

    def request_of(self, token: int) -> int:
        return next(
            q for q in range(len(self.query_start_loc) - 1) if token < self.query_start_loc[q + 1]
        )

    def expected(self) -> list[list[int]]:
        slots = torch.tensor(self.slots, dtype=torch.int32)
        qsl = torch.tensor(self.query_start_loc, dtype=torch.int32)
        replay_padding_oracle(
            slots,
            qsl,
            torch.tensor(self.positions, dtype=torch.int64),
            torch.tensor(self.replay_start, dtype=torch.int32),
            self.window,
            self.prefix_cacheable,
        )
        return slots.tolist()

    def __str__(self) -> str:
        return (
            f"query_start_loc={self.query_start_loc}, positions={self.positions}, "
            f"replay_start={self.replay_start}, window={self.window}, "
            f"prefix_cacheable={self.prefix_cacheable}, slot_mappings={self.slots}"
        )


def _replay_case(
    lengths: list[int],
    positions: list[int],
    replay_start: list[int],
    window: int,
    prefix_cacheable: list[bool],
    padding: int = 0,
) -> ReplayCase:
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    width = starts[-1] + padding
    # Distinct, readable slots: group g's token t sits in slot 100 * (g + 1) + t.
    slots = [
        [100 * (g + 1) + t if t < starts[-1] else PAD_SLOT_ID for t in range(width)]
        for g in range(len(prefix_cacheable))
    ]
    return ReplayCase(starts, positions, replay_start, window, prefix_cacheable, slots)


def _replay_cases() -> list[tuple[str, ReplayCase]]:
    return [
        (
            N_("one request replays positions 4..6 (replay_start 4, window 3)"),
            _replay_case([9], list(range(9)), [4], 3, [True]),
        ),
        (
            N_("replay_start 0 means no replay"),
            _replay_case([4, 5], [0, 1, 2, 3, 6, 7, 8, 9, 10], [0, 7], 2, [True]),
        ),
        (
            N_("only the prefix-cacheable group is padded"),
            _replay_case([6], list(range(10, 16)), [11], 3, [True, False]),
        ),
        (
            N_("the range is half-open: window 2 from position 5 pads 5 and 6, not 7"),
            _replay_case([6], list(range(3, 9)), [5], 2, [False, True], padding=2),
        ),
        (
            N_("three requests, shuffled positions, two groups"),
            _replay_case(
                [5, 3, 3],
                [0, 1, 2, 3, 4, 3, 4, 5, 9, 7, 8],
                [2, 0, 8],
                2,
                [True, False],
                padding=2,
            ),
        ),
        (
            N_("a replay longer than one tile of 8"),
            _replay_case([3, 14], [20, 21, 22] + list(range(30, 44)), [0, 31], 11, [True]),
        ),
        (N_("window 0 pads nothing"), _replay_case([4], [5, 6, 7, 8], [6], 0, [True])),
    ]


@st.composite
def _replay_strategy(draw: st.DrawFn) -> ReplayCase:
    lengths = draw(st.lists(st.integers(0, 12), min_size=1, max_size=3))
    positions, replay_start = [], []
    for n in lengths:
        first = draw(st.integers(0, 10))
        own = list(range(first, first + n))
        positions += own
        replay_start.append(draw(st.sampled_from([0, 1, first + n + 1] + [p for p in own if p])))
    window = draw(st.sampled_from((0, 1, 2, 3, 5, 8)))
    groups = draw(st.integers(1, 3))
    cacheable = draw(st.lists(st.booleans(), min_size=groups, max_size=groups))
    padding = draw(st.integers(0, 3))
    return _replay_case(lengths, positions, replay_start, window, cacheable, padding)


def launch_replay_kernel(kernel, case: ReplayCase) -> list[int]:
    """Run a learner's replay kernel as ``slotmap.pad_replayed_slots`` runs the production
    one, on grid ``(num_groups, num_reqs)``, with the slot mappings in the middle of a
    poisoned buffer. Returns the whole buffer (guard, slot mappings, guard) as a list.

    The kernel takes ``pad_replayed_slots``'s arguments: ``num_tokens, query_start_loc_ptr,
    positions_ptr, replay_start_ptr, window, prefix_cacheable_ptr, slot_mappings_ptr,
    slot_mappings_stride``, then ``PAD_ID`` and ``TILE_BLOCK_SIZE``.
    """
    groups, width = len(case.slots), len(case.slots[0])
    buffer = torch.full(
        (GUARD + groups * width + GUARD,), POISON, dtype=torch.int32, device=DEVICE
    )
    slots = buffer[GUARD : GUARD + groups * width].view(groups, width)
    slots.copy_(torch.tensor(case.slots, dtype=torch.int32))
    num_reqs = len(case.query_start_loc) - 1
    if num_reqs:
        qsl = torch.tensor(case.query_start_loc, dtype=torch.int32, device=DEVICE)
        # Positions carry GUARD zeros past the last token, as in every slot-mapping exercise.
        positions = torch.tensor(case.positions + [0] * GUARD, dtype=torch.int64, device=DEVICE)
        starts = torch.tensor(case.replay_start, dtype=torch.int32, device=DEVICE)
        cacheable = torch.tensor(
            [int(c) for c in case.prefix_cacheable], dtype=torch.int32, device=DEVICE
        )
        checked_launch(
            kernel,
            (groups, num_reqs),
            case.num_tokens,
            qsl,
            positions,
            starts,
            case.window,
            cacheable,
            slots,
            width,
            PAD_ID=PAD_SLOT_ID,
            TILE_BLOCK_SIZE=TILE,
        )
    return buffer.cpu().tolist()


def diagnose_replay(case: ReplayCase, expected: list[list[int]], got: list[list[int]]):
    """The first entry of ``got`` that differs from ``expected``, explained (None: all agree)."""
    for g, (want_row, got_row) in enumerate(zip(expected, got, strict=True)):
        for t, (want, value) in enumerate(zip(want_row, got_row, strict=True)):
            if want == value:
                continue
            before = case.slots[g][t]
            if t >= case.num_tokens:
                why = _(
                    "entry [{g}, {t}] lies in the padding tail, past the last token ({value}): "
                    "the "
                    "replay padding must not touch it"
                ).format(g=g, t=t, value=case.num_tokens - 1)
                return Wrong(why, want, value, REPLAY_HINT)
            q = case.request_of(t)
            p, first, window = case.positions[t], case.replay_start[q], case.window
            token = f"token {t} (request {q}, position {p})"
            replay = f"replay_start {first}, window {window}"
            if want == PAD_SLOT_ID and value == before:
                why = _(
                    "{token} is replayed ({replay}: positions {first}..{value}) in group {g}, "
                    "which "
                    "is prefix-cacheable: its slot must become PAD_ID so the shared cached block "
                    "is "
                    "not rewritten, but it kept slot {before}"
                ).format(
                    token=token,
                    replay=replay,
                    first=first,
                    value=first + window - 1,
                    g=g,
                    before=before,
                )
            elif value == PAD_SLOT_ID and want == before:
                if not case.prefix_cacheable[g]:
                    why = _(
                        "group {g} is not prefix-cacheable: every slot of it must be kept, but "
                        "{token} "
                        "got PAD_ID"
                    ).format(g=g, token=token)
                elif first <= 0:
                    why = _(
                        "request {q} has replay_start {first}, which means no replay: {token} "
                        "must keep "
                        "slot {before}, got PAD_ID"
                    ).format(q=q, first=first, token=token, before=before)
                elif p == first + window:
                    why = _(
                        "position {p} = replay_start {first} + window {window} is the first "
                        "position "
                        "after the replay (the range [{first}, {value}) is half-open): {token} "
                        "must keep "
                        "slot {before}, got PAD_ID"
                    ).format(
                        p=p,
                        first=first,
                        window=window,
                        value=first + window,
                        token=token,
                        before=before,
                    )
                elif p < first:
                    why = _(
                        "position {p} comes before replay_start {first}: {token} is not replayed "
                        "and "
                        "must keep slot {before}, got PAD_ID"
                    ).format(p=p, first=first, token=token, before=before)
                else:
                    why = _(
                        "position {p} lies past the replayed positions {first}..{value}: {token} "
                        "must "
                        "keep slot {before}, got PAD_ID"
                    ).format(
                        p=p, first=first, value=first + window - 1, token=token, before=before
                    )
            else:
                why = _(
                    "entry [{g}, {t}] ({token}) changed from {before} to {value}: the replay "
                    "padding "
                    "only ever writes PAD_ID ({pad_slot_id})"
                ).format(
                    g=g, t=t, token=token, before=before, value=value, pad_slot_id=PAD_SLOT_ID
                )
            return Wrong(why, want, value, REPLAY_HINT)
    return None


def judge_replay(kernel, case: ReplayCase) -> None:
    if not hasattr(kernel, "__getitem__"):
        raise Wrong(
            _("expected a @triton.jit kernel, got {name}").format(name=type(kernel).__name__),
            hint=_("Pass the kernel itself: check('06.replay_padding', replay_kernel)."),
        )
    buffer = launch_replay_kernel(kernel, case)
    groups, width = len(case.slots), len(case.slots[0])
    for index, value in enumerate(buffer[:GUARD]):
        if value != POISON:
            raise Wrong(
                _("a lane wrote {value} before slot_mappings (at {value2})").format(
                    value=value, value2=index - GUARD
                ),
                POISON,
                value,
                _("Store only where the lane is replayed (mask=...)."),
            )
    for index, value in enumerate(buffer[GUARD + groups * width :]):
        if value != POISON:
            raise Wrong(
                _(
                    "a lane wrote {value} past the end of slot_mappings ({groups} x {entrys}, at "
                    "{value2})"
                ).format(
                    value=value,
                    groups=groups,
                    entrys=plural(width, N_("entry")),
                    value2=groups * width + index,
                ),
                POISON,
                value,
                _("Store only where the lane is replayed (mask=...)."),
            )
    flat = buffer[GUARD : GUARD + groups * width]
    got = [flat[g * width : (g + 1) * width] for g in range(groups)]
    wrong = diagnose_replay(case, case.expected(), got)
    if wrong is not None:
        raise wrong


register(
    Exercise(
        id="06.replay_padding",
        title=N_("the lanes replay padding sets to PAD_ID"),
        cases=_replay_cases,
        strategy=_replay_strategy,
        judge=judge_replay,
        hint=REPLAY_HINT,
        max_examples=30,
    )
)


# ---------------------------------------------------------------------------------------------
# 06.group_switches
# ---------------------------------------------------------------------------------------------
STALE = 4242  # a slot an earlier step left in the persistent output buffer
SWITCHES_HINT = N_(
    "Pad first from query_start_loc[num_reqs] (the real count), not from num_tokens. "
    "A token gets PAD_ID when its group is disabled or its request is a dummy "
    "(idx_mapping -1), before any row is read; otherwise token_slot on the row "
    "idx_mapping[q], with the kernel block (kernel_block_size) as its block_size, "
    "the allocation block as its kv_cache_block_size, and the CP arguments only if "
    "the group is sharded."
)


@dataclass
class GroupCase:
    """One group's batch: requests, their rows (-1: dummy) and the group's switches."""

    lengths: list[int]
    positions: list[int]  # the real tokens' positions
    rows: list[int]  # idx_mapping
    table: list[list[int]]  # the group's table; its last row (and all of it if disabled) poison
    kv_cache_block_size: int  # the allocation block
    kernel_block_size: int  # the block the table counts (token_slot's block_size)
    enabled: bool
    sharded: bool
    cp_world_size: int = 1
    cp_rank: int = 0
    cp_interleave: int = 1
    padded: int = 0  # num_tokens - the real count: a padded host count
    tail: int = 2  # max_num_tokens - num_tokens

    @property
    def real(self) -> int:
        return sum(self.lengths)

    @property
    def num_tokens(self) -> int:
        return self.real + self.padded

    @property
    def max_num_tokens(self) -> int:
        return self.num_tokens + self.tail

    def query_start_loc(self) -> list[int]:
        starts = [0]
        for n in self.lengths:
            starts.append(starts[-1] + n)
        return starts

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        qsl = torch.tensor(self.query_start_loc(), dtype=torch.int32, device=DEVICE)
        # Positions past the real tokens (the padded count's) are zeros, as graph padding's.
        positions = self.positions + [0] * self.padded
        pos = torch.tensor(positions, dtype=torch.int64, device=DEVICE)
        table = torch.tensor(self.table, dtype=torch.int32, device=DEVICE)
        rows = torch.tensor(self.rows, dtype=torch.int32, device=DEVICE)
        return qsl, pos, table, rows

    def cp(self) -> dict:
        return dict(
            cp_world_size=self.cp_world_size,
            cp_rank=self.cp_rank,
            cp_interleave=self.cp_interleave,
        )

    def expected(self) -> list[int]:
        qsl, pos, table, rows = self.tensors()
        return slot_mappings_oracle(
            qsl,
            pos,
            [table],
            [self.kv_cache_block_size],
            idx_mapping=rows,
            num_tokens=self.num_tokens,
            max_num_tokens=self.max_num_tokens,
            kernel_block_sizes=[self.kernel_block_size],
            slot_mapping_enabled=[self.enabled],
            dcp_sharded=[self.sharded],
            **self.cp(),
        )[0].tolist()

    def request_of(self, token: int) -> int:
        starts = self.query_start_loc()
        return next(q for q in range(len(self.lengths)) if token < starts[q + 1])

    def __str__(self) -> str:
        return (
            f"query_start_loc={self.query_start_loc()}, positions={self.positions}, "
            f"idx_mapping={self.rows}, block_table={self.table}, "
            f"kv_cache_block_size={self.kv_cache_block_size}, "
            f"kernel_block_size={self.kernel_block_size}, enabled={self.enabled}, "
            f"sharded={self.sharded}, cp_world_size={self.cp_world_size}, "
            f"cp_rank={self.cp_rank}, cp_interleave={self.cp_interleave}, "
            f"num_tokens={self.num_tokens}, max_num_tokens={self.max_num_tokens} "
            f"(out holds {STALE} everywhere before the call)"
        )


def _poison_row(width: int, r: int) -> list[int]:
    # Entries no slot comes from: a slot read from here is negative.
    return [-1000 - 100 * r - b for b in range(width)]


def _group_case(
    lengths: list[int],
    firsts: list[int | None],  # None: a dummy request (positions 0, idx_mapping -1)
    kv_cache_block_size: int,
    kernel_block_size: int,
    *,
    enabled: bool = True,
    sharded: bool = True,
    cp: tuple[int, int, int] = (1, 0, 1),
    padded: int = 0,
    seed: int = 0,
) -> GroupCase:
    positions, rows = [], []
    real_rows = iter(range(len(lengths)))
    for n, first in zip(lengths, firsts, strict=True):
        positions += [0] * n if first is None else list(range(first, first + n))
        rows.append(-1 if first is None else next(real_rows))
    world = cp[0] if sharded else 1
    top = max(positions, default=0)
    kv = kv_cache_block_size
    width = (top // (kv * world) + 1) * (kv // kernel_block_size)
    used = len(lengths)
    if enabled:
        table = [
            [(7 * (r * width + b) + 3 + seed) % 97 for b in range(width)] for r in range(used)
        ]
    else:
        table = [_poison_row(width, r) for r in range(used)]
    table.append(_poison_row(width, used))  # table[-1]: what a dummy must not read
    return GroupCase(
        lengths,
        positions,
        rows,
        table,
        kv_cache_block_size,
        kernel_block_size,
        enabled,
        sharded,
        *cp,
        padded=padded,
    )


def _switch_cases() -> list[tuple[str, GroupCase]]:
    return [
        (N_("one request, one plain group"), _group_case([5], [2], 4, 4)),
        (
            N_("a disabled (Mamba) group: PAD_ID everywhere, its poisoned table unread"),
            _group_case([3, 2], [0, 6], 4, 4, enabled=False),
        ),
        (
            N_("a dummy request (idx_mapping -1) between two real ones"),
            _group_case([2, 3, 2], [4, None, 9], 4, 4),
        ),
        (
            N_("CP 2, a sharded full-attention group, rank 1"),
            _group_case([8], [0], 4, 4, cp=(2, 1, 1)),
        ),
        (
            N_("CP 2, an unsharded sliding-window group: every position maps here"),
            _group_case([6], [1], 4, 4, sharded=False, cp=(2, 1, 1)),
        ),
        (
            N_("kernel blocks of 2 inside allocation blocks of 4, CP 2 with interleave 4"),
            _group_case([9], [3], 4, 2, cp=(2, 0, 4)),
        ),
        (
            N_("chunked prefill: num_tokens 8 is a padded count, the buffer holds stale slots"),
            _group_case([2, 3], [5, 0], 4, 4, padded=3),
        ),
    ]


@st.composite
def _switch_strategy(draw: st.DrawFn) -> GroupCase:
    kv = draw(st.sampled_from((2, 4, 6, 8)))
    kernel = draw(st.sampled_from([d for d in range(1, kv + 1) if kv % d == 0]))
    world = draw(st.sampled_from((1, 2, 3)))
    interleave = draw(st.sampled_from([d for d in (1, 2, 4) if kv % d == 0]))
    lengths = draw(st.lists(st.integers(0, 9), min_size=1, max_size=3))
    firsts = [draw(st.one_of(st.none(), st.integers(0, 20))) for _ in lengths]
    return _group_case(
        lengths,
        firsts,
        kv,
        kernel,
        enabled=draw(st.booleans()),
        sharded=draw(st.booleans()),
        cp=(world, draw(st.integers(0, world - 1)), interleave),
        padded=draw(st.sampled_from((0, 0, 1, 4))),
        seed=draw(st.integers(0, 9)),
    )


def diagnose_switches(case: GroupCase, expected: list[int], got: list[int]) -> Wrong | None:
    """The first entry of ``got`` that differs from ``expected``, explained (None: all agree)."""
    for t, (want, value) in enumerate(zip(expected, got, strict=True)):
        if want == value:
            continue
        if t >= case.real:
            if value == STALE and t < case.num_tokens:
                why = _(
                    "entry {t} lies past the real tokens (query_start_loc[num_reqs] = {real}) but "
                    "before num_tokens = {num_tokens}, a padded host count: it still holds "
                    "{stale}, "
                    "an earlier step's slot. The padding must start at the real count, or the "
                    "padding tokens' KV lands in live slots"
                ).format(t=t, real=case.real, num_tokens=case.num_tokens, stale=STALE)
            else:
                why = _("entry {t} is padding, past the batch's {real} real tokens").format(
                    t=t, real=case.real
                )
            return Wrong(why, want, value, SWITCHES_HINT)
        q = case.request_of(t)
        p = case.positions[t]
        token = f"token {t} (request {q}, position {p})"
        if not case.enabled:
            why = _(
                "the group is disabled (slot_mapping_enabled False): every token gets PAD_ID and "
                "its table is never read, but {token} got {value}"
            ).format(token=token, value=value)
            if value < 0 and value != PAD_SLOT_ID:
                why += _(" (a slot from the group's poisoned table)")
        elif case.rows[q] < 0:
            why = _(
                "request {q} is a dummy request (idx_mapping[{q}] = -1): it owns no blocks and "
                "no row may be read for it, but {token} got {value}"
            ).format(q=q, token=token, value=value)
            if value < 0 and value != PAD_SLOT_ID:
                why += _(" (read from table[-1], the table's last row, poisoned here)")
        elif value == STALE:
            why = _(
                "{token} was never written: it still holds {stale}, an earlier step's slot"
            ).format(token=token, stale=STALE)
        else:
            row = case.table[case.rows[q]]
            kernel, kv = case.kernel_block_size, case.kv_cache_block_size
            all_cp = token_slot(p, row, kernel, kv_cache_block_size=kv, **case.cp())
            on_kernel = token_slot(p, row, kernel, kv_cache_block_size=kernel, **case.cp())
            if not case.sharded and case.cp_world_size > 1 and value == all_cp:
                why = _(
                    "the group is not sharded (dcp_sharded False): context parallelism does not "
                    "split its cache, so {token} maps here by the plain formula, slot {want}; got "
                    "{value}, CP's answer for rank {cp_rank}"
                ).format(token=token, want=want, value=value, cp_rank=case.cp_rank)
            elif case.sharded and kernel != kv and value == on_kernel:
                why = _(
                    "CP splits allocation blocks of {kv} tokens (a virtual block is {kv} * "
                    "{cp_world_size}), not kernel blocks of {kernel}: {token} should get slot "
                    "{want}, got {value}"
                ).format(
                    kv=kv,
                    cp_world_size=case.cp_world_size,
                    kernel=kernel,
                    token=token,
                    want=want,
                    value=value,
                )
            else:
                why = _("{token} should get slot {want}, got {value}").format(
                    token=token, want=want, value=value
                )
        return Wrong(why, want, value, SWITCHES_HINT)
    return None


def judge_switches(candidate: Callable[..., object], case: GroupCase) -> None:
    qsl, positions, table, rows = case.tensors()
    buffer = torch.full(
        (GUARD + case.max_num_tokens + GUARD,), POISON, dtype=torch.int32, device=DEVICE
    )
    out = buffer[GUARD : GUARD + case.max_num_tokens]
    out.fill_(STALE)
    candidate(
        qsl,
        positions,
        table,
        rows,
        out,
        kv_cache_block_size=case.kv_cache_block_size,
        kernel_block_size=case.kernel_block_size,
        enabled=case.enabled,
        sharded=case.sharded,
        num_tokens=case.num_tokens,
        **case.cp(),
    )
    values = buffer.cpu().tolist()
    if any(v != POISON for v in values[:GUARD] + values[GUARD + case.max_num_tokens :]):
        raise Wrong(
            _("your function wrote outside out"), hint=_("Write only out[t] for t in range.")
        )
    wrong = diagnose_switches(case, case.expected(), values[GUARD : GUARD + case.max_num_tokens])
    if wrong is not None:
        raise wrong


register(
    Exercise(
        id="06.group_switches",
        title=N_("one group's slot mapping with production's switches"),
        cases=_switch_cases,
        strategy=_switch_strategy,
        judge=judge_switches,
        hint=SWITCHES_HINT,
        max_examples=40,
    )
)
