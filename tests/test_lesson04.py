"""Lesson 04 (circular buffers): its checks reject the classic `%` mistakes and accept the
solutions; its figures show what the kernel wrote; its widget re-runs the kernel."""

from __future__ import annotations

import math
import time

import pytest
import torch
import triton
import triton.language as tl
from lesson_helpers import KernelVariant, failure, solution_module

import slotmap
from slotmap.exercises import get_exercise, run_check

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from slotmap.viz import circular as circular_viz  # noqa: E402


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    return solution_module(tmp_path_factory.mktemp("solution04"), "04_circular.ipynb")


# ---------------------------------------------------------------------------------------------
# 04.ring_slot
# ---------------------------------------------------------------------------------------------
def test_ring_slot_solution_passes(solution):
    assert run_check(get_exercise("04.ring_slot"), solution.ring_slot).passed


def test_floor_mod_on_negative_positions_is_rejected():
    # Python's % wraps -3 into offset 5: a real slot of the same request.
    found = failure("04.ring_slot", lambda p, b, size, pad: b * size + p % size)
    assert "padded tail" in found.invariant
    assert "Python's floor % wrapped it to offset 5" in found.invariant
    assert (found.expected, found.got) == ("-1", "61")


def test_truncating_mod_without_the_guard_is_rejected():
    found = failure("04.ring_slot", lambda p, b, size, pad: b * size + int(math.fmod(p, size)))
    assert "C's truncating % left the negative offset -3" in found.invariant


def test_forgotten_block_number_is_rejected():
    found = failure("04.ring_slot", lambda p, b, size, pad: pad if p < 0 else p % size)
    assert "position % block_size" in found.invariant
    assert "block 7 (slots 56..63)" in found.invariant


def test_wrong_pad_id_is_rejected():
    found = failure("04.ring_slot", lambda p, b, size, pad: -1 if p < 0 else b * size + p % size)
    assert "must get PAD_ID -7" in found.invariant


# ---------------------------------------------------------------------------------------------
# 04.circular_kernel: one kernel with the known mistakes as a constexpr switch
# ---------------------------------------------------------------------------------------------
GUARDED, FLOOR_MOD, TRUNCATING_MOD, NO_BLOCK_NUMBER, NO_STORE_MASK = range(5)


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
    MISTAKE: tl.constexpr = 0,
):
    req_idx = tl.program_id(0)
    if req_idx == tl.num_programs(0) - 1:
        for tile_start in range(num_tokens, max_num_tokens, TILE_BLOCK_SIZE):
            offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
            tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=offsets < max_num_tokens)
        return
    start_idx = tl.load(query_start_loc_ptr + req_idx)
    end_idx = tl.load(query_start_loc_ptr + req_idx + 1)
    block_number = tl.load(block_table_ptr + req_idx * block_table_stride)
    for tile_start in range(start_idx, end_idx, TILE_BLOCK_SIZE):
        offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offsets < end_idx
        pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
        has_slot = pos >= 0
        guarded = tl.where(has_slot, pos, 0) % block_size
        if MISTAKE == 1:  # Python's floor mod, built from Triton's truncating one: no PAD
            slot_ids = block_number * block_size + (pos % block_size + block_size) % block_size
        elif MISTAKE == 2:  # C's truncating mod, no guard: negative offsets
            slot_ids = block_number * block_size + pos % block_size
        elif MISTAKE == 3:  # slot = p % B
            slot_ids = tl.where(has_slot, guarded, PAD_ID)
        else:
            slot_ids = tl.where(has_slot, block_number * block_size + guarded, PAD_ID)
        if MISTAKE == 4:
            tl.store(slot_mapping_ptr + offsets, slot_ids)
        else:
            tl.store(slot_mapping_ptr + offsets, slot_ids, mask=mask)


def Variant(mistake: int) -> KernelVariant:  # noqa: N802 - reads like the class it returns
    return KernelVariant(_variant_kernel, MISTAKE=mistake)


def test_circular_kernel_solution_passes(solution):
    result = run_check(get_exercise("04.circular_kernel"), solution.circular_kernel)
    assert result.passed, result.report()


def test_circular_kernel_variant_harness_is_right():
    assert run_check(get_exercise("04.circular_kernel"), Variant(GUARDED)).passed


def test_floor_mod_in_the_kernel_is_rejected():
    found = failure("04.circular_kernel", Variant(FLOOR_MOD))
    assert "padded tail" in found.case_name
    assert "Python's floor % wrapped it" in found.invariant


def test_truncating_mod_in_the_kernel_is_rejected():
    found = failure("04.circular_kernel", Variant(TRUNCATING_MOD))
    assert "C's truncating % left the negative offset -3" in found.invariant


def test_forgotten_block_number_in_the_kernel_is_rejected():
    found = failure("04.circular_kernel", Variant(NO_BLOCK_NUMBER))
    assert "slot must be in the request's block 3" in found.invariant


def test_missing_store_mask_in_the_kernel_is_rejected():
    found = failure("04.circular_kernel", Variant(NO_STORE_MASK))
    assert "past the request's end" in found.invariant or "padding entry" in found.invariant


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------
def patches_with(ax, prefix: str) -> list:
    return [p for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


@pytest.mark.parametrize(
    ("position", "window", "block_size"),
    [
        pytest.param(13, 6, 8, id="wrapped"),
        pytest.param(3, 6, 8, id="padded-tail"),
        pytest.param(20, 10, 8, id="window-larger-than-ring"),
        pytest.param(0, 1, 2, id="first-token"),
    ],
)
def test_ring_figure_shows_what_the_kernel_wrote(position, window, block_size):
    fig = circular_viz.draw_ring(position, window, block_size, block_number=3)
    ring_ax, batch_ax = fig.axes[0], fig.axes[1]
    batch = list(range(position - window + 1, position + 1))
    expected = [slotmap.token_slot(p, [3], block_size, circular=True) for p in batch]
    # The batch row: one PAD box per negative position, the others labelled with their slot.
    pads = patches_with(batch_ax, "batch-pad")
    assert len(pads) == sum(p < 0 for p in batch)
    slot_boxes = sorted(patches_with(batch_ax, "batch-"), key=lambda p: p.get_x())
    labels = [t.get_text() for t in batch_ax.texts if t.get_position()[1] < 1.0]
    labels = labels[: len(batch)]
    assert labels == ["PAD" if s == -1 else str(s) for s in expected]
    assert len(slot_boxes) == len(batch)
    collisions = patches_with(batch_ax, "batch-collision")
    assert bool(collisions) == (window > block_size)
    # The ring: slot j holds the last position p <= position with p % B == j.
    in_window = patches_with(ring_ax, "ring-window")
    stale = patches_with(ring_ax, "ring-stale")
    empty = patches_with(ring_ax, "ring-empty")
    held = {p % block_size: p for p in range(position + 1)}
    assert len(in_window) + len(stale) + len(empty) == block_size
    assert len(empty) == block_size - len(held)
    assert len(in_window) == sum(1 for p in held.values() if p > position - window)
    ring_labels = {t.get_text() for t in ring_ax.texts if t.get_text().startswith("p ")}
    assert ring_labels == {f"p {p}" for p in held.values()}


def test_remainder_figure_compares_the_two_remainders():
    fig = circular_viz.draw_remainder(block_size=4, low=-9, high=6, block_number=3)
    values = fig.slotmap_values
    positions = list(range(-9, 7))
    assert values["python"] == [p % 4 for p in positions]
    assert values["triton"] == torch.fmod(torch.tensor(positions), 4).tolist()
    assert values["slots"] == [-1 if p < 0 else 12 + p % 4 for p in positions]
    triton_ax, slot_ax = fig.axes[2], fig.axes[3]
    negative_offsets = sum(1 for p in positions if p < 0 and p % 4 != 0)
    assert len(patches_with(triton_ax, "triton-negative")) == negative_offsets
    assert [t.get_text() for t in slot_ax.texts[: len(positions)]].count("PAD") == 9


# ---------------------------------------------------------------------------------------------
# Widget
# ---------------------------------------------------------------------------------------------
def test_ring_widget_redraws_on_a_change():
    pytest.importorskip("ipywidgets")
    box = circular_viz.ring_widget()
    first = box.figure
    start = time.perf_counter()
    box.controls["position"].value = 2
    elapsed = time.perf_counter() - start
    run = box.figure.slotmap_run
    assert box.figure is not first
    assert run.position == 2
    assert run.batch_slots == run.batch_expected
    assert run.batch_slots[:3] == [-1, -1, -1]  # window 6 ending at position 2
    print(f"ring widget update: {elapsed * 1000:.0f} ms")
