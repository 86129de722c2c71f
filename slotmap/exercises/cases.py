"""Batches for the slot-mapping exercises, and a judge that says in words what went wrong.

``SlotCase`` is one batch in plain Python lists (printable, shrinkable); ``slot_cases`` draws
random valid ones; ``judge_slot_mapping`` runs a learner's launcher on a case with a poisoned,
guarded output and compares it with the reference, reporting the first broken invariant:
a write outside the output, an element never written, a padding entry that is not PAD_ID,
two tokens that collide in one slot, or simply a wrong slot. ``checked_launch`` runs a
learner's kernel with every load checked against the tensors it was given.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor

from slotmap.backend import DEVICE
from slotmap.exercises.core import Wrong, plural
from slotmap.i18n import N_, _, ngettext
from slotmap.kernels.slot_mapping import slot_mapping_args
from slotmap.layout import PAD_SLOT_ID
from slotmap.reference import slot_mapping_oracle

POISON = -999  # what every output element holds before the learner's code runs
GUARD = 64  # poisoned elements on each side of the output: writes there are out of bounds
SLOT_OF_HINT = N_(
    "slot = block_table_row[position // block_size] * block_size + position % block_size"
)
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLOAT32_EXACT = 2**24  # a float32 holds every integer of at most this size exactly


def wrap_int32(value: int) -> int:
    """``value`` wrapped into int32, as int32 arithmetic wraps."""
    return (value - INT32_MIN) % 2**32 + INT32_MIN


def float32_round(value: int) -> int:
    """``value`` after a round trip through float32."""
    return int(torch.tensor(value, dtype=torch.float64).to(torch.float32).item())


def max_block_number_of(block_size: int) -> int:
    """The largest physical block whose every slot fits the int32 slot mapping."""
    return (INT32_MAX - (block_size - 1)) // block_size


def float32_block_mistake(expected: int, got: int, block_size: int) -> str:
    """Why ``got`` is wrong when the physical block of slot ``expected`` went through float32
    (a float32 ``tl.gather`` or a cast): words naming the block, else ''."""
    if expected < 0 or block_size < 1:
        return ""
    block, offset = divmod(expected, block_size)
    rounded = float32_round(block)
    if block <= FLOAT32_EXACT or rounded == block:
        return ""
    # Back in int32 the rounded block wraps (the interpreter) or saturates (a GPU).
    backs = {wrap_int32(rounded), max(INT32_MIN, min(INT32_MAX, rounded))}
    slots = {wrap_int32(back * block_size + offset) for back in backs}
    slots.add(wrap_int32(float32_round(expected)))  # the slot itself through float32
    if got not in slots:
        return ""
    return _(
        "physical block {block} (block numbers above 2^24 occur: a table holds blocks up "
        "to 2^31 - 1) came back as {rounded}: a float32 holds integers exactly only up "
        "to 2^24 = {float32_exact}"
    ).format(block=block, rounded=rounded, float32_exact=FLOAT32_EXACT)


FLOAT32_BLOCK_HINT = N_(
    "Keep block numbers int32 from the block-table load to the store: a float32 "
    "window (or cast) rounds every block number above 2^24. Gather int32 values, or "
    "halves that are each exact in float32 (exercise 03.float_gather)."
)


@dataclass
class SlotCase:
    """One batch: request q owns tokens [query_start_loc[q], query_start_loc[q + 1])."""

    query_start_loc: list[int]
    positions: list[int]
    block_table: list[list[int]]
    block_size: int
    max_num_tokens: int | None = None  # None: no padding tail
    options: dict[str, Any] = field(default_factory=dict)  # circular, cp_world_size, ...

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1]

    @property
    def padded_length(self) -> int:
        return self.max_num_tokens if self.max_num_tokens is not None else self.num_tokens

    def request_of(self, token: int) -> int:
        return next(
            q for q in range(len(self.query_start_loc) - 1) if token < self.query_start_loc[q + 1]
        )

    def tensors(self, device: torch.device | str = DEVICE) -> tuple[Tensor, Tensor, Tensor]:
        """(query_start_loc int32, positions int64, block_table int32) on ``device``.

        Positions carry GUARD zeros past the last token: a lane that reads past its request
        finds position 0, a valid-looking token, so a missing mask shows up as a stray write
        rather than as a crash.
        """
        qsl = torch.tensor(self.query_start_loc, dtype=torch.int32, device=device)
        guarded = torch.tensor(self.positions + [0] * GUARD, dtype=torch.int64, device=device)
        table = torch.tensor(self.block_table, dtype=torch.int32, device=device)
        return qsl, guarded[: len(self.positions)], table

    def __str__(self) -> str:
        parts = [
            f"query_start_loc={self.query_start_loc}",
            f"positions={self.positions}",
            f"block_table={self.block_table}",
            f"block_size={self.block_size}",
        ]
        if self.max_num_tokens is not None and self.max_num_tokens != self.num_tokens:
            parts.append(f"max_num_tokens={self.max_num_tokens}")
        parts += [f"{key}={value}" for key, value in self.options.items()]
        return ", ".join(parts)


def explain_slot(
    position: int, row: list[int], block_size: int, got: int, row_name: str = "block_table_row"
) -> Wrong:
    """Why ``got`` is not the slot of ``position`` in a block-table row (``row_name`` in the
    report): which part of the formula went wrong."""
    block, offset = divmod(position, block_size)
    physical = row[block]
    expected = physical * block_size + offset
    got_block, got_offset = divmod(got, block_size)
    where = _(
        "position {position} is in logical block {block} = {position} // {block_size}, "
        "whose physical block is {row_name}[{block}] = {physical}"
    ).format(
        position=position, block=block, block_size=block_size, row_name=row_name, physical=physical
    )
    swapped = position % block_size
    if swapped < len(row) and got == row[swapped] * block_size + block:
        invariant = _(
            "position {position} landed in slot {got} = {row_name}[{position} % "
            "{block_size}] * {block_size} + {position} // {block_size}: // and % are swapped "
            "({where}, at block offset {offset} = {position} % {block_size})"
        ).format(
            position=position,
            got=got,
            row_name=row_name,
            block_size=block_size,
            where=where,
            offset=offset,
        )
        hint = _(
            "position // block_size is the logical block (it indexes the block table); "
            "position % block_size is the offset inside the block (it is added)."
        )
        return Wrong(
            invariant,
            _("slot {expected}").format(expected=expected),
            _("slot {got}").format(got=got),
            hint,
        )
    if got_block != physical:
        if got_block == block and got_block not in row:
            invariant = _(
                "position {position} landed in physical block {got_block}, which is its logical "
                "block: the block table was never consulted ({where})"
            ).format(position=position, got_block=got_block, where=where)
            hint = _(
                "The logical block indexes the block table: {row_name}[logical block]."
            ).format(row_name=row_name)
        elif block + 1 < len(row) and got_block == row[block + 1] != physical:
            invariant = _(
                "position {position} landed in physical block {got_block} = {row_name}[{value}]: "
                "the logical block index is off by one ({where})"
            ).format(
                position=position,
                got_block=got_block,
                row_name=row_name,
                value=block + 1,
                where=where,
            )
            hint = _("Logical blocks count from 0: position // block_size, with no + 1.")
        elif got_block in row:
            entry = row.index(got_block)
            invariant = _(
                "position {position} landed in physical block {got_block} = {row_name}[{entry}], "
                "the entry of logical block {entry}, not of its own ({where})"
            ).format(
                position=position, got_block=got_block, row_name=row_name, entry=entry, where=where
            )
            hint = _("A position's physical block is {row_name}[position // block_size].").format(
                row_name=row_name
            )
        else:
            invariant = _(
                "position {position} landed in slot {got}, inside physical block {got_block}, "
                "but {where}"
            ).format(position=position, got=got, got_block=got_block, where=where)
            hint = SLOT_OF_HINT
    else:
        invariant = _(
            "position {position} landed at block offset {got_offset} inside its block, "
            "expected block offset {offset} = {position} % {block_size}"
        ).format(position=position, got_offset=got_offset, offset=offset, block_size=block_size)
        hint = _("The block offset is the remainder of position divided by block_size.")
    return Wrong(
        invariant,
        _("slot {expected}").format(expected=expected),
        _("slot {got}").format(got=got),
        hint,
    )


def _named_slot_mistake(case: SlotCase, token: int, expected: int, got: int) -> Wrong | None:
    """Which part of the paging formula a wrong slot got wrong (another request's row, an
    off-by-one block index, a block table never consulted, a wrong block offset, an offset
    outside the block), when the case is plain paging."""
    position, request = case.positions[token], case.request_of(token)
    row, block_size = case.block_table[request], case.block_size
    if case.options or not 0 <= position < len(row) * block_size:
        return None
    if row[position // block_size] * block_size + position % block_size != expected:
        return None
    block, offset = divmod(position, block_size)
    physical = row[block]
    extra = got - physical * block_size
    for q, other in enumerate(case.block_table):
        if q != request and block < len(other) and got == other[block] * block_size + offset:
            return Wrong(
                _(
                    "position {position} of request {request} landed in slot {got} = "
                    "block_table[{q}][{block}] * {block_size} + {offset}: it read request {q}'s "
                    "row, "
                    "not its own"
                ).format(
                    position=position,
                    request=request,
                    got=got,
                    q=q,
                    block=block,
                    block_size=block_size,
                    offset=offset,
                ),
                _("slot {expected}").format(expected=expected),
                _("slot {got}").format(got=got),
                _(
                    "Each request reads its own row: block_table_ptr + request * "
                    "block_table_stride."
                ),
            )
    named = explain_slot(position, row, block_size, got, f"block_table[{request}]")
    if named.hint != SLOT_OF_HINT:
        return named
    if not 0 <= extra < block_size:
        return Wrong(
            _(
                "position {position} landed in slot {got} = block_table[{request}][{block}] * "
                "{block_size} + {extra}: an offset of {extra} is outside a block of {block_size} "
                "slots (the offset is {position} % {block_size} = {offset})"
            ).format(
                position=position,
                got=got,
                request=request,
                block=block,
                block_size=block_size,
                extra=extra,
                offset=offset,
            ),
            _("slot {expected}").format(expected=expected),
            _("slot {got}").format(got=got),
            _("The block offset is the remainder of position divided by block_size."),
        )
    return None


def guarded_output(length: int, device: torch.device | str = DEVICE) -> tuple[Tensor, Tensor]:
    """(buffer, out): ``out`` is the poisoned middle of a poisoned buffer."""
    buffer = torch.full((GUARD + length + GUARD,), POISON, dtype=torch.int32, device=device)
    return buffer, buffer[GUARD : GUARD + length]


def _short(values: Sequence[int], focus: int, width: int = 12) -> str:
    """A list, cut around index ``focus`` when it is long."""
    if len(values) <= 2 * width:
        return str(list(values))
    start = max(0, min(focus - width // 2, len(values) - width))
    inner = ", ".join(str(v) for v in values[start : start + width])
    return f"[{'..., ' if start else ''}{inner}{', ...' if start + width < len(values) else ''}]"


def explain_slot_mapping(
    case: SlotCase, expected: list[int], buffer: list[int], pad_id: int = PAD_SLOT_ID
) -> Wrong | None:
    """The first invariant that ``buffer`` (guard + output + guard) breaks, or None."""
    got = buffer[GUARD:-GUARD]
    length = len(got)
    for index, value in enumerate(buffer[:GUARD]):
        if value != POISON:
            return Wrong(
                _("a lane wrote slot {value} before the output (at out[{value2}])").format(
                    value=value, value2=index - GUARD
                ),
                POISON,
                value,
                _("Mask every store: tl.store(ptr + offsets, value, mask=...)."),
                kind="lane",
            )
    for index, value in enumerate(buffer[GUARD + length :]):
        if value == pad_id:  # no request's lane computes PAD_ID: the padding program wrote it
            return Wrong(
                _(
                    "the padding program wrote PAD_ID {value} at out[{value2}], past the end of "
                    "the "
                    "output ({entrys})"
                ).format(value=value, value2=length + index, entrys=plural(length, N_("entry"))),
                POISON,
                value,
                _(
                    "The padding program's last tile runs past max_num_tokens too: mask its store "
                    "(mask = offsets < max_num_tokens)."
                ),
                kind="pad_program",
            )
        if value != POISON:
            return Wrong(
                _(
                    "a lane past the request's end wrote slot {value} at out[{value2}], past the "
                    "end "
                    "of the output ({entrys})"
                ).format(value=value, value2=length + index, entrys=plural(length, N_("entry"))),
                POISON,
                value,
                _(
                    "Lanes of the last tile that lie past the request's end must be masked off "
                    "(mask "
                    "= offsets < end)."
                ),
                kind="lane",
            )
    for token, value in enumerate(got):
        if value == POISON:
            if token < case.num_tokens:
                where = _("token {token} (request {request_of})").format(
                    token=token, request_of=case.request_of(token)
                )
                hint = _("Every token of every request needs a slot: check the tile loop's range.")
            else:
                where = _("padding entry {token} (past the last real token {value})").format(
                    token=token, value=case.num_tokens - 1
                )
                hint = _(
                    "Entries [num_tokens, max_num_tokens) must hold PAD_ID (in a kernel: the "
                    "padding "
                    "program's job): a captured graph reads the whole fixed-size output."
                )
                if len(case.positions) > token:
                    where += _(
                        "; positions holds {entrys} but only the first num_tokens = {num_tokens} "
                        "are "
                        "this batch's"
                    ).format(
                        entrys=plural(len(case.positions), N_("entry")), num_tokens=case.num_tokens
                    )
                    hint = _(
                        "The padding starts at num_tokens, not at len(positions): positions may "
                        "be "
                        "longer than the batch (an engine's buffer of max_num_tokens)."
                    )
            return Wrong(
                _("slot_mapping[{token}] was never written: {where}").format(
                    token=token, where=where
                ),
                _short(expected, token),
                _short(got, token),
                hint,
                kind="unwritten",
            )
    for token in range(case.num_tokens, length):
        if got[token] != pad_id:
            return Wrong(
                _("padding entry {token} holds {got} instead of PAD_ID {pad_id}").format(
                    token=token, got=got[token], pad_id=pad_id
                ),
                _short(expected, token),
                _short(got, token),
                _("Only [0, num_tokens) are real tokens; the rest must be PAD_ID."),
                kind="padding",
            )
    owner: dict[int, int] = {}
    for token in range(case.num_tokens):
        slot = got[token]
        if slot == pad_id or expected[token] == pad_id:
            continue
        if slot in owner and expected[owner[slot]] != expected[token]:
            first = owner[slot]
            invariant = _("tokens {first} and {token} collide in slot {slot}").format(
                first=first, token=token, slot=slot
            )
            hint = _(
                "Two different positions can never share a slot: check the block index and the "
                "offset inside the block."
            )
            for t in (t for t in (first, token) if expected[t] != slot):
                rounded = float32_block_mistake(expected[t], slot, case.block_size)
                named = _named_slot_mistake(case, t, expected[t], slot)
                if rounded:
                    invariant, hint = (
                        _("{invariant}: token {t}'s {rounded}").format(
                            invariant=invariant, t=t, rounded=rounded
                        ),
                        FLOAT32_BLOCK_HINT,
                    )
                    break
                if named is not None:
                    invariant, hint = f"{invariant}: {named.invariant}", named.hint
                    break
            return Wrong(invariant, _short(expected, token), _short(got, token), hint, kind="slot")
        owner[slot] = token
    for token in range(case.num_tokens):
        if got[token] != expected[token]:
            invariant = _(
                "token {token} (request {request_of}, position {value}) should be in slot "
                "{expected}, got {got}"
            ).format(
                token=token,
                request_of=case.request_of(token),
                value=case.positions[token],
                expected=expected[token],
                got=got[token],
            )
            rounded = float32_block_mistake(expected[token], got[token], case.block_size)
            if rounded:
                return Wrong(
                    f"{invariant}: {rounded}",
                    _short(expected, token),
                    _short(got, token),
                    FLOAT32_BLOCK_HINT,
                    kind="slot",
                )
            named = _named_slot_mistake(case, token, expected[token], got[token])
            return Wrong(
                invariant + (f": {named.invariant}" if named else ""),
                _short(expected, token),
                _short(got, token),
                named.hint if named else "",
                kind="slot",
            )
    return None


def judge_slot_mapping(
    launcher: Callable[..., Any],
    case: SlotCase,
    *,
    reference: Callable[..., Tensor] = slot_mapping_oracle,
    **extra: Any,
) -> None:
    """Run ``launcher`` like the library's ``compute_slot_mapping`` and raise ``Wrong`` on a
    mismatch. The launcher gets ``num_tokens``, ``max_num_tokens``, ``out`` (poisoned) and
    the case's options, and must fill ``out``."""
    qsl, positions, table = case.tensors()
    options = dict(case.options, **extra)
    counts = {"num_tokens": case.num_tokens, "max_num_tokens": case.padded_length}
    expected = reference(
        qsl.cpu(), positions.cpu(), table.cpu(), case.block_size, **counts, **case.options
    ).tolist()
    buffer, out = guarded_output(case.padded_length, positions.device)
    returned = launcher(qsl, positions, table, case.block_size, **counts, out=out, **options)
    if isinstance(returned, Tensor) and returned.data_ptr() != out.data_ptr():
        raise Wrong(
            _("the launcher returned a new tensor instead of writing into `out`"),
            hint=_("Launch the kernel with out as its slot_mapping_ptr and return out."),
        )
    wrong = explain_slot_mapping(
        case, expected, buffer.tolist(), options.get("pad_id", PAD_SLOT_ID)
    )
    if wrong is not None:
        raise wrong


@dataclass(frozen=True)
class _Extent:
    """A tensor a kernel was launched with: the bytes it may read, by argument name."""

    name: str
    start: int
    end: int
    itemsize: int
    dtype: str

    @property
    def entries(self) -> int:
        return (self.end - self.start) // self.itemsize


def _extents(kernel: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[_Extent]:
    names: list[str] = []
    for holder in (kernel, getattr(kernel, "kernel", None)):  # a KernelVariant-like wrapper
        names = list(getattr(holder, "arg_names", None) or names)
    named = list(zip(names, args, strict=False)) + list(kwargs.items())
    named += [(f"argument {i}", a) for i, a in enumerate(args) if i >= len(names)]
    extents = []
    for name, value in named:
        if isinstance(value, Tensor) and value.numel():
            shape = zip(value.shape, value.stride(), strict=True)
            size = value.element_size()
            end = value.data_ptr() + size * (1 + sum((n - 1) * stride for n, stride in shape))
            dtype = str(value.dtype).replace("torch.", "")
            extents.append(_Extent(name, value.data_ptr(), end, size, dtype))
    return extents


def _kernel_line() -> tuple[int, str]:
    """The line of the learner's kernel that is running: the innermost frame outside Triton
    and this module."""
    import linecache

    import triton

    skip = (str(Path(triton.__file__).parent), __file__)
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    if frame is None:
        return 0, ""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return frame.f_lineno, line


def _describe_read(extents: list[_Extent], address: int, lane: str, lanes: int) -> tuple[str, int]:
    below = [e for e in extents if e.start <= address]
    near = max(below, key=lambda e: e.start) if below else min(extents, key=lambda e: e.start)
    index = (address - near.start) // near.itemsize
    lineno, code = _kernel_line()
    where = _(" at line {lineno}: {code}").format(lineno=lineno, code=code) if lineno else ""
    more = (
        _(" (and {lanes})").format(lanes=plural(lanes - 1, N_("other lane"))) if lanes > 1 else ""
    )
    entries = ngettext("{n} {dtype} entry", "{n} {dtype} entries", near.entries).format(
        n=near.entries, dtype=near.dtype
    )
    text = _(
        "lane {lane}{more} of the load{where} reads {name}[{index}], outside {name}'s "
        "{entries} [0, {count}) (address {address:#x}, valid {start:#x}..{last:#x})"
    ).format(
        lane=lane,
        more=more,
        where=where,
        name=near.name,
        index=index,
        entries=entries,
        count=near.entries,
        address=address,
        start=near.start,
        last=near.end - 1,
    )
    return text, index


OUT_OF_BOUNDS_HINT = N_(
    "Mask every load whose lanes can point outside its tensor: tl.load(ptr + index, "
    "mask=index < limit, other=0). The interpreter reads whatever lies there; a GPU "
    "or NPU faults or reads garbage."
)


COMPILED_KERNEL = (
    "your kernel was compiled for a GPU, not run by Triton's interpreter: its @triton.jit "
    "cell ran before `import slotmap.course` chose the interpreter for this machine (it "
    "sets TRITON_INTERPRET=1, which @triton.jit reads when it decorates), so Triton looked "
    "for a GPU driver and found none ('0 active drivers')"
)
COMPILED_KERNEL_HINT = N_(
    "Restart the kernel and run the notebook from the top: the first code cell "
    "imports slotmap.course before triton; then run your kernel's cell, then the "
    "check."
)


def _compiled_for_a_device(kernel: Any) -> bool:
    """A kernel decorated while Triton's interpreter was off (a ``JITFunction``, which
    compiles for a device) although this machine runs kernels in the interpreter."""
    from triton.runtime.jit import JITFunction

    seen = 0
    while kernel is not None and seen < 4:  # a KernelVariant-like or autotuner wrapper
        if isinstance(kernel, JITFunction):
            return True
        kernel = getattr(kernel, "kernel", None) or getattr(kernel, "fn", None)
        seen += 1
    return False


def checked_launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)``, with every unmasked lane of every load checked
    against the tensors passed in: a read outside them raises ``Wrong`` naming the lane, the
    line, the tensor, its valid range and the address.

    Only under Triton's interpreter (on a GPU the kernel runs compiled); masked-off lanes are
    never checked, and an out-of-bounds lane is masked off so that nothing is read there.
    """
    # The interpreter's own loads, wrapped, rather than triton-viz's sanitizer: triton-viz 3.0
    # fails at import with triton 3.8 and 3.9, which the CPU stack needs for numpy 2.
    from slotmap.backend import BACKEND

    if not BACKEND.interpreted:
        kernel[grid](*args, **kwargs)
        return
    if _compiled_for_a_device(kernel):
        raise Wrong(COMPILED_KERNEL, hint=COMPILED_KERNEL_HINT)
    import numpy as np
    from triton.runtime import interpreter

    extents = _extents(kernel, args, kwargs)
    builder = interpreter.interpreter_builder
    original = builder.create_masked_load
    found: list[tuple[str, int]] = []

    def load(ptrs: Any, mask: Any, other: Any, *rest: Any) -> Any:
        size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        addresses = ptrs.data.astype(np.uint64)
        live = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        inside = np.zeros(addresses.shape, dtype=bool)
        for extent in extents:
            inside |= (addresses >= extent.start) & (addresses + size <= extent.end)
        bad = live & ~inside
        if bad.any():
            if not found:
                flat = int(np.flatnonzero(bad)[0])
                spot = np.unravel_index(flat, addresses.shape)
                lane = str(spot[0]) if len(spot) == 1 else str(tuple(int(i) for i in spot))
                address = int(addresses.reshape(-1)[flat])
                found.append(_describe_read(extents, address, lane, int(bad.sum())))
            mask = interpreter.TensorHandle(live & inside, mask.dtype)
        return original(ptrs, mask, other, *rest)

    builder.create_masked_load = load
    try:
        kernel[grid](*args, **kwargs)
    finally:
        del builder.create_masked_load
    if found:
        text, index = found[0]
        wrong = Wrong(text, _("every unmasked lane inside its tensor"), "", OUT_OF_BOUNDS_HINT)
        wrong.kind, wrong.read_index = "out_of_bounds", index
        raise wrong


def launch_learner_kernel(
    kernel: Any,
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    block_size: int,
    *,
    num_tokens: int,
    max_num_tokens: int,
    out: Tensor,
    tile_size: int,
    pad_id: int = PAD_SLOT_ID,
    spare_entry: bool = False,
    **constants: Any,
) -> Tensor:
    """Run a learner's kernel as ``compute_slot_mapping`` runs the production kernel, on grid
    ``(num_reqs + 1,)``: program q < num_reqs handles request q, the last one the padding tail.

    The kernel takes the production kernel's runtime arguments (``num_tokens, max_num_tokens,
    query_start_loc_ptr, positions_ptr, block_table_ptr, block_table_stride, block_size,
    slot_mapping_ptr``), then ``PAD_ID=pad_id``, ``TILE_BLOCK_SIZE=tile_size`` and
    ``constants`` (its other ``tl.constexpr``). Writes and returns ``out``.
    ``spare_entry``: launch with one more query_start_loc entry, repeating num_tokens, so that
    a kernel that forgets the padding program treats the last program as an empty request
    (and is caught for the unwritten padding) instead of reading past the end of
    query_start_loc.
    """
    num_reqs = query_start_loc.numel() - 1
    if spare_entry:
        query_start_loc = torch.cat([query_start_loc, query_start_loc[-1:]])
    args = slot_mapping_args(
        num_tokens, max_num_tokens, query_start_loc, positions, block_table, block_size, out
    )
    checked_launch(
        kernel, (num_reqs + 1,), *args, PAD_ID=pad_id, TILE_BLOCK_SIZE=tile_size, **constants
    )
    return out


@st.composite
def slot_cases(
    draw: st.DrawFn,
    *,
    block_sizes: Sequence[int] = (1, 2, 3, 4, 5, 8, 16),
    max_requests: int = 3,
    max_length: int = 24,
    padding: bool = True,
    circular: bool = False,
    max_block_number: int = 63,
    large_blocks: bool = False,
) -> SlotCase:
    """A random valid batch: each request a run of consecutive positions (a prefill chunk or
    a decode step) starting anywhere, distinct physical blocks, optionally a padding tail.
    ``circular``: ring-buffer requests of one block, with padded (negative) positions.
    ``large_blocks``: some batches draw block numbers from the whole range whose slots fit
    int32 (most of them above 2^24), as an engine's table can hold."""
    block_size = draw(st.sampled_from(block_sizes))
    lengths = draw(st.lists(st.integers(0, max_length), min_size=1, max_size=max_requests))
    query_start_loc = [0]
    positions: list[int] = []
    rows: list[int] = []
    for length in lengths:
        low = -length - 2 if circular else 0
        first = draw(st.integers(low, low + 3 * block_size + 8))
        positions += list(range(first, first + length))
        query_start_loc.append(query_start_loc[-1] + length)
        last = first + length - 1
        rows.append(1 if circular else max(1, last // block_size + 1 + draw(st.integers(0, 1))))
    if large_blocks and draw(st.booleans()):
        largest = st.integers(0, max_block_number_of(block_size))
        pool = draw(st.lists(largest, min_size=sum(rows), max_size=sum(rows), unique=True))
    else:
        pool = draw(st.permutations(range(max(max_block_number + 1, sum(rows)))))
    table_width = max(rows)
    block_table = []
    used = 0
    for row in rows:
        entries = list(pool[used : used + row])
        used += row
        block_table.append(entries + [0] * (table_width - row))
    extra = draw(st.integers(0, 5)) if padding else 0
    max_num_tokens = query_start_loc[-1] + extra if extra else None
    options = {"circular": True} if circular else {}
    return SlotCase(query_start_loc, positions, block_table, block_size, max_num_tokens, options)
