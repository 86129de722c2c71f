"""Lesson 06 (hybrid blocks, groups, replay): its checks reject the classic mistakes and
accept the solutions; its figures show what the kernels wrote; its widgets re-run them."""

from __future__ import annotations

import time

import pytest
import torch
import triton
import triton.language as tl
from lesson_helpers import by_gid, failure, solution_module

import slotmap
from slotmap.exercises import get_exercise, run_check

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from slotmap.viz import groups as groups_viz  # noqa: E402
from slotmap.viz import hybrid as hybrid_viz  # noqa: E402


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    return solution_module(tmp_path_factory.mktemp("solution06"), "06_hybrid_groups_replay.ipynb")


def texts(fig, gid):
    return [t.get_text() for t in by_gid(fig, gid, kind="text")]


# ---------------------------------------------------------------------------------------------
# 06.expand_block_table
# ---------------------------------------------------------------------------------------------
def test_expand_solution_passes(solution):
    result = run_check(get_exercise("06.expand_block_table"), solution.expand_block_table)
    assert result.passed, result.report()


def test_expand_library_function_passes():
    assert run_check(get_exercise("06.expand_block_table"), slotmap.expand_block_table).passed


def test_kv_block_numbers_repeated_are_rejected():
    found = failure("06.expand_block_table", lambda t, b: t.repeat_interleave(b, dim=1))
    assert "the KV block's own number" in found.invariant
    assert "physical KV block 3" in found.invariant
    assert (found.expected, found.got) == ("[9, 10, 11]", "[3, 3, 3]")


def test_missing_plus_j_is_rejected():
    found = failure("06.expand_block_table", lambda t, b: t.repeat_interleave(b, dim=1) * b)
    assert "point to the first one, so their tokens collide" in found.invariant


def test_missing_times_b_is_rejected():
    def plus_j(table, per):
        j = torch.arange(per, dtype=table.dtype, device=table.device)
        return (table.unsqueeze(-1) + j).reshape(table.shape[0], table.shape[1] * per)

    found = failure("06.expand_block_table", plus_j)
    assert "(the * 3 is missing)" in found.invariant


def test_int64_result_is_rejected():
    def int64(table, per):
        j = torch.arange(per, device=table.device)  # int64: promotes the result
        return (table.unsqueeze(-1) * per + j).reshape(table.shape[0], table.shape[1] * per)

    found = failure("06.expand_block_table", int64)
    assert "is int64: the kernels read block tables as int32" in found.invariant


def test_wrong_order_is_rejected():
    # j outermost: [k0*B, k1*B, k0*B + 1, ...] instead of each KV block's attention blocks
    # side by side.
    def transposed(table, per):
        j = torch.arange(per, dtype=table.dtype, device=table.device).view(1, -1, 1)
        return (table.unsqueeze(1) * per + j).reshape(table.shape[0], table.shape[1] * per)

    found = failure("06.expand_block_table", transposed)
    assert "entry [0, 1] is its attention block 1 and should be 3 * 3 + 1 = 10" in found.invariant


def test_unexpanded_table_is_rejected():
    found = failure("06.expand_block_table", lambda t, b: t.clone())
    assert "has shape (1, 2), expected (1, 6)" in found.invariant


def test_changing_the_input_is_rejected():
    def in_place(table, per):
        table.mul_(per)
        return slotmap.expand_block_table(table, 1).repeat_interleave(per, dim=1)

    found = failure("06.expand_block_table", in_place)
    assert "changed the block table it was given" in found.invariant


# ---------------------------------------------------------------------------------------------
# 06.replay_padding: one kernel with the known mistakes as a constexpr switch
# ---------------------------------------------------------------------------------------------
RIGHT, NO_REPLAY_CHECK, CLOSED_RANGE, EVERY_GROUP, WHOLE_REQUEST, MISSES_FIRST = range(6)


@triton.jit(do_not_specialize=["num_tokens", "window"])
def _variant_kernel(
    num_tokens,
    query_start_loc_ptr,
    positions_ptr,
    replay_start_ptr,
    window,
    prefix_cacheable_ptr,
    slot_mappings_ptr,
    slot_mappings_stride,
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
    MISTAKE: tl.constexpr = 0,
):
    group_idx = tl.program_id(0)
    req_idx = tl.program_id(1)
    cacheable = tl.load(prefix_cacheable_ptr + group_idx)
    replay_start = tl.load(replay_start_ptr + req_idx)
    if MISTAKE != 3:
        if cacheable == 0:
            return
    if MISTAKE != 1:
        if replay_start <= 0:
            return
    slot_mapping_ptr = slot_mappings_ptr + group_idx * slot_mappings_stride
    start_idx = tl.load(query_start_loc_ptr + req_idx)
    end_idx = tl.load(query_start_loc_ptr + req_idx + 1)
    for tile_start in range(start_idx, end_idx, TILE_BLOCK_SIZE):
        offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offsets < end_idx
        pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
        if MISTAKE == 2:
            replayed = mask & (pos >= replay_start) & (pos <= replay_start + window)
        elif MISTAKE == 4:
            replayed = mask
        elif MISTAKE == 5:
            replayed = mask & (pos > replay_start) & (pos < replay_start + window)
        else:
            replayed = mask & (pos >= replay_start) & (pos < replay_start + window)
        tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=replayed)


class Variant:
    def __init__(self, mistake: int):
        self.mistake = mistake

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            return _variant_kernel[grid](*args, **kwargs, MISTAKE=self.mistake)

        return launch


def test_replay_solution_passes(solution):
    result = run_check(get_exercise("06.replay_padding"), solution.replay_kernel)
    assert result.passed, result.report()


def test_replay_variant_harness_is_right():
    assert run_check(get_exercise("06.replay_padding"), Variant(RIGHT)).passed


def test_request_without_replay_padded_is_rejected():
    found = failure("06.replay_padding", Variant(NO_REPLAY_CHECK))
    assert "replay_start 0 means no replay" in found.case_name
    assert "has replay_start 0, which means no replay" in found.invariant


def test_closed_range_is_rejected():
    found = failure("06.replay_padding", Variant(CLOSED_RANGE))
    assert "= replay_start 4 + window 3 is the first position after the replay" in found.invariant
    assert "half-open" in found.invariant


def test_padding_a_group_that_is_not_cacheable_is_rejected():
    found = failure("06.replay_padding", Variant(EVERY_GROUP))
    assert "is not prefix-cacheable: every slot of it must be kept" in found.invariant


def test_padding_the_whole_request_is_rejected():
    found = failure("06.replay_padding", Variant(WHOLE_REQUEST))
    assert "comes before replay_start 4" in found.invariant
    assert (found.expected, found.got) == ("100", "-1")


def test_missing_the_first_replayed_position_is_rejected():
    found = failure("06.replay_padding", Variant(MISSES_FIRST))
    assert "is replayed (replay_start 4, window 3: positions 4..6)" in found.invariant
    assert "but it kept slot 104" in found.invariant


def test_replay_check_wants_a_kernel():
    found = failure("06.replay_padding", lambda *args: None)
    assert "expected a @triton.jit kernel" in found.invariant


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("lengths", "block_size", "per", "firsts"),
    [
        pytest.param((7, 10), 2, 3, (0, 0), id="lesson"),
        pytest.param((5, 9), 4, 1, (0, 6), id="one-per-kv-block"),
        pytest.param((14, 0), 1, 4, (0, 0), id="block-of-one"),
        pytest.param((3, 12), 3, 2, (0, 11), id="later-chunk"),
    ],
)
def test_hybrid_figure_shows_what_the_kernel_wrote(lengths, block_size, per, firsts):
    fig = hybrid_viz.draw_hybrid(lengths, block_size, per, first_positions=firsts, seed=3)
    run = fig.slotmap_run
    positions = [p for f, n in zip(firsts, lengths, strict=True) for p in range(f, f + n)]
    kv = block_size * per
    # Every token's slot label is the reference's, and equals the whole-KV-block slot.
    assert texts(fig, "slot") == [str(s) for s in run.expected[: len(positions)]]
    assert run.slots == run.expected
    token = 0
    for q, (first, n) in enumerate(zip(firsts, lengths, strict=True)):
        for p in range(first, first + n):
            assert run.slots[token] == run.kv_table[q][p // kv] * kv + p % kv
            token += 1
    # The expanded table drawn is expand_block_table of the manager's table.
    used_entries = [
        str(run.kv_table[q][a // per] * per + a % per)
        for q in range(len(lengths))
        for a in range(run.kv_used[q] * per)
    ]
    assert texts(fig, "attention-entry") == used_entries
    # One filled cache cell per token, labelled with its position; the rest empty.
    filled = by_gid(fig, "cache-slot")
    assert len(filled) == len(positions)
    assert sorted(map(int, texts(fig, "cache-slot"))) == sorted(positions)
    assert len(filled) + len(by_gid(fig, "cache-empty")) == run.num_kv_blocks * kv
    assert len(by_gid(fig, "attention-block")) == run.num_kv_blocks * per


@pytest.mark.parametrize(
    ("lengths", "firsts", "full", "ring"),
    [
        pytest.param((6, 3, 1), (0, 9, 21), 4, 8, id="lesson"),
        pytest.param((10, 2, 0), (0, 5, 17), 3, 4, id="chunk-longer-than-ring"),
        pytest.param((1, 1, 1), (30, 2, 14), 1, 2, id="decodes"),
    ],
)
def test_groups_figure_shows_both_rows_of_one_launch(lengths, firsts, full, ring):
    fig = groups_viz.draw_groups(lengths, firsts, full, ring, padding=2)
    run = fig.slotmap_run
    num_tokens = sum(lengths)
    expected = run.expected
    assert run.slots == expected
    assert texts(fig, "group0-slot") == [str(s) for s in expected[0][:num_tokens]]
    ring_labels = [t for t in by_gid(fig, "group1-slot", "text")]
    ring_labels += by_gid(fig, "group1-collision", "text")
    ring_labels.sort(key=lambda t: t.get_position()[0])
    assert [t.get_text() for t in ring_labels] == [str(s) for s in expected[1][:num_tokens]]
    assert texts(fig, "group0-pad") == ["PAD"] * 2
    # A ring slot written twice is marked exactly when a request outgrows its ring.
    assert bool(by_gid(fig, "group1-collision")) == any(n > ring for n in lengths)
    # The full group's cache: one cell per token of this batch.
    assert len(by_gid(fig, "cache0-slot")) == num_tokens


def test_tiling_figure_reports_the_launchers_choice():
    fig = groups_viz.draw_tiling()
    rows = fig.slotmap_rows
    assert [r.chosen for r in rows] == [
        slotmap.choose_tiling(sum(r.lengths), len(r.lengths)) for r in rows
    ]
    assert [r.chosen for r in rows] == [(16, 1), (1024, 1), (1024, 2), (1024, 2)]
    assert all(r.agrees for r in rows)
    decode = rows[0].costs
    assert list(decode.values()) == [(16.0, 1), (16.0, 1), (1024.0, 1)]
    prefill = rows[2].costs  # 2 x 2048: 128 tiles of 16 in one program, or 2 of 1024
    assert [walk for _, walk in prefill.values()] == [1, 128, 2]
    bars = [p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith("tiling")]
    assert len(bars) == 2 * 3 * len(rows)


@pytest.mark.parametrize(
    ("cached_blocks", "window", "new_tokens"),
    [
        pytest.param(3, 5, 3, id="lesson"),
        pytest.param(2, 0, 2, id="window-0"),
        pytest.param(5, 7, 6, id="long-window"),
    ],
)
def test_replay_figure_pads_only_the_cacheable_group(cached_blocks, window, new_tokens):
    fig = groups_viz.draw_replay(cached_blocks, window, new_tokens)
    run = fig.slotmap_run
    assert run.after == run.expected
    cached = cached_blocks * 4
    replayed = [cached - window <= p < cached for p in run.positions[0]] + [False]
    assert run.replayed() == replayed
    assert len(by_gid(fig, "replayed")) == sum(replayed)
    # The cacheable group's row after the padding: PAD exactly where replayed.
    assert len(by_gid(fig, "after-pad")) == sum(replayed)
    assert texts(fig, "after") == [
        str(s) for s, r in zip(run.before[0], replayed, strict=True) if not r
    ]
    # The ring keeps every slot.
    assert run.after[1] == run.before[1]
    assert texts(fig, "ring") == [str(s) for s in run.before[1]]
    # Replayed positions sit in the shared blocks, whose cells keep the cached positions.
    shared = {str(p) for p in range(cached)}
    assert set(texts(fig, "cache0-shared")) <= shared
    assert len(by_gid(fig, "cache0-slot")) == len(replayed) - sum(replayed)


# ---------------------------------------------------------------------------------------------
# Widgets
# ---------------------------------------------------------------------------------------------
def _change(box, name, value):
    first = box.figure
    start = time.perf_counter()
    box.controls[name].value = value
    elapsed = time.perf_counter() - start
    assert box.figure is not first
    return elapsed


def test_hybrid_widget_redraws_on_a_change():
    pytest.importorskip("ipywidgets")
    box = hybrid_viz.hybrid_widget()
    elapsed = _change(box, "blocks_per_kv_block", 2)
    run = box.figure.slotmap_run
    assert run.blocks_per_kv_block == 2
    assert run.slots == run.expected
    print(f"hybrid widget update: {elapsed * 1000:.0f} ms")


def test_groups_widget_redraws_on_a_change():
    pytest.importorskip("ipywidgets")
    box = groups_viz.groups_widget()
    elapsed = _change(box, "ring_size", 3)
    run = box.figure.slotmap_run
    assert run.block_sizes == [4, 3]
    assert run.slots == run.expected
    assert run.ring_collisions()  # request 0 has 6 tokens, the ring 3 slots
    print(f"groups widget update: {elapsed * 1000:.0f} ms")


def test_replay_widget_redraws_on_a_change():
    pytest.importorskip("ipywidgets")
    box = groups_viz.replay_widget()
    elapsed = _change(box, "window", 2)
    run = box.figure.slotmap_run
    assert run.window == 2
    assert run.after == run.expected
    assert sum(run.replayed()) == 2
    print(f"replay widget update: {elapsed * 1000:.0f} ms")
