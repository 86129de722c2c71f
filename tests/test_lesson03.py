"""Lesson 03 (the bounded-window gather): its checks reject known-wrong answers and accept the
solutions; its figures show what the kernel did; its widgets re-run the kernel on a change."""

from __future__ import annotations

import re
import time

import pytest
import torch
import triton
import triton.language as tl
from lesson_helpers import (
    ROOT,
    TRITON_IMPORTS,
    KernelVariant,
    code_cells,
    failure,
    import_source,
    solution_module,
)

import slotmap
from slotmap.exercises import Wrong, get_exercise, lesson03, run_check
from slotmap.exercises.cases import SlotCase
from slotmap.layout import cdiv, next_power_of_2

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from slotmap.viz import window as window_viz  # noqa: E402


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    return solution_module(tmp_path_factory.mktemp("solution03"), "03_window_gather.ipynb")


# ---------------------------------------------------------------------------------------------
# 03.window_size
# ---------------------------------------------------------------------------------------------
def test_window_size_solution_passes(solution):
    assert run_check(get_exercise("03.window_size"), solution.block_table_window_size).passed


def test_tighter_window_is_accepted():
    # The smallest power of two that holds every tile: tighter than production for block 1.
    def tight(tile: int, block: int) -> int:
        return next_power_of_2((block - 1 + tile - 1) // block + 1)

    assert run_check(get_exercise("03.window_size"), tight).passed


def test_window_without_its_plus_one_is_rejected():
    found = failure("03.window_size", lambda t, b: next_power_of_2(cdiv(t, b)))
    assert "starts at offset 3 of a block touches 3 logical blocks" in found.invariant
    assert "holds only 2 entries" in found.invariant
    # The production kernel really ran with the small window and got a slot wrong.
    assert "the production kernel launched with it gives position" in found.invariant
    assert (found.expected, found.got) == ("4", "2")


def test_a_window_of_one_entry_is_one_entry():
    found = failure("03.window_size", lambda t, b: 1)
    assert "the window holds only 1 entry;" in found.invariant
    # The hint points to the worst-placed tile; it does not give the formula.
    assert "on the last offset of a block (3) touches the most" in found.hint
    assert "cdiv" not in found.hint and "+ 1" not in found.hint


def test_window_not_a_power_of_two_is_rejected():
    found = failure("03.window_size", lambda t, b: cdiv(t, b) + 1)
    assert "not a power of two" in found.invariant


def test_oversized_window_is_rejected():
    found = failure("03.window_size", lambda t, b: 2 * next_power_of_2(cdiv(t, b) + 1))
    assert "larger than needed" in found.invariant


# ---------------------------------------------------------------------------------------------
# 03.window_kernel: one kernel with the known mistakes as constexpr switches
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens"])
def _variant_kernel(
    num_tokens,
    max_num_tokens,
    query_start_loc_ptr,
    positions_ptr,
    block_table_ptr,
    block_table_stride,
    block_size,
    slot_mapping_ptr,
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
    BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
    SENTINEL: tl.constexpr = 2147483647,  # what masked lanes offer to tl.min
    STORE_MASK: tl.constexpr = True,
    HALF_WINDOW: tl.constexpr = False,  # the window without its +1 (cdiv a power of two)
    WINDOW_MASK: tl.constexpr = True,  # mask the window load at the row's end
    FIRST_LANE_BASE: tl.constexpr = False,  # the window starts at the first lane's block
    FLOAT_WINDOW: tl.constexpr = False,  # gather a float32 copy of the window (lesson 03's trap)
    BASE_SHIFT: tl.constexpr = 0,  # the window is loaded this many blocks past its base
):
    req_idx = tl.program_id(0)
    if req_idx == tl.num_programs(0) - 1:
        for tile_start in range(num_tokens, max_num_tokens, TILE_BLOCK_SIZE):
            offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
            tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=offsets < max_num_tokens)
        return
    start_idx = tl.load(query_start_loc_ptr + req_idx)
    end_idx = tl.load(query_start_loc_ptr + req_idx + 1)
    row_ptr = block_table_ptr + req_idx * block_table_stride
    for tile_start in range(start_idx, end_idx, TILE_BLOCK_SIZE):
        offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offsets < end_idx
        pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
        block_indices = pos // block_size
        slot_offsets = pos % block_size
        if FIRST_LANE_BASE:
            base = tl.sum(tl.where(offsets == tile_start, block_indices, 0), axis=0)
        else:
            base = tl.min(tl.where(mask, block_indices, SENTINEL), axis=0)
        if HALF_WINDOW:
            window_indices = base + tl.arange(0, BLOCK_TABLE_WINDOW_SIZE // 2)
            size = BLOCK_TABLE_WINDOW_SIZE // 2
        else:
            window_indices = base + BASE_SHIFT + tl.arange(0, BLOCK_TABLE_WINDOW_SIZE)
            size = BLOCK_TABLE_WINDOW_SIZE
        if WINDOW_MASK:
            window = tl.load(
                row_ptr + window_indices, mask=window_indices < block_table_stride, other=0
            )
        else:
            window = tl.load(row_ptr + window_indices)
        relative = block_indices - base
        # Clamp like production does, so a wrong window gives wrong slots rather than a crash.
        relative = tl.where(mask & (relative >= 0) & (relative < size), relative, 0)
        if FLOAT_WINDOW:
            physical = tl.gather(window.to(tl.float32), relative, 0).to(tl.int32)
        else:
            physical = tl.gather(window, relative, 0)
        slots = physical * block_size + slot_offsets
        if STORE_MASK:
            tl.store(slot_mapping_ptr + offsets, slots, mask=mask)
        else:
            tl.store(slot_mapping_ptr + offsets, slots)


def Variant(**constants) -> KernelVariant:  # noqa: N802 - reads like the class it returns
    return KernelVariant(_variant_kernel, **constants)


def test_window_kernel_solution_passes(solution):
    result = run_check(get_exercise("03.window_kernel"), solution.window_kernel)
    assert result.passed, result.report()


def test_window_kernel_variant_harness_is_right():
    # The switches' defaults are a correct kernel: the failures below come from the switch.
    assert run_check(get_exercise("03.window_kernel"), Variant()).passed


def test_window_without_its_plus_one_in_the_kernel_is_rejected():
    found = failure("03.window_kernel", Variant(HALF_WINDOW=True))
    assert (
        found.case_name
        == "named case 'a tile that starts mid-block (3 blocks for 8 tokens: the +1)'"
    )
    assert "should be in slot" in found.invariant


def test_dropped_sentinel_is_rejected():
    found = failure("03.window_kernel", Variant(SENTINEL=0))
    assert "masked lanes" in found.case_name
    # The window starts at entry 0 instead of 14: once reported as two tokens colliding.
    assert found.invariant.startswith(
        "token 8 (request 0, position 28) should be in slot 88, got 60: its physical block 30 "
        "is block_table[0][0], as if the window started at logical block 0: the tile's last "
        "5 lanes lie past the request's end"
    )
    assert "a masked lane offers INT32_MAX to tl.min" in found.invariant


def test_missing_store_mask_is_rejected():
    found = failure("03.window_kernel", Variant(STORE_MASK=False))
    assert "past the request's end" in found.invariant or "padding entry" in found.invariant


@pytest.mark.skipif(
    not slotmap.BACKEND.interpreted, reason="the bounds check wraps the interpreter's loads"
)
def test_unmasked_window_load_is_rejected_naming_lane_and_address():
    found = failure("03.window_kernel", Variant(WINDOW_MASK=False))
    # Row [5, 2] holds 2 entries; a window of 4 from block 0 reads entries 2 and 3 past it.
    assert found.case_name == "named case 'one request, one tile starting on a block boundary'"
    assert found.invariant.startswith("lane 2 (and 1 other lane) of the load at line ")
    assert "window = tl.load(row_ptr + window_indices)" in found.invariant
    assert "reads block_table_ptr[2], outside block_table_ptr's 2 int32 entries [0, 2)" in (
        found.invariant
    )
    assert re.search(r"address 0x[0-9a-f]+, valid 0x[0-9a-f]+\.\.0x[0-9a-f]+", found.invariant)
    assert "mask=" in found.hint


def test_window_from_the_first_lane_is_rejected():
    found = failure("03.window_kernel", Variant(FIRST_LANE_BASE=True))
    assert "out of order inside a tile" in found.case_name
    assert "the window starts at the first lane's block, but the tile's positions are out of " in (
        found.invariant
    )


def test_a_float32_window_is_rejected_on_block_numbers_above_2_to_the_24():
    # Passed every check while the cases numbered their blocks below 2^24.
    found = failure("03.window_kernel", Variant(FLOAT_WINDOW=True))
    assert found.case_name == (
        "named case 'block numbers above 2^24: blocks of 4 numbered up to 2^29 - 1'"
    )
    assert "physical block 536870911 (block numbers above 2^24 occur" in found.invariant
    assert "came back as 536870912: a float32 holds integers exactly only up to 2^24" in (
        found.invariant
    )
    assert "Keep block numbers int32" in found.hint


def test_a_window_loaded_a_block_late_is_named_as_the_window():
    # Once reported as "off by one ... no + 1" or "the block table was never consulted".
    found = failure("03.window_kernel", Variant(BASE_SHIFT=1))
    assert "never consulted" not in found.invariant and "no + 1" not in found.hint
    assert "the window's base (where it is loaded) or the lane's relative index is wrong" in (
        found.invariant
    )
    assert "which logical block does the window's first entry hold" in found.hint


def test_gather_outside_the_window_is_reported_in_words():
    @triton.jit
    def unclamped(
        num_tokens,
        max_num_tokens,
        query_start_loc_ptr,
        positions_ptr,
        block_table_ptr,
        block_table_stride,
        block_size,
        slot_mapping_ptr,
        PAD_ID: tl.constexpr,
        TILE_BLOCK_SIZE: tl.constexpr,
        BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
    ):
        req_idx = tl.program_id(0)
        if req_idx == tl.num_programs(0) - 1:
            return
        start_idx = tl.load(query_start_loc_ptr + req_idx)
        end_idx = tl.load(query_start_loc_ptr + req_idx + 1)
        for tile_start in range(start_idx, end_idx, TILE_BLOCK_SIZE):
            offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
            mask = offsets < end_idx
            pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
            blocks = pos // block_size
            entries = tl.arange(0, BLOCK_TABLE_WINDOW_SIZE)
            window = tl.load(
                block_table_ptr + req_idx * block_table_stride + entries,
                mask=entries < block_table_stride,
                other=0,
            )
            physical = tl.gather(window, blocks, 0)  # relative to entry 0: no base at all
            tl.store(
                slot_mapping_ptr + offsets, physical * block_size + pos % block_size, mask=mask
            )

    if not slotmap.BACKEND.interpreted:
        pytest.skip("only the interpreter raises on an out-of-bounds gather")
    found = failure("03.window_kernel", unclamped)
    assert "gathered outside the window" in found.invariant


def test_not_a_kernel_is_rejected():
    found = failure("03.window_kernel", lambda *args: None)
    assert "expected a @triton.jit kernel" in found.invariant


# ---------------------------------------------------------------------------------------------
# 03.break_window
# ---------------------------------------------------------------------------------------------
def test_break_window_solution_passes(solution):
    assert run_check(get_exercise("03.break_window"), solution.window_breaker).passed


def test_break_window_solution_passes_in_chinese_too(solution):
    """The judge tells the window's refusal apart by its class: its words are translated."""
    from slotmap import i18n

    i18n.use("zh")
    try:
        assert run_check(get_exercise("03.break_window"), solution.window_breaker).passed
    finally:
        i18n.use("en")


def test_contiguous_input_does_not_break_the_window():
    contiguous = SlotCase([0, 12], list(range(3, 15)), [[5, 2, 9, 4]], 4)
    found = failure("03.break_window", contiguous)
    assert "the launcher accepted your input" in found.invariant


def test_input_invalid_in_another_way_is_rejected():
    outside_the_row = SlotCase([0, 2], [0, 26], [[3, 1, 4, 9, 5]], 4)
    found = failure("03.break_window", lambda: outside_the_row)
    assert "invalid for another reason" in found.invariant
    assert "outside the block-table row" in found.invariant


def test_window_break_that_hides_behind_equal_blocks_is_rejected():
    same_block_everywhere = SlotCase([0, 2], [0, 16], [[3, 3, 3, 3, 3]], 4)
    found = failure("03.break_window", same_block_everywhere)
    assert "still gets every slot right" in found.invariant


def test_break_window_wants_a_slot_case():
    found = failure("03.break_window", lambda: [0, 16])
    assert "expected a SlotCase" in found.invariant


# ---------------------------------------------------------------------------------------------
# Figures: drawn from the kernel's run, content checked against the references
# ---------------------------------------------------------------------------------------------
def patches_with(ax, gid: str) -> list:
    return [p for p in ax.patches if p.get_gid() == gid]


@pytest.mark.parametrize(
    ("tile", "block", "first", "tokens"),
    [
        pytest.param(8, 4, 5, 22, id="mid-block-b4"),
        pytest.param(16, 3, 7, 40, id="b3-past-row"),
        pytest.param(4, 1, 0, 9, id="b1"),
    ],
)
def test_window_figure_shows_what_the_kernel_loaded(tile, block, first, tokens):
    fig = window_viz.draw_windows(tile, block, first, tokens)
    positions = list(range(first, first + tokens))
    qsl = torch.tensor([0, tokens], dtype=torch.int32)
    bases = slotmap.window_bases_oracle(qsl, torch.tensor(positions), block, tile_size=tile)[0]
    window = slotmap.window_size(tile, block)
    axes = fig.axes
    assert len(axes) == 1 + len(bases)
    assert len(patches_with(axes[0], "token")) == tokens
    assert [t.get_text() for t in axes[0].texts[:tokens]] == [str(p) for p in positions]
    for tile_index, base in enumerate(bases):
        ax = axes[1 + tile_index]
        tile_positions = positions[tile_index * tile : (tile_index + 1) * tile]
        needed = sorted({p // block for p in tile_positions})
        picked = patches_with(ax, "picked")
        # One coloured entry per logical block the tile needs, at that entry.
        assert sorted(int(p.get_x()) for p in picked) == needed
        frame = patches_with(ax, "window")[0]
        assert round(frame.get_x() + 0.08) == base
        row_length = len(patches_with(ax, "picked")) + len(patches_with(ax, "entry"))
        past = patches_with(ax, "window-past-row")
        assert bool(past) == (base + window > row_length)
    assert "kernel's slots = reference" in fig._suptitle.get_text()
    assert "recorded window bases = window_bases_oracle" in fig._suptitle.get_text()


@pytest.mark.parametrize("mode", window_viz.FAILURE_MODES)
def test_failure_figure_highlights_the_wrong_slots(mode):
    fig = window_viz.draw_window_failure(mode, 8, 4, 3, 24, seed=0)
    run = fig.slotmap_run
    qsl = torch.tensor([0, 24], dtype=torch.int32)
    pos = torch.tensor(run.positions)
    table = torch.tensor([run.block_table_row], dtype=torch.int32)
    expected = slotmap.slot_mapping_oracle(qsl, pos, table, 4).tolist()
    kernel_ax, verdict_ax = fig.axes[2], fig.axes[3]
    labels = [int(t.get_text()) for t in kernel_ax.texts[:24]]
    wrong = [i for i in range(24) if labels[i] != expected[i]]
    red = sorted(int(p.get_x()) for p in patches_with(kernel_ax, "wrong"))
    assert red == wrong
    message = verdict_ax.texts[0].get_text().replace("\n", " ")
    if mode == "contiguous":
        assert wrong == [] and "accepts" in message
    elif mode == "shuffled across tiles":
        assert wrong and "window precondition" in message and "ValueError" in message
    else:
        # Tiles start at positions 3, 11, 19: mid-block; each loses its third block.
        assert wrong == [5, 6, 7, 13, 14, 15, 21, 22, 23]
        assert "BLOCK_TABLE_WINDOW_SIZE = next_pow2(cdiv(8, 4)) = 2" in message


# ---------------------------------------------------------------------------------------------
# Widgets: one change re-runs the kernel and redraws, well under a second
# ---------------------------------------------------------------------------------------------
def test_window_widget_redraws_on_a_change():
    pytest.importorskip("ipywidgets")
    box = window_viz.window_widget()
    first = box.figure
    start = time.perf_counter()
    box.controls["block_size"].value = 3
    elapsed = time.perf_counter() - start
    second = box.figure
    assert second is not first
    assert second.slotmap_run.block_size == 3
    assert second.slotmap_run.slots == second.slotmap_run.expected
    print(f"window widget update: {elapsed * 1000:.0f} ms")


def test_failure_widget_redraws_on_a_change():
    pytest.importorskip("ipywidgets")
    box = window_viz.window_failure_widget()
    assert box.figure.slotmap_run.wrong_tokens  # shuffled by default
    start = time.perf_counter()
    box.controls["mode"].value = "contiguous"
    elapsed = time.perf_counter() - start
    assert box.figure.slotmap_run.mode == "contiguous"
    assert box.figure.slotmap_run.wrong_tokens == []
    print(f"failure widget update: {elapsed * 1000:.0f} ms")


# ---------------------------------------------------------------------------------------------
# 03.float_gather: one kernel with the known mistakes as constexpr switches
# ---------------------------------------------------------------------------------------------
@triton.jit
def _float_variant(
    window_ptr,
    window_length,
    relative_ptr,
    num_lanes,
    out_ptr,
    WINDOW: tl.constexpr,
    LANES: tl.constexpr,
    SPLIT: tl.constexpr = 16,  # the high half is window >> SPLIT
    LOW_BITS: tl.constexpr = 16,  # the low half keeps this many bits
    RECOMBINE: tl.constexpr = 16,  # the high half goes back << RECOMBINE
    PLUS: tl.constexpr = False,  # recombine with + instead of |
    SINGLE_CAST: tl.constexpr = False,  # one float32 gather of the whole entry
    INT_GATHER: tl.constexpr = False,  # gather the int32 window as it is
    DIVMOD: tl.constexpr = False,  # halves by // and % (C's, rounding toward zero)
    WINDOW_MASK: tl.constexpr = True,  # mask the window load at window_length
):
    lanes = tl.arange(0, LANES)
    lane_mask = lanes < num_lanes
    relative = tl.load(relative_ptr + lanes, mask=lane_mask, other=0)
    window_indices = tl.arange(0, WINDOW)
    if WINDOW_MASK:
        window = tl.load(window_ptr + window_indices, mask=window_indices < window_length)
    else:
        window = tl.load(window_ptr + window_indices)
    if SINGLE_CAST:
        block_numbers = tl.gather(window.to(tl.float32), relative, 0).to(tl.int32)
    elif INT_GATHER:
        block_numbers = tl.gather(window, relative, 0)
    else:
        if DIVMOD:
            high = window // 65536
            low = window % 65536
        else:
            high = window >> SPLIT
            low = window & ((1 << LOW_BITS) - 1)
        high = tl.gather(high.to(tl.float32), relative, 0).to(tl.int32)
        low = tl.gather(low.to(tl.float32), relative, 0).to(tl.int32)
        if PLUS:
            block_numbers = (high << RECOMBINE) + low
        else:
            block_numbers = (high << RECOMBINE) | low
    tl.store(out_ptr + lanes, block_numbers, mask=lane_mask)


def FloatVariant(**constants) -> KernelVariant:  # noqa: N802 - reads like the class it returns
    return KernelVariant(_float_variant, **constants)


def test_float_gather_solution_passes(solution):
    result = run_check(get_exercise("03.float_gather"), solution.float_gather_kernel)
    assert result.passed, result.report()
    assert result.report().startswith("PASS 03.float_gather: 6 named cases and 30 random ones")


def test_float_gather_variant_harness_is_right():
    assert run_check(get_exercise("03.float_gather"), FloatVariant()).passed


@pytest.mark.parametrize(
    "constants",
    [
        # Disjoint halves: the low half's bits are 0 in (high << 16), so + and | agree.
        {"PLUS": True},
        # Overlapping halves (the low half keeps bit 16 too): | ORs a bit with itself.
        {"LOW_BITS": 17},
        # Any split exact in float32 works: both halves stay within 2**24 from bit 7 to 24.
        {"SPLIT": 24, "LOW_BITS": 24, "RECOMBINE": 24},
        {"SPLIT": 8, "LOW_BITS": 8, "RECOMBINE": 8},
        # C's // and % round toward zero: high and low share the sign, and + undoes that.
        {"DIVMOD": True, "PLUS": True},
    ],
    ids=["plus-disjoint", "or-overlapping", "split-24", "split-8", "divmod-plus"],
)
def test_other_exact_gathers_are_accepted(constants):
    result = run_check(get_exercise("03.float_gather"), FloatVariant(**constants))
    assert result.passed, result.report()


def test_single_float32_cast_is_rejected_at_two_to_the_24_plus_one():
    found = failure("03.float_gather", FloatVariant(SINGLE_CAST=True))
    assert found.case_name == (
        "named case '2**24 + 1 = 16777217, the first integer a float32 cannot hold'"
    )
    assert found.invariant.startswith(
        "entry 16777217 came back as 16777216: a float32 holds integers exactly only up to "
        "2**24 (lane 0 gathers window[0])"
    )
    assert (found.expected, found.got) == ("16777217", "16777216")


def test_halves_split_at_the_wrong_bit_are_rejected():
    # Split at bit 28, the low half keeps 28 bits: past 2**24, float32 rounds it.
    wrong_bit = FloatVariant(SPLIT=28, LOW_BITS=28, RECOMBINE=28)
    found = failure("03.float_gather", wrong_bit)
    assert "2**24 + 1" in found.case_name
    assert found.invariant.startswith("entry 16777217 came back as 16777216: a float32 holds")
    # Where the rounded half is not the whole entry, the report names the half.
    with pytest.raises(Wrong) as raised:
        lesson03.judge_float_gather(wrong_bit, lesson03.GatherCase([2**31 - 1], [0]))
    assert str(raised.value.invariant).startswith(
        # The low half rounds up to 2**28, whose bit | merges into the high half's.
        "entry 2147483647 came back as 1879048192: split at bit 28, its low half is "
        "268435455, above 2**24"
    )


@pytest.mark.skipif(
    not slotmap.BACKEND.interpreted,
    reason="2**31 - 1 through float32 overflows int32: numpy wraps it, a GPU saturates it back",
)
def test_a_single_cast_of_the_largest_int32_is_not_called_a_split():
    with pytest.raises(Wrong) as raised:
        single = FloatVariant(SINGLE_CAST=True)
        lesson03.judge_float_gather(single, lesson03.GatherCase([2**31 - 1], [0]))
    assert raised.value.invariant.startswith(
        "entry 2147483647 came back as -2147483648: a float32 holds integers exactly only"
    )


def test_halves_put_back_at_another_bit_are_rejected():
    found = failure("03.float_gather", FloatVariant(RECOMBINE=15))
    assert "2**24 + 1" in found.case_name
    assert found.invariant.startswith(
        "entry 16777217 came back as 8388609: split at bit 16 (high half 256, low half 1) but "
        "the high half was put back at bit 15 "
    )
    assert "same bit" in found.hint


def test_overlapping_halves_added_are_rejected():
    found = failure("03.float_gather", FloatVariant(LOW_BITS=17, PLUS=True))
    # 16777219 has bit 16 clear; 65535 too: the first entry with bit 16 set is 2**31 - 1.
    assert found.case_name.startswith("named case 'the largest int32")
    assert found.invariant.startswith("entry 2147483647 came back as -2147418113: the high ")
    assert (
        "the high half starts at bit 16 but the low half keeps 17 bits, so bits 16..16 are "
        in (found.invariant)
    )


def test_halves_of_a_negative_entry_by_c_division_are_rejected():
    # // and % keep a negative entry's sign in both halves: | then sets the high bits twice.
    found = failure("03.float_gather", FloatVariant(DIVMOD=True))
    assert found.case_name.startswith("named case 'negative entries")
    assert "a negative entry, whose sign sits in its high bits" in found.invariant
    assert "arithmetic shift" in found.hint


def test_int32_gather_is_rejected_by_type():
    if not slotmap.BACKEND.interpreted:
        pytest.skip("only the interpreter shows the type of each gather")
    found = failure("03.float_gather", FloatVariant(INT_GATHER=True))
    assert found.case_name == "named case 'small block numbers, one entry a lane'"
    assert found.invariant.startswith("tl.gather took a window of int32: released triton-ascend")
    assert (found.expected, found.got) == ("fp32", "int32")


def test_unmasked_float_window_load_is_rejected_naming_lane_and_tensor():
    if not slotmap.BACKEND.interpreted:
        pytest.skip("only the interpreter checks each load's lanes")
    found = failure("03.float_gather", FloatVariant(WINDOW_MASK=False))
    # A window of 3 entries loaded 4 wide: lane 3 reads past it.
    assert found.case_name.startswith("named case 'a window of 3 entries in a load of 4")
    assert found.invariant.startswith("lane 3 of the load at line ")
    assert "window_ptr[3], outside window_ptr's 3 int32 entries [0, 3)" in found.invariant


def test_float_gather_wants_a_kernel():
    found = failure("03.float_gather", lambda *args: None)
    assert "expected a @triton.jit kernel" in found.invariant


def test_the_float_gather_stub_is_reported_not_done(tmp_path):
    notebook = ROOT / "exercises" / "03_window_gather.ipynb"
    (source,) = [c for c in code_cells(notebook) if "def float_gather_kernel(" in c]
    module = import_source(tmp_path / "float_stub.py", TRITON_IMPORTS + source)
    result = run_check(get_exercise("03.float_gather"), module.float_gather_kernel)
    assert not result.passed and "not done yet" in result.failure.invariant, result.report()
