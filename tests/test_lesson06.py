"""Lesson 06 (hybrid blocks, groups, replay): its checks reject the classic mistakes and
accept the solutions; its figures show what the kernels wrote; its widgets re-run them."""

from __future__ import annotations

import time

import pytest
import torch
import triton
import triton.language as tl
from lesson_helpers import KernelVariant, by_gid, failure, solution_module

import slotmap
from slotmap.exercises import get_exercise, run_check

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from slotmap.viz import group_kinds as group_kinds_viz  # noqa: E402
from slotmap.viz import groups as groups_viz  # noqa: E402
from slotmap.viz import hybrid as hybrid_viz  # noqa: E402


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    return solution_module(tmp_path_factory.mktemp("solution06"), "06_hybrid_groups_replay.ipynb")


def texts(fig, gid):
    return [t.get_text() for t in by_gid(fig, gid, kind="text")]


def layout_problems(fig) -> list[str]:
    """What a reader could not read in ``fig`` as drawn (a PNG of its own size): text under
    ``hybrid_viz.MIN_FONT``, cut off at the figure's edge, on top of another text or running
    into a cell it does not label, and cell labels wider than their cell."""
    from matplotlib.patches import Rectangle
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox
    found = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    boxes = [t.get_window_extent(renderer) for t in found]
    drawn = [p for ax in fig.axes for p in [*ax.artists, *ax.patches]]
    cells = [
        (p.get_gid(), p.get_window_extent(renderer))
        for p in drawn
        if isinstance(p, Rectangle) and p.get_gid()
    ]
    problems = []

    def overlap(a, b) -> bool:
        return min(a.x1, b.x1) - max(a.x0, b.x0) > 0.5 and min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5

    for i, (text, box) in enumerate(zip(found, boxes, strict=True)):
        name = repr(text.get_text())
        if text.get_fontsize() < hybrid_viz.MIN_FONT:
            problems.append(f"{name} at {text.get_fontsize():.1f} pt")
        if (
            box.x0 < edge.x0 - 0.5
            or box.x1 > edge.x1 + 0.5
            or box.y0 < edge.y0 - 0.5
            or (box.y1 > edge.y1 + 0.5)
        ):
            problems.append(f"{name} cut off at the figure's edge")
        problems += [
            f"{name} overlaps {found[j].get_text()!r}"
            for j in range(i + 1, len(found))
            if overlap(box, boxes[j])
        ]
        centre = ((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2)
        for gid, cell in cells:
            if cell.contains(*centre):
                if box.width > cell.width + 0.5:
                    problems.append(f"{name} is wider than its {gid} cell")
            elif overlap(box, cell):
                problems.append(f"{name} runs into a {gid} cell")
    return problems


def assert_readable(fig, rows: dict[str, float]) -> None:
    """No layout problem, and the figure's x range covers each of ``rows`` (name -> its
    width in cells): the figure is sized from its widest row."""
    problems = layout_problems(fig)
    assert not problems, problems[:10]
    right = fig.axes[0].get_xlim()[1]
    for name, width in rows.items():
        assert width <= right, f"the {name} row ({width} cells) is wider than the figure"


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
    assert "should be k * K/B + j = 3 * 3 + j = 9..11" in found.invariant
    assert "(the factor K/B = 3 is missing)" in found.invariant


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
    assert (
        "entry [0, 1] is its attention block 1 and should be k * K/B + 1 = 3 * 3 + 1 = 10"
        in found.invariant
    )


def test_non_contiguous_result_is_rejected():
    # The right entries, laid out column by column: a transposed copy, viewed back. The
    # launchers reject such a table, so the check does too (once a case has two rows).
    def transposed_view(table, per):
        j = torch.arange(per, dtype=table.dtype, device=table.device)
        expanded = (table.unsqueeze(-1) * per + j).reshape(table.shape[0], table.shape[1] * per)
        return expanded.t().contiguous().t()

    found = failure("06.expand_block_table", transposed_view)
    assert "two requests" in found.case_name
    assert "has the right entries but is not contiguous (strides (1, 2)" in found.invariant
    assert (found.expected, found.got) == ("strides (8, 1)", "strides (1, 2)")
    with pytest.raises(ValueError, match="must be contiguous"):
        table = transposed_view(torch.tensor([[3, 1], [0, 5]], dtype=torch.int32), 4)
        slotmap.compute_slot_mapping(
            torch.tensor([0, 1, 2], dtype=torch.int32, device=slotmap.DEVICE),
            torch.tensor([0, 0], device=slotmap.DEVICE),
            table.to(slotmap.DEVICE),
            4,
        )


def test_an_expansion_right_only_for_a_contiguous_input_is_rejected():
    # Passed while every case's table was contiguous; an engine's persistent table is sliced.
    def through_a_view(table, per):
        flat = table.view(-1)  # no view of a column slice
        j = torch.arange(per, dtype=table.dtype, device=table.device)
        return (flat.unsqueeze(-1) * per + j).reshape(table.shape[0], table.shape[1] * per)

    found = failure("06.expand_block_table", through_a_view)
    assert found.case_name == (
        "named case 'a strided table: the first columns of a persistent, wider one'"
    )
    assert found.invariant.startswith("your code raised RuntimeError: view size is not")
    assert "flat = table.view(-1)" in found.invariant


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


def Variant(mistake: int) -> KernelVariant:  # noqa: N802 - reads like the class it returns
    return KernelVariant(_variant_kernel, MISTAKE=mistake)


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
# 06.group_switches: one function with the known mistakes as a switch
# ---------------------------------------------------------------------------------------------
(SWITCHES_RIGHT, DISABLED_READS, DUMMY_READS, CP_ON_UNSHARDED, HOST_COUNT, CP_ON_KERNEL_BLOCKS) = (
    range(6)
)


def switches_variant(mistake: int):
    def map_group(
        qsl,
        positions,
        block_table,
        idx_mapping,
        out,
        *,
        kv_cache_block_size,
        kernel_block_size,
        enabled,
        sharded,
        num_tokens,
        **cp,
    ):
        starts = qsl.tolist()
        out[num_tokens if mistake == HOST_COUNT else starts[-1] :] = slotmap.PAD_SLOT_ID
        for q in range(len(starts) - 1):
            row = int(idx_mapping[q])
            for t in range(starts[q], starts[q + 1]):
                disabled = not enabled and mistake != DISABLED_READS
                if disabled or (row < 0 and mistake != DUMMY_READS):
                    out[t] = slotmap.PAD_SLOT_ID
                    continue
                kv = kernel_block_size if mistake == CP_ON_KERNEL_BLOCKS else kv_cache_block_size
                split = cp if sharded or mistake == CP_ON_UNSHARDED else {}
                out[t] = slotmap.token_slot(
                    int(positions[t]),
                    block_table[row].tolist(),
                    kernel_block_size,
                    kv_cache_block_size=kv,
                    **split,
                )

    return map_group


def test_switches_solution_passes(solution):
    result = run_check(get_exercise("06.group_switches"), solution.map_group)
    assert result.passed, result.report()


def test_switches_variant_harness_is_right():
    assert run_check(get_exercise("06.group_switches"), switches_variant(SWITCHES_RIGHT)).passed


def test_a_disabled_group_that_reads_its_table_is_rejected():
    found = failure("06.group_switches", switches_variant(DISABLED_READS))
    assert "the group is disabled (slot_mapping_enabled False)" in found.invariant
    assert "a slot from the group's poisoned table" in found.invariant


def test_a_dummy_request_that_reads_row_minus_one_is_rejected():
    found = failure("06.group_switches", switches_variant(DUMMY_READS))
    assert "request 1 is a dummy request (idx_mapping[1] = -1)" in found.invariant
    assert "read from table[-1]" in found.invariant


def test_cp_on_an_unsharded_group_is_rejected():
    found = failure("06.group_switches", switches_variant(CP_ON_UNSHARDED))
    assert "the group is not sharded (dcp_sharded False)" in found.invariant
    assert "CP's answer for rank 1" in found.invariant


def test_padding_from_the_host_count_is_rejected():
    found = failure("06.group_switches", switches_variant(HOST_COUNT))
    assert "a padded host count: it still holds 4242" in found.invariant
    assert (found.expected, found.got) == ("-1", "4242")


def test_cp_on_kernel_blocks_is_rejected():
    found = failure("06.group_switches", switches_variant(CP_ON_KERNEL_BLOCKS))
    assert "CP splits allocation blocks of 4 tokens" in found.invariant


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
    # Request 1's positions before its first one are hatched where earlier steps wrote them.
    earlier = by_gid(fig, "cache-earlier")
    assert len(earlier) == firsts[1]
    assert sorted(map(int, texts(fig, "cache-earlier"))) == list(range(firsts[1]))
    assert {p.get_hatch() for p in earlier} <= {"///"}
    assert len(filled) + len(earlier) + len(by_gid(fig, "cache-empty")) == run.num_kv_blocks * kv
    assert len(by_gid(fig, "attention-block")) == run.num_kv_blocks * per
    if firsts[1]:
        assert "hatched: written by earlier steps" in "".join(
            t.get_text() for t in fig.texts + fig.axes[0].texts
        )


@pytest.mark.parametrize(
    ("lengths", "first_1", "block_size", "per"),
    [
        pytest.param((14, 14), 12, 1, 4, id="longest-B1-K4"),
        pytest.param((14, 14), 12, 4, 4, id="longest-B4-K16"),
        pytest.param((14, 14), 12, 1, 1, id="longest-B1-K1"),
        pytest.param((0, 0), 0, 1, 1, id="empty"),
        pytest.param((1, 1), 12, 4, 4, id="short-late"),
    ],
)
def test_hybrid_figure_is_readable_at_the_slider_ends(lengths, first_1, block_size, per):
    fig = hybrid_viz.draw_hybrid(lengths, block_size, per, first_positions=(0, first_1))
    run = fig.slotmap_run
    assert run.slots == run.expected
    assert_readable(
        fig,
        {
            "tokens": run.max_num_tokens,
            "block table": len(run.table[0]),
            "cache": 2 * run.kv_cache_block_size,
        },
    )
    assert "K = K/B x B" in fig._suptitle.get_text()


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
    # The full group's cache: one cell per token of this batch, and the earlier steps of the
    # requests that start later, hatched.
    assert len(by_gid(fig, "cache0-slot")) == num_tokens
    earlier = sum(first for first, n in zip(firsts, lengths, strict=True) if n)
    assert len(by_gid(fig, "cache0-earlier")) == earlier


@pytest.mark.parametrize(
    ("lengths", "firsts", "full", "ring"),
    [
        pytest.param((10, 10, 10), (0, 24, 24), 1, 2, id="widest-table-smallest-ring"),
        pytest.param((10, 10, 10), (0, 16, 24), 1, 2, id="newcomer-10-10-10-bs1-ring2"),
        pytest.param((10, 10, 10), (0, 24, 24), 8, 12, id="three-digit-slots"),
        pytest.param((10, 10, 10), (0, 0, 0), 1, 12, id="prefills"),
        pytest.param((0, 0, 0), (0, 0, 0), 1, 2, id="empty"),
        pytest.param((1, 1, 1), (0, 24, 24), 8, 2, id="decodes"),
    ],
)
def test_groups_figure_is_readable_at_the_slider_ends(lengths, firsts, full, ring):
    fig = groups_viz.draw_groups(lengths, firsts, full, ring)
    run = fig.slotmap_run
    assert run.slots == run.expected
    assert_readable(
        fig, {"tokens": run.max_num_tokens, "group 0's table": len(run.tables[0][0]), "ring": ring}
    )
    assert fig.axes[0].get_xlim()[1] <= hybrid_viz.MAX_CELLS + 0.3
    title = fig._suptitle.get_text()
    assert ("writes a ring slot twice" in title) == bool(run.ring_collisions())


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
        pytest.param(2, 7, 6, id="short-prefix-long-window"),
        pytest.param(5, 0, 1, id="long-prefix-no-window"),
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
    # The ring holds the window and the new tokens: no two positions share a ring slot.
    assert run.ring_size == max(8, window + new_tokens)
    assert not run.ring_collisions()
    assert not by_gid(fig, "ring-collision")
    assert_readable(fig, {"tokens": run.num_tokens, "table": len(run.full_table[0])})


def test_replay_figure_marks_a_ring_too_small():
    fig = groups_viz.draw_replay(3, 7, 6, ring_size=8)  # 13 positions written, 8 slots
    run = fig.slotmap_run
    ring = run.after[1][: run.num_tokens]
    assert run.ring_collisions() == {s for s in ring if ring.count(s) > 1} != set()
    marked = texts(fig, "ring-collision")
    assert sorted(marked) == sorted(str(s) for s in ring if s in run.ring_collisions())
    assert "too small for the 13 positions request 0 writes" in fig._suptitle.get_text()
    assert "w + new tokens" in fig._suptitle.get_text()
    assert_readable(fig, {"tokens": run.num_tokens})


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
    # Each later request has its own start slider, labelled with what it moves.
    assert box.controls["start_2"].description == "request 2 starts at"
    _change(box, "start_2", 12)
    assert [row[0] for row in box.figure.slotmap_run.positions] == [0, 9, 12]
    _change(box, "start_1", 24)
    assert [row[0] for row in box.figure.slotmap_run.positions] == [0, 24, 12]


def test_replay_widget_redraws_on_a_change():
    pytest.importorskip("ipywidgets")
    box = groups_viz.replay_widget()
    elapsed = _change(box, "window", 2)
    run = box.figure.slotmap_run
    assert run.window == 2
    assert run.after == run.expected
    assert sum(run.replayed()) == 2
    print(f"replay widget update: {elapsed * 1000:.0f} ms")


# ---------------------------------------------------------------------------------------------
# Section 5: the group switches' figure
# ---------------------------------------------------------------------------------------------
def test_group_kinds_figure_shows_what_the_kernel_wrote():
    fig = group_kinds_viz.draw_group_kinds()
    run = fig.slotmap_run
    pad = slotmap.PAD_SLOT_ID
    assert run.slots == run.expected  # the fused kernel, on every rank, is the oracle
    # The lesson's answer: the decode at position 13 (token 7).
    decode = run.positions.index(13)
    assert [run.slots[rank][0][decode] for rank in (0, 1)] == [pad, 46]
    assert [run.slots[rank][1][decode] for rank in (0, 1)] == [253, 253]
    # The prose: rank 0 packs positions 0, 2, 4, 6 into slots 20..23, rank 1 positions 1, 3, 5
    # into 20..22; the window maps every real position on both ranks alike; no 4242 survives.
    prefill = [run.slots[rank][0][:7] for rank in (0, 1)]
    assert prefill == [[20, pad, 21, pad, 22, pad, 23], [pad, 20, pad, 21, pad, 22, pad]]
    for rank in (0, 1):
        assert run.slots[rank][2] == [pad] * run.max_num_tokens
        assert all(s == pad for g in range(3) for s in run.slots[rank][g][run.real - 2 :])
        assert group_kinds_viz.STALE not in sum(run.slots[rank], [])
    assert run.slots[0][1] == run.slots[1][1]
    # Every entry is drawn: a number for each slot, a dash for each PAD_ID.
    drawn = [t.get_text() for t in fig.axes[0].texts]
    slots = [s for rank in run.slots for row in rank for s in row]
    assert drawn.count("–") == slots.count(pad)
    assert sorted(int(t) for t in drawn if t.isdigit() and int(t) >= 20) == sorted(
        s for s in slots if s >= 0
    )
    assert len(by_gid(fig, "dummy-token")) == 2
    assert not layout_problems(fig)
