"""Lesson 07's exercises: the KV cache end to end.

* ``07.reshape_and_cache``: the learner's ``@triton.jit`` kernel writes each token's key and
  value into its slot of the paged caches (``block = slot // block_size``, ``offset = slot %
  block_size``), skipping PAD tokens. The judge launches it on grid ``(num_tokens,)`` into
  caches poisoned with ``POISON`` and guarded by poisoned rows on both sides, and says where
  each token's key and value really landed ("token 5's key landed in slot 12 instead of 9",
  "a padding token (token 1, slot -1) wrote into the cache").
* ``07.lse_merge``: ``merge(outs, lses) -> (out, lse)`` merges context-parallel ranks'
  partial attentions by log-sum-exp. Partials come from dense attention over the positions
  each rank owns, so the merged result must equal dense attention over the whole sequence;
  the judge names the usual mistakes (a plain average, unnormalised weights, NaN from an
  empty rank, exp overflow, a request with no keys anywhere whose lse is not -inf).
* ``07.paged_read``: the read side of paged decode attention. The learner's kernel walks a
  request's positions a tile at a time (which physical block, which slot, the mask of the
  last partial block); the loads and the online softmax are given. Slots no request attends
  hold other random keys and every load is bounds-checked; the output and lse are compared
  with ``paged_decode_attention_torch`` and a wrong one is explained (a read of slots that
  hold none of the request's positions, another request's row).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import triton
from hypothesis import strategies as st
from torch import Tensor

from slotmap.attention import dense_attention, paged_decode_attention_torch
from slotmap.backend import DEVICE
from slotmap.cp_attention import owned_positions
from slotmap.exercises.cases import checked_launch
from slotmap.exercises.core import Exercise, Wrong, plural, register
from slotmap.i18n import N_, _
from slotmap.layout import PAD_SLOT_ID

POISON = -999.0  # every cache element before the learner's kernel runs
GUARD_ROWS = 3  # poisoned slot-sized rows before and after each cache: writes there are out


# ---------------------------------------------------------------------------------------------
# 07.reshape_and_cache
# ---------------------------------------------------------------------------------------------
# The memory layouts of a cache pair. Production caches are strided: FlashInfer interleaves K
# and V in one [num_blocks, 2, block_size, ...] tensor, and some caches pad each slot's row.
SEPARATE, INTERLEAVED, PADDED = "separate", "interleaved", "padded slots"
LAYOUTS = (SEPARATE, INTERLEAVED, PADDED)
SLOT_PADDING = 3  # elements after each slot's row in the PADDED layout


@dataclass
class CacheCase:
    """Tokens to write: token t goes to slot ``slots[t]`` (PAD_ID: nowhere), into caches laid
    out as ``layout`` says."""

    slots: list[int]
    num_blocks: int
    block_size: int
    num_heads: int
    head_dim: int
    seed: int = 0
    layout: str = SEPARATE

    @property
    def num_tokens(self) -> int:
        return len(self.slots)

    @property
    def row(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def slot_stride(self) -> int:
        return self.row + (SLOT_PADDING if self.layout == PADDED else 0)

    @property
    def block_stride(self) -> int:
        return (2 if self.layout == INTERLEAVED else 1) * self.block_size * self.slot_stride

    @property
    def guard(self) -> int:
        """Poisoned elements before and after each buffer: GUARD_ROWS slots' worth."""
        return GUARD_ROWS * self.slot_stride

    def tensors(self, device: torch.device | str = DEVICE) -> tuple[Tensor, Tensor, Tensor]:
        """(key, value [num_tokens, num_heads, head_dim] float32, slot_mapping int32)."""
        generator = torch.Generator().manual_seed(self.seed)
        shape = (self.num_tokens, self.num_heads, self.head_dim)
        key = torch.randn(shape, generator=generator)
        value = torch.randn(shape, generator=generator)
        slots = torch.tensor(self.slots, dtype=torch.int32)
        return key.to(device), value.to(device), slots.to(device)

    def layout_words(self) -> str:
        """The layout, in words, with its strides ('' for two contiguous caches)."""
        strides = f"block_stride {self.block_stride}, slot_stride {self.slot_stride}"
        if self.layout == INTERLEAVED:
            return _(
                "K and V interleaved in one [num_blocks, 2, block_size, num_heads, head_dim] "
                "tensor, so the cache's block stride is not block_size x slot stride ({strides})"
            ).format(strides=strides)
        if self.layout == PADDED:
            return _(
                "each slot's row padded by {slot_padding} elements, so the slot stride is not "
                "ROW = {row} ({strides})"
            ).format(slot_padding=SLOT_PADDING, row=self.row, strides=strides)
        return ""

    def __str__(self) -> str:
        text = _(
            "slot_mapping={slots}, caches of {blocks} x {slots_each} x {heads} x {dims}"
        ).format(
            slots=self.slots,
            blocks=plural(self.num_blocks, N_("block")),
            slots_each=plural(self.block_size, N_("slot")),
            heads=plural(self.num_heads, N_("head")),
            dims=plural(self.head_dim, N_("dim")),
        )
        return text + (f", {self.layout_words()}" if self.layout != SEPARATE else "")


@dataclass
class CacheStorage:
    """Poisoned buffers and the caches, strided views into them: ``bases[name]`` is
    (buffer index, element of the cache's first slot), for name "key" and "value"."""

    buffers: list[Tensor]
    bases: dict[str, tuple[int, int]]

    def caches(self, case: CacheCase) -> tuple[Tensor, Tensor]:
        shape = (case.num_blocks, case.block_size, case.num_heads, case.head_dim)
        strides = (case.block_stride, case.slot_stride, case.head_dim, 1)
        return tuple(  # type: ignore[return-value]
            self.buffers[b].as_strided(shape, strides, start) for b, start in self.bases.values()
        )


def cache_storage(case: CacheCase, device: torch.device | str = DEVICE) -> CacheStorage:
    """The caches of ``case``'s layout inside poisoned buffers with ``case.guard`` poisoned
    elements on each side."""
    span = case.num_blocks * case.block_stride
    if case.layout == INTERLEAVED:
        buffer = torch.full((case.guard + span + case.guard,), POISON, device=device)
        half = case.block_size * case.slot_stride
        return CacheStorage([buffer], {"key": (0, case.guard), "value": (0, case.guard + half)})
    buffers = [torch.full((case.guard + span + case.guard,), POISON, device=device) for _ in "kv"]
    return CacheStorage(buffers, {"key": (0, case.guard), "value": (1, case.guard)})


def launch_reshape_and_cache_kernel(
    kernel: Any,
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    pad_id: int = PAD_SLOT_ID,
) -> None:
    """Run a learner's kernel as ``slotmap.reshape_and_cache`` runs the library's: grid
    ``(num_tokens,)``, arguments ``key_ptr, value_ptr, key_cache_ptr, value_cache_ptr,
    slot_mapping_ptr, block_size, block_stride, slot_stride, ROW=, ROW_TILE=, PAD_ID=``."""
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    _num_blocks, block_size, num_heads, head_dim = key_cache.shape
    row = num_heads * head_dim
    checked_launch(
        kernel,
        (num_tokens,),
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        block_size,
        key_cache.stride(0),
        key_cache.stride(1),
        ROW=row,
        ROW_TILE=triton.next_power_of_2(row),
        PAD_ID=pad_id,
    )


def _slot_words(slot: int, case: CacheCase) -> str:
    return _("slot {slot} (block {value}, offset {value2})").format(
        slot=slot, value=slot // case.block_size, value2=slot % case.block_size
    )


def where_in_storage(storage: CacheStorage, case: CacheCase, buffer: int, element: int) -> str:
    """Element ``element`` of buffer ``buffer``, in words: which cache, slot and element."""
    span = case.num_blocks * case.block_stride
    relative = element - case.guard
    if relative < 0:
        rows = -(relative // case.slot_stride)
        return _("slot {value}, {rows} before the cache's start (out of bounds)").format(
            value=relative // case.slot_stride, rows=plural(rows, N_("row"))
        )
    if relative >= span:
        last = case.num_blocks * case.block_size - 1
        row = relative // case.slot_stride
        return _("row {row}, past the cache's last slot {last} (out of bounds)").format(
            row=row, last=last
        )
    block, inside = divmod(relative, case.block_stride)
    owner = next(name for name, (b, _) in storage.bases.items() if b == buffer)
    half = case.block_size * case.slot_stride
    if case.layout == INTERLEAVED:
        owner, inside = ("key", inside) if inside < half else ("value", inside - half)
    offset, column = divmod(inside, case.slot_stride)
    slot = _slot_words(block * case.block_size + offset, case)
    if column >= case.row:
        return _("the padding after the {owner} cache's {slot}").format(owner=owner, slot=slot)
    return _("the {owner} cache's {slot}").format(owner=owner, slot=slot) + (
        _(", from its element {column}").format(column=column) if column else ""
    )


def _find_row(storage: CacheStorage, wanted: list[float]) -> tuple[int, int] | None:
    """Where the row ``wanted`` lies in the buffers, element by element: (buffer, element)."""
    values = np.asarray(wanted, dtype=np.float32)
    for index, buffer in enumerate(storage.buffers):
        flat = buffer.cpu().numpy()
        for start in np.flatnonzero(flat[: flat.size - values.size + 1] == values[0]):
            if np.array_equal(flat[start : start + values.size], values):
                return index, int(start)
    return None


def _layout_mistake(case: CacheCase, name: str, slot: int, element: int, base: int) -> str:
    """Which stride a write to ``element`` (``base``: the cache's first slot) left out."""
    block, offset = divmod(slot, case.block_size)
    if case.layout == INTERLEAVED and element == base + slot * case.slot_stride:
        return _(
            ": {layout_words}; the {name} went to slot * slot_stride, as if blocks were "
            "block_size slots apart"
        ).format(layout_words=case.layout_words(), name=name)
    if case.layout == PADDED and element in (
        base + slot * case.row,
        base + block * case.block_stride + offset * case.row,
    ):
        return _(": {layout_words}; the {name}'s slot was counted in rows of ROW").format(
            layout_words=case.layout_words(), name=name
        )
    return ""


def explain_cache(
    case: CacheCase,
    storage: CacheStorage,
    expected: list[Tensor],
    key_rows: Tensor,
    value_rows: Tensor,
    pad_id: int = PAD_SLOT_ID,
) -> Wrong | None:
    """The first invariant that the buffers of ``storage`` break, or None. ``expected``: the
    buffers as the reference writes them; key_rows, value_rows: [num_tokens, row]."""
    rows = {"key": key_rows.tolist(), "value": value_rows.tolist()}
    hint_slot = (
        "A slot names a physical block and an offset in it, as lesson 01's formula builds "
        "it; the cache's own strides, one for blocks and one for slots, say where that "
        "block and offset start: never count them in block_size or ROW."
    )
    # A padding token writes nothing.
    for token, slot in enumerate(case.slots):
        for name in ("key", "value"):
            found = _find_row(storage, rows[name][token]) if slot == pad_id else None
            if found is not None:
                return Wrong(
                    _(
                        "a padding token (token {token}, slot {slot}) wrote into the cache: its "
                        "{name} "
                        "landed in {where_in_storage}"
                    ).format(
                        token=token,
                        slot=slot,
                        name=name,
                        where_in_storage=where_in_storage(storage, case, *found),
                    ),
                    _("nothing written for a PAD token"),
                    _("{name} of token {token} in the cache").format(name=name, token=token),
                    _(
                        "A slot of PAD_ID ({pad_id}) means: write nothing (return early, or mask "
                        "the "
                        "stores). Under context parallelism these are the tokens other ranks "
                        "store."
                    ).format(pad_id=pad_id),
                )
    # Every real token's row is in its slot.
    for token, slot in enumerate(case.slots):
        if slot == pad_id:
            continue
        block, offset = divmod(slot, case.block_size)
        for name, other in (("key", "value"), ("value", "key")):
            buffer, base = storage.bases[name]
            start = base + block * case.block_stride + offset * case.slot_stride
            there = storage.buffers[buffer][start : start + case.row].cpu()
            mine = torch.tensor(rows[name][token])
            if torch.equal(there, mine):
                continue
            where = _slot_words(slot, case)
            if torch.equal(there, torch.tensor(rows[other][token])):
                return Wrong(
                    _(
                        "token {token}'s {other} was written into the {name} cache ({where}): "
                        "key and "
                        "value are swapped"
                    ).format(token=token, other=other, name=name, where=where),
                    _("{name} of token {token}").format(name=name, token=token),
                    _("{other} of token {token}").format(other=other, token=token),
                    _("key_ptr goes to key_cache_ptr, value_ptr to value_cache_ptr."),
                )
            found = _find_row(storage, rows[name][token])
            if found is not None:
                landed = where_in_storage(storage, case, *found)
                layout = ""
                if found[0] == buffer:
                    layout = _layout_mistake(case, name, slot, found[1], base)
                return Wrong(
                    _(
                        "token {token}'s {name} landed in {landed} instead of the {name} cache's "
                        "{where}{layout}"
                    ).format(token=token, name=name, landed=landed, where=where, layout=layout),
                    _("slot {slot}").format(slot=slot),
                    landed,
                    hint_slot,
                )
            if bool((there == POISON).all()):
                return Wrong(
                    _(
                        "token {token}'s {name} was never written: {where} still holds the poison"
                    ).format(token=token, name=name, where=where),
                    _("token {token}'s {name}").format(token=token, name=name),
                    _("poison (-999.0)"),
                    hint_slot,
                )
            wrong = int((there != mine).nonzero()[0, 0])
            head, dim = divmod(wrong, case.head_dim)
            return Wrong(
                _(
                    "{where} holds wrong numbers for token {token}'s {name}: element {wrong} "
                    "(head "
                    "{head}, dim {dim}) is {float:.4g}, expected {float2:.4g}"
                ).format(
                    where=where,
                    token=token,
                    name=name,
                    wrong=wrong,
                    head=head,
                    dim=dim,
                    float=float(there[wrong]),
                    float2=float(mine[wrong]),
                ),
                f"{float(mine[wrong]):.4g}",
                f"{float(there[wrong]):.4g}",
                _(
                    "Copy the token's whole row of num_heads * head_dim elements in order; mask "
                    "the "
                    "lanes >= ROW on the loads and the stores, and never write past the row."
                ),
            )
    # Nothing else changed: no stray writes into other slots, the padding or the guards.
    for index, (got, want) in enumerate(zip(storage.buffers, expected, strict=True)):
        changed = torch.nonzero(got.cpu() != want).flatten().tolist()
        if not changed:
            continue
        first = changed[0]
        near = [e for e in changed if e - first < case.slot_stride]
        return Wrong(
            _(
                "{where_in_storage}, which no token writes, was overwritten ({elements} there): "
                "a store wrote past a token's row"
            ).format(
                where_in_storage=where_in_storage(storage, case, index, first),
                elements=plural(len(near), N_("element")),
            ),
            _("poison (-999.0) everywhere no token writes"),
            _("{elements} changed").format(elements=plural(len(changed), N_("element"))),
            _(
                "A token's row has ROW = num_heads * head_dim = {elements} but the tile has "
                "ROW_TILE = {lanes}: mask lanes >= ROW."
            ).format(
                elements=plural(case.row, N_("element")),
                lanes=plural(triton.next_power_of_2(case.row), N_("lane")),
            ),
        )
    return None


def judge_reshape_and_cache(kernel: Any, case: CacheCase) -> None:
    if not hasattr(kernel, "__getitem__"):
        raise Wrong(
            _("expected a @triton.jit kernel, got {name}").format(name=type(kernel).__name__),
            hint=_("Pass the kernel itself: check('07.reshape_and_cache', your_kernel)."),
        )
    key, value, slots = case.tensors()
    storage = cache_storage(case)
    reference = CacheStorage([b.clone().cpu() for b in storage.buffers], storage.bases)
    for cache, rows in zip(reference.caches(case), (key, value), strict=True):
        for token, slot in enumerate(case.slots):
            if slot != PAD_SLOT_ID:
                cache[slot // case.block_size, slot % case.block_size] = rows[token].cpu()
    launch_reshape_and_cache_kernel(kernel, key, value, *storage.caches(case), slots)
    wrong = explain_cache(
        case,
        storage,
        reference.buffers,
        key.reshape(-1, case.row).cpu(),
        value.reshape(-1, case.row).cpu(),
    )
    if wrong is not None:
        raise wrong


def _cache_cases() -> list[tuple[str, CacheCase]]:
    return [
        (N_("four tokens crossing a block boundary"), CacheCase([9, 10, 11, 12], 4, 4, 2, 4)),
        (N_("a padding token in the middle"), CacheCase([5, -1, 6], 3, 4, 2, 4, seed=1)),
        (
            N_("context parallel: every other token is another rank's (PAD)"),
            CacheCase([-1, 4, -1, 5, -1, 6], 3, 4, 1, 4, seed=2),
        ),
        (
            N_("scattered slots in shuffled blocks"),
            CacheCase([13, 2, 7, 0, 15], 4, 4, 2, 2, seed=3),
        ),
        (
            N_("3 heads of 2: a row of 6 elements, a tile of 8 lanes"),
            CacheCase([1, 2], 2, 2, 3, 2),
        ),
        (N_("the cache's last slot"), CacheCase([0, 11], 3, 4, 1, 3, seed=4)),
        (
            N_(
                "a cache whose block stride is not block_size x slot stride: K and V interleaved "
                "in one tensor"
            ),
            CacheCase([9, 2, -1, 4, 11], 3, 4, 2, 2, seed=5, layout=INTERLEAVED),
        ),
        (
            N_("a cache whose slot stride is not ROW: each slot's row padded"),
            CacheCase([5, 0, 6, -1, 11], 3, 4, 1, 3, seed=6, layout=PADDED),
        ),
        (N_("no tokens at all"), CacheCase([], 2, 4, 1, 2, seed=7)),
    ]


@st.composite
def cache_cases(draw: st.DrawFn) -> CacheCase:
    num_blocks = draw(st.integers(1, 5))
    block_size = draw(st.integers(1, 5))
    num_slots = num_blocks * block_size
    chosen = draw(st.lists(st.integers(0, num_slots - 1), unique=True, max_size=min(8, num_slots)))
    pads = draw(st.lists(st.booleans(), min_size=len(chosen), max_size=len(chosen)))
    slots = [PAD_SLOT_ID if pad else slot for slot, pad in zip(chosen, pads, strict=True)]
    return CacheCase(
        slots,
        num_blocks,
        block_size,
        draw(st.integers(1, 3)),
        draw(st.sampled_from([1, 2, 3, 4, 8])),
        draw(st.integers(0, 1000)),
        draw(st.sampled_from(LAYOUTS)),
    )


CACHE_HINT = N_(
    "A PAD_ID slot writes nothing. Any other slot names a physical block and an "
    "offset in it, as lesson 01's formula builds it; find where that block and "
    "offset start in each cache from the cache's own strides, never from block_size "
    "and ROW: the caches may be strided (K and V interleaved in one tensor, padded "
    "slots)."
)

register(
    Exercise(
        id="07.reshape_and_cache",
        title=N_("write K/V through the slot mapping"),
        cases=_cache_cases,
        strategy=cache_cases,
        judge=judge_reshape_and_cache,
        hint=CACHE_HINT,
        max_examples=25,
    )
)


# ---------------------------------------------------------------------------------------------
# 07.lse_merge
# ---------------------------------------------------------------------------------------------
@dataclass
class MergeCase:
    """Context-parallel partial attentions of one decode batch, to be merged."""

    seq_lens: list[int]
    world_size: int
    interleave: int = 1
    block_size: int = 4
    num_heads: int = 2
    head_dim: int = 4
    query_scale: float = 1.0  # large: large scores and lse (exp(lse) overflows float32)
    seed: int = 0

    def __str__(self) -> str:
        parts = [
            f"seq_lens={self.seq_lens}",
            f"world_size={self.world_size}",
            f"interleave={self.interleave}",
            f"block_size={self.block_size}",
            f"num_heads={self.num_heads}",
            f"head_dim={self.head_dim}",
        ]
        if self.query_scale != 1.0:
            parts.append(f"query_scale={self.query_scale}")
        return ", ".join(parts)

    def owned(self, rank: int) -> list[list[int]]:
        return [
            owned_positions(n, self.world_size, rank, self.interleave, self.block_size)
            for n in self.seq_lens
        ]


def merge_problem(case: MergeCase, device: torch.device | str = DEVICE):
    """(outs [W, R, H, D], lses [W, R, H], dense out, dense lse): each rank's attention over
    the positions it owns, and dense attention over all of them."""
    generator = torch.Generator().manual_seed(case.seed)
    num_reqs, longest = len(case.seq_lens), max(case.seq_lens)
    query = torch.randn(num_reqs, case.num_heads, case.head_dim, generator=generator)
    query = query * case.query_scale
    shape = (num_reqs, longest, case.num_heads, case.head_dim)
    key, value = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    lengths = torch.tensor(case.seq_lens, dtype=torch.int32)
    outs, lses = [], []
    for rank in range(case.world_size):
        owned = case.owned(rank)
        local_key, local_value = torch.zeros_like(key), torch.zeros_like(value)
        for q, positions in enumerate(owned):
            local_key[q, : len(positions)] = key[q, positions]
            local_value[q, : len(positions)] = value[q, positions]
        local_lengths = torch.tensor([len(o) for o in owned], dtype=torch.int32)
        out, lse = dense_attention(query, local_key, local_value, local_lengths)
        outs.append(out)
        lses.append(lse)
    out, lse = dense_attention(query, key, value, lengths)
    return (
        torch.stack(outs).to(device),
        torch.stack(lses).to(device),
        out.to(device),
        lse.to(device),
    )


ATOL = 1e-4
RTOL = 1e-4
MERGE_HINT = N_(
    "Each rank's lse is a log-sum-exp over its own keys; the merged one is over "
    "every key, and each rank's output counts by its share of that total. Subtract "
    "the largest lse before exponentiating."
)


def _close(a: Tensor, b: Tensor) -> Tensor:
    """|a - b| within tolerance where ``b`` is finite; exactly equal where it is not (an
    expected lse of -inf: the tolerance there would be inf and accept anything)."""
    return torch.where(torch.isfinite(b), (a - b).abs() <= ATOL + RTOL * b.abs(), a == b)


def judge_lse_merge(merge: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], case: MergeCase):
    outs, lses, expected_out, expected_lse = merge_problem(case)
    returned = merge(outs.clone(), lses.clone())
    if not (isinstance(returned, tuple | list) and len(returned) == 2):
        raise Wrong(
            _("merge returned {name}, not a pair (out, lse)").format(name=type(returned).__name__),
            _("(out [num_reqs, num_heads, head_dim], lse [num_reqs, num_heads])"),
            repr(returned)[:80],
        )
    out, lse = returned
    for what, got, want in (("out", out, expected_out), ("lse", lse, expected_lse)):
        if not isinstance(got, Tensor) or tuple(got.shape) != tuple(want.shape):
            shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
            raise Wrong(
                _("the merged {what} has shape {shape}, expected {tuple}").format(
                    what=what, shape=shape, tuple=tuple(want.shape)
                ),
                tuple(want.shape),
                shape,
                _("Reduce over the first axis (the ranks) only."),
            )
    out, lse = out.detach().float().cpu(), lse.detach().float().cpu()
    outs_c, lses_c = outs.cpu(), lses.cpu()
    expected_out, expected_lse = expected_out.cpu(), expected_lse.cpu()
    empty = torch.isinf(lses_c) & (lses_c < 0)  # [W, R, H]: rank saw no keys there
    bad_numbers = ~torch.isfinite(out).all(dim=-1)  # [R, H]
    if bad_numbers.any():
        r, h = (int(i) for i in bad_numbers.nonzero()[0])
        empty_ranks = [w for w in range(case.world_size) if empty[w, r, h]]
        if len(empty_ranks) == case.world_size:
            invariant = _(
                "NaN in the merged output at request {r}, head {h}: the request has {positions}, "
                "so every rank's lse is -inf; the merge must give out 0 and lse -inf, not NaN"
            ).format(r=r, h=h, positions=plural(case.seq_lens[r], N_("position")))
            hint = _(
                "-inf - (-inf) is NaN: when the largest lse is -inf, subtract 0 instead (every "
                "weight is then exp(-inf) = 0) and do not divide by a zero sum."
            )
        elif empty_ranks:
            w = empty_ranks[0]
            invariant = _(
                "NaN in the merged output at request {r}, head {h}: rank {w} owns none of the "
                "request's {positions} (lse_{w} = -inf); its weight exp(lse_{w} - lse) must be "
                "0, not NaN"
            ).format(r=r, h=h, w=w, positions=plural(case.seq_lens[r], N_("position")))
            hint = _(
                "-inf - (-inf) is NaN: give empty ranks weight 0 (torch.where on the weights)."
            )
        else:
            invariant = _(
                "non-finite merged output at request {r}, head {h} although every rank has keys "
                "there (lse up to {float:.1f}): exp(lse_r) overflows float32 above ~88"
            ).format(r=r, h=h, float=float(lses_c[:, r, h].max()))
            hint = _("Subtract the largest lse_r before exp: exp(lse_r - max_r lse_r) <= 1.")
        raise Wrong(
            invariant,
            [round(v, 4) for v in expected_out[r, h].tolist()[:4]],
            out[r, h].tolist()[:4],
            hint,
        )
    far = ~_close(out, expected_out).all(dim=-1)
    if far.any():
        r, h = (int(i) for i in far.nonzero()[0])
        difference = float((out[r, h] - expected_out[r, h]).abs().max())
        why = ""
        mean = outs_c[:, r, h].mean(dim=0)
        unnormalised = (torch.exp(lses_c[:, r, h].double())[:, None] * outs_c[:, r, h]).sum(0)
        if torch.allclose(out[r, h], mean, atol=ATOL) and case.world_size > 1:
            why = _(
                " (it is the plain average of the ranks' outputs: each must weigh its share of "
                "the softmax's denominator)"
            )
        elif torch.allclose(out[r, h].double(), unnormalised, atol=ATOL, rtol=RTOL):
            why = _(" (the weights exp(lse_r) are not divided by exp(lse): they do not sum to 1)")
        raise Wrong(
            _(
                "merged output differs from dense attention by {difference:.2g} at request {r}, "
                "head {h}{why}; weights must be exp(lse_r - lse)"
            ).format(difference=difference, r=r, h=h, why=why),
            [round(v, 4) for v in expected_out[r, h].tolist()[:4]],
            [round(v, 4) for v in out[r, h].tolist()[:4]],
            MERGE_HINT,
        )
    far = ~_close(lse, expected_lse)
    if far.any():
        r, h = (int(i) for i in far.nonzero()[0])
        if torch.isneginf(expected_lse[r, h]):
            raise Wrong(
                _(
                    "request {r}, head {h} has no keys on any rank (the request has {positions}, "
                    "every lse_r is -inf): its merged lse must be -inf, got {float}"
                ).format(
                    r=r,
                    h=h,
                    positions=plural(case.seq_lens[r], N_("position")),
                    float=float(lse[r, h]),
                ),
                _("-inf"),
                f"{float(lse[r, h])}",
                _(
                    "An lse of -inf means 'no keys': the weights exp(lse_r) of such a request "
                    "sum to "
                    "0, and log 0 = -inf. Keep that value (the next merge gives the state weight "
                    "0); "
                    "a finite or +inf lse would weigh a state that saw no keys."
                ),
            )
        why = ""
        if float(lse[r, h]) == float(lses_c[:, r, h].max()) and case.world_size > 1:
            why = _(" (it is the largest lse_r: the other ranks' keys add to the sum)")
        raise Wrong(
            _(
                "merged lse at request {r}, head {h} is {float:.4g}, dense attention's is "
                "{float2:.4g}{why}: the merged lse is the log-sum-exp over every rank's keys"
            ).format(r=r, h=h, float=float(lse[r, h]), float2=float(expected_lse[r, h]), why=why),
            f"{float(expected_lse[r, h]):.4g}",
            f"{float(lse[r, h]):.4g}",
            MERGE_HINT,
        )


def _merge_cases() -> list[tuple[str, MergeCase]]:
    return [
        (N_("two ranks, alternate positions"), MergeCase([8], 2)),
        (
            N_("two ranks, unequal shares: rank 0 owns 4 positions, rank 1 owns 2"),
            MergeCase([6], 2, interleave=4, block_size=4, seed=1),
        ),
        (N_("one rank: the merge is the identity"), MergeCase([5, 3], 1, seed=2)),
        (
            N_("a short request: ranks 1 and 2 own none of its positions (lse = -inf)"),
            MergeCase([2, 13], 3, interleave=2, block_size=4, seed=3),
        ),
        (
            N_("large scores: lse around 100, exp(lse) overflows float32"),
            MergeCase([7, 12], 2, query_scale=40.0, seed=4),
        ),
        (
            N_("a padding request of length 0: every rank's lse is -inf"),
            MergeCase([3, 0], 2, seed=5),
        ),
    ]


@st.composite
def merge_cases(draw: st.DrawFn) -> MergeCase:
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    return MergeCase(
        seq_lens=draw(st.lists(st.integers(0, 20), min_size=1, max_size=3)),
        world_size=draw(st.integers(1, 4)),
        interleave=draw(st.sampled_from([d for d in (1, 2, 4, 8) if block_size % d == 0])),
        block_size=block_size,
        num_heads=draw(st.integers(1, 2)),
        head_dim=draw(st.sampled_from([1, 2, 4, 8])),
        query_scale=draw(st.sampled_from([0.5, 1.0, 1.0, 30.0])),
        seed=draw(st.integers(0, 1000)),
    )


register(
    Exercise(
        id="07.lse_merge",
        title=N_("merge partial attentions by log-sum-exp"),
        cases=_merge_cases,
        strategy=merge_cases,
        judge=judge_lse_merge,
        hint=MERGE_HINT,
        max_examples=40,
    )
)


# ---------------------------------------------------------------------------------------------
# 07.paged_read
# ---------------------------------------------------------------------------------------------
@dataclass
class ReadCase:
    """A decode batch on a paged cache: request q attends to its positions 0..seq_lens[q]-1,
    stored in distinct shuffled physical blocks; every other slot holds other random keys
    and values (finite: an output that read them can be matched to the mistake)."""

    seq_lens: list[int]
    block_size: int
    num_heads: int = 2
    head_dim: int = 4
    spare_blocks: int = 2  # physical blocks no request uses
    seed: int = 0

    def __str__(self) -> str:
        return (
            f"seq_lens={self.seq_lens}, block_size={self.block_size}, "
            f"num_heads={self.num_heads}, head_dim={self.head_dim}"
        )

    def blocks_of(self, q: int) -> int:
        return -(-self.seq_lens[q] // self.block_size)

    def tensors(self, device: torch.device | str = DEVICE):
        """(query, key_cache, value_cache, block_table int32, seq_lens int32) on ``device``."""
        generator = torch.Generator().manual_seed(self.seed)
        needed = [self.blocks_of(q) for q in range(len(self.seq_lens))]
        num_blocks = sum(needed) + self.spare_blocks
        pool = torch.randperm(num_blocks, generator=generator).tolist()
        width = max(max(needed, default=1), 1)
        rows, used = [], 0
        for n in needed:
            rows.append(pool[used : used + n] + [0] * (width - n))
            used += n
        shape = (num_blocks, self.block_size, self.num_heads, self.head_dim)
        key_cache = torch.randn(shape, generator=generator) * 3  # unattended: other keys
        value_cache = torch.randn(shape, generator=generator) * 3
        for q, length in enumerate(self.seq_lens):
            for j in range(length):
                block, offset = rows[q][j // self.block_size], j % self.block_size
                key_cache[block, offset] = torch.randn(shape[2:], generator=generator)
                value_cache[block, offset] = torch.randn(shape[2:], generator=generator)
        query = torch.randn(len(self.seq_lens), self.num_heads, self.head_dim, generator=generator)
        block_table = torch.tensor(rows, dtype=torch.int32)
        seq_lens = torch.tensor(self.seq_lens, dtype=torch.int32)
        return tuple(t.to(device) for t in (query, key_cache, value_cache, block_table, seq_lens))


READ_TILE = 8  # positions per tile in the learner's kernel


def launch_paged_read_kernel(kernel: Any, query, key_cache, value_cache, block_table, seq_lens):
    """The learner's kernel on grid ``(num_reqs, num_heads)``, every load bounds-checked, as
    ``paged_decode_attention`` launches its own. Returns (out, lse)."""
    num_reqs, num_heads, head_dim = query.shape
    out = torch.full((num_reqs, num_heads, head_dim), POISON, device=query.device)
    lse = torch.full((num_reqs, num_heads), POISON, device=query.device)
    checked_launch(
        kernel,
        (num_reqs, num_heads),
        out,
        lse,
        query,
        key_cache,
        value_cache,
        block_table,
        block_table.shape[1],
        seq_lens,
        1.0 / head_dim**0.5,
        key_cache.shape[1],
        key_cache.stride(1),
        HEAD_DIM=head_dim,
        HEAD_DIM_TILE=triton.next_power_of_2(head_dim),
        TILE=READ_TILE,
    )
    return out, lse


READ_HINT = N_(
    "Lane i of a tile is position tile_start + i of request req: valid only below "
    "seq_len. Its logical block (the position's block number) picks an entry of row "
    "req of the block table (rows are block_table_stride entries apart); the slot is "
    "that physical block's first slot plus the position's offset inside its block, "
    "as the slot mapping wrote it."
)


def _explain_read(case: ReadCase, tensors, out: Tensor, r: int, h: int, kernel: Any) -> str:
    """Which well-known wrong read gives this output, in words ("" if none does)."""
    query, key_cache, value_cache, table, lens = tensors
    if r > 0:
        first_row = table[:1].expand_as(table).contiguous()
        o, _lse = paged_decode_attention_torch(
            query, key_cache, value_cache, first_row, lens, validate=False
        )
        if bool(_close(out[r, h], o[r, h].cpu()).all()):
            return _(
                ": request {r} read its keys through row 0 of the block table, not row {r}"
            ).format(r=r)
    # Redraw the slots no request attends: an output that moves read one of them.
    attended = torch.zeros(key_cache.shape[:2], dtype=torch.bool)
    for q, length in enumerate(case.seq_lens):
        for j in range(length):
            attended[int(table[q, j // case.block_size]), j % case.block_size] = True
    generator = torch.Generator().manual_seed(case.seed + 1)
    redrawn = []
    for cache in (key_cache, value_cache):
        other = torch.randn(cache.shape, generator=generator).to(cache.device) * 3
        redrawn.append(torch.where(attended[..., None, None].to(cache.device), cache, other))
    moved, _moved_lse = launch_paged_read_kernel(kernel, query, *redrawn, table, lens)
    if not bool(_close(moved[r, h].cpu(), out[r, h]).all()):
        return _(
            ": it reads slots that hold none of the request's positions 0..{value} (its "
            "output moves when only those slots change): a lane at or past seq_len left "
            "unmasked, or a lane's slot computed wrong"
        ).format(value=case.seq_lens[r] - 1)
    return ""


def judge_paged_read(kernel: Any, case: ReadCase) -> None:
    if not hasattr(kernel, "__getitem__"):
        raise Wrong(
            _("expected a @triton.jit kernel, got {name}").format(name=type(kernel).__name__),
            hint=_("Pass the kernel itself: check('07.paged_read', your_kernel)."),
        )
    tensors = case.tensors()
    out, lse = launch_paged_read_kernel(kernel, *tensors)
    want_out, want_lse = paged_decode_attention_torch(*tensors)
    out, lse, want_out, want_lse = (t.cpu() for t in (out, lse, want_out, want_lse))
    bad = ~(_close(out, want_out).all(dim=-1) & _close(lse, want_lse))
    if not bad.any():
        return
    r, h = (int(i) for i in bad.nonzero()[0])
    length = case.seq_lens[r]
    why = _explain_read(case, tensors, out, r, h, kernel)
    blocks = case.blocks_of(r)
    raise Wrong(
        _(
            "request {r}, head {h}: the output differs from attention over positions "
            "0..{value} ({positions} in {blocks} of {block_size}){why}"
        ).format(
            r=r,
            h=h,
            value=length - 1,
            positions=plural(length, N_("position")),
            blocks=plural(blocks, N_("block")),
            block_size=case.block_size,
            why=why,
        ),
        _("out {value}, lse {float:.4g}").format(
            value=[round(v, 4) for v in want_out[r, h].tolist()[:4]], float=float(want_lse[r, h])
        ),
        _("out {value}, lse {float:.4g}").format(
            value=[round(v, 4) for v in out[r, h].tolist()[:4]], float=float(lse[r, h])
        ),
        READ_HINT,
    )


def _read_cases() -> list[tuple[str, ReadCase]]:
    return [
        (N_("one request of 6 in blocks of 4: a partial last block"), ReadCase([6], 4)),
        (N_("two requests in shuffled blocks"), ReadCase([5, 9], 4, seed=1)),
        (N_("blocks of 3: a tile of 8 spans three blocks"), ReadCase([7, 3], 3, seed=2)),
        (N_("full blocks only"), ReadCase([8, 4], 4, seed=3)),
        (N_("a request of length 0: out 0, lse -inf"), ReadCase([0, 5], 2, seed=4)),
        (
            N_("3 heads of 3 dims, one position"),
            ReadCase([1, 6], 4, num_heads=3, head_dim=3, seed=5),
        ),
        (N_("a long request: 100 positions in blocks of 16"), ReadCase([100, 3], 16, seed=6)),
    ]


@st.composite
def read_cases(draw: st.DrawFn) -> ReadCase:
    return ReadCase(
        seq_lens=draw(st.lists(st.integers(0, 12), min_size=1, max_size=3)),
        block_size=draw(st.sampled_from([1, 2, 3, 4, 5, 8])),
        num_heads=draw(st.integers(1, 2)),
        head_dim=draw(st.sampled_from([1, 2, 3, 4])),
        spare_blocks=draw(st.integers(1, 2)),  # a cache of 0 blocks is not one
        seed=draw(st.integers(0, 1000)),
    )


register(
    Exercise(
        id="07.paged_read",
        title=N_("paged decode attention: walk the block table"),
        cases=_read_cases,
        strategy=read_cases,
        judge=judge_paged_read,
        hint=READ_HINT,
        max_examples=15,
    )
)
