"""Lesson 07 (end to end): its checks reject the known-wrong kernels and merges and accept the
solutions; its figures show what the kernels computed; its widgets re-run them."""

from __future__ import annotations

import time

import pytest
import torch
import triton
import triton.language as tl
from lesson_helpers import KernelVariant, failure, solution_module

from slotmap.exercises import get_exercise, run_check

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from slotmap.viz import attention as attention_viz  # noqa: E402


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    return solution_module(tmp_path_factory.mktemp("solution07"), "07_end_to_end.ipynb")


# ---------------------------------------------------------------------------------------------
# 07.reshape_and_cache: one kernel with the known mistakes behind a constexpr switch
# ---------------------------------------------------------------------------------------------
RIGHT, NO_PAD_SKIP, TOKEN_AS_SLOT, NO_STORE_MASK, SWAPPED, BLOCK_OFFSET_SWAPPED = range(6)
SLOT_TIMES_SLOT_STRIDE, OFFSET_TIMES_ROW = 6, 7  # right for contiguous caches only


@triton.jit
def _variant_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    block_size,
    block_stride,
    slot_stride,
    ROW: tl.constexpr,
    ROW_TILE: tl.constexpr,
    PAD_ID: tl.constexpr,
    MISTAKE: tl.constexpr = 0,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if MISTAKE == 2:  # the token's index instead of its slot
        slot = token
    if MISTAKE != 1:
        if slot == PAD_ID:
            return
    block = slot // block_size
    offset = slot % block_size
    if MISTAKE == 5:
        block, offset = offset, block
    lanes = tl.arange(0, ROW_TILE)
    mask = lanes < ROW
    target = block * block_stride + offset * slot_stride + lanes
    if MISTAKE == 6:  # blocks assumed block_size slots apart
        target = slot * slot_stride + lanes
    if MISTAKE == 7:  # slots assumed ROW elements apart
        target = block * block_stride + offset * ROW + lanes
    key = tl.load(key_ptr + token * ROW + lanes, mask=mask, other=0.0)
    value = tl.load(value_ptr + token * ROW + lanes, mask=mask, other=0.0)
    if MISTAKE == 4:
        key, value = value, key
    if MISTAKE == 3:
        tl.store(key_cache_ptr + target, key)
        tl.store(value_cache_ptr + target, value)
    else:
        tl.store(key_cache_ptr + target, key, mask=mask)
        tl.store(value_cache_ptr + target, value, mask=mask)


def Variant(mistake: int) -> KernelVariant:  # noqa: N802 - reads like the class it returns
    return KernelVariant(_variant_kernel, MISTAKE=mistake)


def test_reshape_and_cache_solution_passes(solution):
    result = run_check(get_exercise("07.reshape_and_cache"), solution.reshape_and_cache_kernel)
    assert result.passed, result.report()


def test_reshape_and_cache_variant_harness_is_right():
    result = run_check(get_exercise("07.reshape_and_cache"), Variant(RIGHT))
    assert result.passed, result.report()


def test_a_padding_token_that_writes_is_rejected():
    found = failure("07.reshape_and_cache", Variant(NO_PAD_SKIP))
    assert "a padding token (token 1, slot -1) wrote into the cache" in found.invariant
    assert "before the cache's start" in found.invariant
    assert "a padding token" in found.case_name


def test_the_token_index_used_as_slot_is_rejected():
    found = failure("07.reshape_and_cache", Variant(TOKEN_AS_SLOT))
    assert found.invariant == (
        "token 0's key landed in the key cache's slot 0 (block 0, offset 0) instead of the key "
        "cache's slot 9 (block 2, offset 1)"
    )


def test_a_missing_store_mask_is_rejected():
    found = failure("07.reshape_and_cache", Variant(NO_STORE_MASK))
    assert "a store wrote past a token's row" in found.invariant or (
        "wrong numbers" in found.invariant
    )
    assert "3 heads of 2" in found.case_name


def test_key_and_value_swapped_are_rejected():
    found = failure("07.reshape_and_cache", Variant(SWAPPED))
    assert "value was written into the key cache" in found.invariant
    assert "swapped" in found.invariant


def test_block_and_offset_swapped_are_rejected():
    found = failure("07.reshape_and_cache", Variant(BLOCK_OFFSET_SWAPPED))
    assert "token 0's key landed in the key cache's slot" in found.invariant
    assert "instead of the key cache's slot 9 (block 2, offset 1)" in found.invariant


def test_a_write_right_only_for_contiguous_blocks_is_rejected_on_interleaved_caches():
    # Passed every check while the caches were contiguous: slot * slot_stride is the slot's
    # row only when blocks are block_size slots apart.
    found = failure("07.reshape_and_cache", Variant(SLOT_TIMES_SLOT_STRIDE))
    assert "block stride is not block_size x slot stride" in found.case_name
    assert found.invariant.startswith(
        "token 0's key landed in the key cache's slot 5 (block 1, offset 1) instead of the key "
        "cache's slot 9 (block 2, offset 1): K and V interleaved in one [num_blocks, 2, "
        "block_size, num_heads, head_dim] tensor, so the cache's block stride is not "
        "block_size x slot stride (block_stride 32, slot_stride 4)"
    )
    assert "slot * slot_stride" in found.invariant
    assert "the cache's own strides, one for blocks and one for slots" in found.hint


def test_a_write_that_counts_slots_in_rows_is_rejected_on_padded_slots():
    found = failure("07.reshape_and_cache", Variant(OFFSET_TIMES_ROW))
    assert "slot stride is not ROW" in found.case_name
    assert "each slot's row padded by 3 elements, so the slot stride is not ROW = 3" in (
        found.invariant
    )
    assert "counted in rows of ROW" in found.invariant


def test_an_untouched_stub_is_not_done_yet():
    @triton.jit
    def stub(
        key_ptr,
        value_ptr,
        key_cache_ptr,
        value_cache_ptr,
        slot_mapping_ptr,
        block_size,
        block_stride,
        slot_stride,
        ROW: tl.constexpr,
        ROW_TILE: tl.constexpr,
        PAD_ID: tl.constexpr,
    ):
        raise NotImplementedError()

    found = failure("07.reshape_and_cache", stub)
    assert found.invariant.startswith("not done yet")


# ---------------------------------------------------------------------------------------------
# 07.lse_merge
# ---------------------------------------------------------------------------------------------
def test_lse_merge_solution_passes(solution):
    result = run_check(get_exercise("07.lse_merge"), solution.merge)
    assert result.passed, result.report()


def test_library_merge_passes():
    from slotmap.attention import merge_attention_states, merge_attention_states_torch

    for merge in (merge_attention_states, merge_attention_states_torch):
        result = run_check(get_exercise("07.lse_merge"), merge)
        assert result.passed, result.report()


def naive_merge(outs, lses):
    # exp(lse_r) without the shift: overflows; -inf ranks are fine here (exp(-inf) = 0)
    weights = torch.exp(lses)
    total = weights.sum(0)
    return (weights[..., None] * outs).sum(0) / total[..., None], torch.log(total)


def nan_merge(outs, lses):
    # right, except where every rank is empty: -inf - -inf
    largest = lses.max(0).values
    weights = torch.exp(lses - largest)
    total = weights.sum(0)
    return (weights[..., None] * outs).sum(0) / total[..., None], largest + torch.log(total)


def average_merge(outs, lses):
    return outs.mean(0), torch.logsumexp(lses, 0)


def unnormalised_merge(outs, lses):
    lse = torch.logsumexp(lses, 0)
    return (torch.exp(lses)[..., None] * outs).sum(0), lse


def max_lse_merge(outs, lses):
    lse = torch.logsumexp(lses, 0)
    weights = torch.exp(lses - lse)
    return (weights[..., None] * outs).sum(0), lses.max(0).values


def test_a_plain_average_is_rejected():
    found = failure("07.lse_merge", average_merge)
    assert found.invariant.startswith("merged output differs from dense attention by ")
    assert "at request 0, head 0" in found.invariant
    assert "plain average" in found.invariant
    assert "weights must be exp(lse_r - lse)" in found.invariant
    assert "alternate positions" in found.case_name


def test_unnormalised_weights_are_rejected():
    found = failure("07.lse_merge", unnormalised_merge)
    assert "not divided by exp(lse)" in found.invariant


def test_the_largest_lse_as_the_merged_lse_is_rejected():
    found = failure("07.lse_merge", max_lse_merge)
    assert "merged lse at request 0, head 0" in found.invariant
    assert "it is the largest lse_r" in found.invariant


def test_nan_from_an_empty_rank_is_rejected():
    found = failure("07.lse_merge", nan_merge)
    assert "NaN in the merged output at request 1, head 0" in found.invariant
    assert "the request has 0 positions, so every rank's lse is -inf" in found.invariant


def test_exp_overflow_is_rejected():
    found = failure("07.lse_merge", naive_merge)
    assert "overflows float32" in found.invariant
    assert "large scores" in found.case_name


def right_merge(outs, lses):
    largest = lses.max(0).values
    shift = torch.where(torch.isfinite(largest), largest, torch.zeros_like(largest))
    weights = torch.exp(lses - shift)
    total = weights.sum(0)
    out = (weights[..., None] * outs).sum(0) / total.clamp(min=1e-30)[..., None]
    return out, shift + torch.log(total)


def finite_empty_lse_merge(outs, lses):
    # right output, but an empty request's lse -inf replaced by 0 (a "safe" number)
    out, lse = right_merge(outs, lses)
    return out, lse.nan_to_num(neginf=0.0)


def positive_inf_empty_lse_merge(outs, lses):
    # FlashAttention-2's convention for a sequence with no keys: lse = +inf
    out, lse = right_merge(outs, lses)
    return out, torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)


def test_the_right_merge_of_these_variants_passes():
    result = run_check(get_exercise("07.lse_merge"), right_merge)
    assert result.passed, result.report()


@pytest.mark.parametrize(
    ("merge", "got"), [(finite_empty_lse_merge, "0.0"), (positive_inf_empty_lse_merge, "inf")]
)
def test_an_empty_request_whose_lse_is_not_minus_inf_is_rejected(merge, got):
    found = failure("07.lse_merge", merge)
    assert found.invariant == (
        "request 1, head 0 has no keys on any rank (the request has 0 positions, every lse_r "
        f"is -inf): its merged lse must be -inf, got {got}"
    )
    assert "padding request of length 0" in found.case_name


def test_a_merge_that_returns_one_tensor_is_rejected():
    found = failure("07.lse_merge", lambda outs, lses: outs.mean(0))
    assert "not a pair (out, lse)" in found.invariant


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------
def gids(ax, prefix: str) -> list:
    return [p for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


@pytest.mark.parametrize("block_size", [4, 3])
def test_paged_figure_shows_the_cache_the_kernels_wrote(block_size):
    fig = attention_viz.draw_paged_attention((6, 11, 3), block_size)
    run = fig.slotmap_run
    cache_ax = fig.axes[0]
    # One coloured box per token of each request, labelled with its position, in its slot.
    for q, n in enumerate((6, 11, 3)):
        assert len(gids(cache_ax, f"slot-q{q}")) == n
    assert len(cache_ax.patches) == run.num_blocks * block_size
    boxes_by_slot = sorted(cache_ax.patches, key=lambda p: p.get_x())
    for token, slot in enumerate(run.slots):
        assert boxes_by_slot[slot].get_gid() == f"slot-q{run.requests[token]}"
    expected = [
        run.block_table[q][p // block_size] * block_size + p % block_size
        for q, p in zip(run.requests, run.positions, strict=True)
    ]
    assert run.slots == expected
    # Six error bars (3 requests x 2 heads), all under the tolerance.
    bars = gids(fig.axes[1], "error-bar")
    assert len(bars) == 6 and run.max_error < attention_viz.TOLERANCE
    assert "matches dense attention" in fig._suptitle.get_text()


@pytest.mark.parametrize(
    ("corruption", "diverged"),
    [("one token to a free slot", {1}), ("one token to another request's slot", {0, 1})],
)
def test_a_corrupted_slot_makes_the_output_diverge(corruption, diverged):
    fig = attention_viz.draw_paged_attention((6, 11, 3), 4, corruption)
    run = fig.slotmap_run
    t = run.corrupted_token
    assert run.written[t] != run.slots[t]
    bad = {q for q, per_head in enumerate(run.errors) if max(per_head) > 1e-3}
    assert bad == diverged
    assert len(gids(fig.axes[0], "slot-corrupt")) == 1
    assert len(gids(fig.axes[0], "slot-lost")) == 1
    assert "DIVERGED" in fig._suptitle.get_text()


@pytest.mark.parametrize(
    ("seq_len", "world_size", "interleave"), [(13, 2, 2), (5, 3, 1), (24, 4, 4), (3, 1, 1)]
)
def test_cp_figure_shows_ownership_local_caches_and_weights(seq_len, world_size, interleave):
    import slotmap

    fig = attention_viz.draw_cp_attention(seq_len, world_size, interleave, block_size=4)
    run = fig.slotmap_run
    for r in range(world_size):
        owned = [
            p
            for p in range(seq_len)
            if slotmap.token_slot(
                p,
                [0] * 16,
                4,
                kv_cache_block_size=4,
                cp_world_size=world_size,
                cp_rank=r,
                cp_interleave=interleave,
            )
            != -1
        ]
        assert [p for p in range(seq_len) if run["owner"][p] == r] == owned
        assert len(gids(fig.axes[0], f"owner-r{r}")) == len(owned)
        assert len(gids(run["local_axes"][r], f"local-r{r}")) == len(owned) == run["local_lens"][r]
    shares = torch.tensor(run["shares"])  # [W, H]
    torch.testing.assert_close(shares.sum(0), torch.ones(shares.shape[1]))
    assert all(v < 1e-5 for e in run["errors"] for v in e.values())  # NaN fails too


def text_boxes(fig, texts):
    renderer = fig.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in texts]


def overlapping(fig, texts) -> list:
    """Pairs of texts whose drawn boxes overlap (in pixels)."""
    found = text_boxes(fig, texts)
    return [
        (texts[i].get_text(), texts[j].get_text())
        for i in range(len(found))
        for j in range(i + 1, len(found))
        if found[i].overlaps(found[j])
    ]


def inside_figure(fig, text) -> bool:
    box = text_boxes(fig, [text])[0]
    width, height = fig.canvas.get_width_height()
    return box.x0 >= 0 and box.x1 <= width and box.y0 >= 0 and box.y1 <= height


# The paged widget's extremes: block size 1..8, request 1's length 1..24, every corruption.
PAGED_EXTREMES = [
    (block_size, longest, corruption)
    for block_size in (1, 8)
    for longest in (1, 24)
    for corruption in attention_viz.CORRUPTIONS
]


@pytest.mark.parametrize(("block_size", "longest", "corruption"), PAGED_EXTREMES)
def test_paged_figure_is_readable_at_the_widgets_extremes(block_size, longest, corruption):
    fig = attention_viz.draw_paged_attention((6, longest, 3), block_size, corruption, num_heads=1)
    run = fig.slotmap_run
    cache_ax = fig.axes[0]
    assert len(cache_ax.patches) == run.num_blocks * block_size
    # Every slot label sits in its own box and every block number under its own block, none
    # overlapping another, and the whole cache row inside the figure.
    slot_labels = [t for t in cache_ax.texts if t.get_position()[1] > 0]
    block_labels = [
        t for t in cache_ax.texts if t.get_position()[1] < 0 and t.get_ha() == "center"
    ]
    assert [t.get_text() for t in block_labels] == [str(b) for b in range(run.num_blocks)]
    lost = 1 if run.corrupted_token is not None else 0  # the "?" of the slot not written
    assert len(slot_labels) == len(set(run.written)) + lost + 1  # + the row's caption
    assert overlapping(fig, slot_labels) == []
    assert overlapping(fig, block_labels) == []
    assert all(inside_figure(fig, t) for t in cache_ax.texts)
    table = next(t for t in fig.texts if t.get_gid() == "block-table")
    assert inside_figure(fig, table)
    title = fig._suptitle.get_text()
    assert f"physical blocks of B = {block_size} slot" in title
    assert ("1 slots" not in title) and ("B = 1 slot\n" in title) == (block_size == 1)
    assert len(gids(fig.axes[1], "error-bar")) == 3
    # An error of exactly 0 has no bar on the log scale: a label says so.
    exact = sum(e == 0 for per_head in run.errors for e in per_head)
    assert [t.get_text() for t in fig.axes[1].texts].count("0 (exact)") == exact


@pytest.mark.parametrize(
    ("seq_len", "world_size", "interleave"),
    [(24, 1, 1), (24, 4, 4), (24, 4, 1), (1, 4, 1), (1, 1, 4), (13, 2, 2)],
)
def test_cp_figure_is_readable_at_the_widgets_extremes(seq_len, world_size, interleave):
    fig = attention_viz.draw_cp_attention(seq_len, world_size, interleave, block_size=4)
    run = fig.slotmap_run
    title = fig._suptitle.get_text()
    assert "rank(s)" not in title
    assert f"W = {world_size} rank{'s' if world_size > 1 else ''}," in title
    # Both the lse and the weight line name their heads.
    side = [t.get_text() for t in fig.texts if t.get_text().startswith("lse:")]
    assert len(side) == world_size
    assert all(line.startswith("lse: h0 ") and "\nweight: h0 " in line for line in side)
    # Each local block says whose cache it is in; labels do not overlap and stay inside.
    for r, ax in enumerate(run["local_axes"]):
        labels = [t for t in ax.texts if "block" in t.get_text()]
        assert len(labels) == -(-run["local_lens"][r] // 4)
        assert all(t.get_text().startswith(f"rank {r}'s block ") for t in labels)
        assert overlapping(fig, labels) == []
        assert all(inside_figure(fig, t) for t in ax.texts)


# ---------------------------------------------------------------------------------------------
# Widgets
# ---------------------------------------------------------------------------------------------
def test_paged_widget_redraws_on_a_change():
    pytest.importorskip("ipywidgets")
    box = attention_viz.paged_attention_widget()
    first = box.figure
    start = time.perf_counter()
    box.controls["corruption"].value = "one token to a free slot"
    elapsed = time.perf_counter() - start
    assert box.figure is not first
    assert box.figure.slotmap_run.max_error > 1e-3
    box.controls["block_size"].value = 2
    assert box.figure.slotmap_run.block_size == 2
    assert len(box.figure.slotmap_run.errors[0]) == 1  # one head: a move stays quick
    print(f"paged widget update: {elapsed * 1000:.0f} ms")


def test_cp_widget_redraws_on_a_change():
    pytest.importorskip("ipywidgets")
    box = attention_viz.cp_attention_widget()
    start = time.perf_counter()
    box.controls["world_size"].value = 3
    elapsed = time.perf_counter() - start
    assert len(box.figure.slotmap_run["local_lens"]) == 3
    assert "W = 3 ranks" in box.figure._suptitle.get_text()
    assert sum(box.figure.slotmap_run["local_lens"]) == 13
    print(f"cp widget update: {elapsed * 1000:.0f} ms")


# ---------------------------------------------------------------------------------------------
# 07.paged_read: the block walk, with the known mistakes behind a constexpr switch
# ---------------------------------------------------------------------------------------------
READ_RIGHT, UNMASKED_LAST_BLOCK, ROW_ZERO, SLOT_BLOCK_SWAPPED = range(4)


@triton.jit
def _read_variant_kernel(
    out_ptr,
    lse_ptr,
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_table_ptr,
    block_table_stride,
    seq_lens_ptr,
    scale,
    block_size,
    slot_stride,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_TILE: tl.constexpr,
    TILE: tl.constexpr,
    MISTAKE: tl.constexpr = 0,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    seq_len = tl.load(seq_lens_ptr + req)
    dims = tl.arange(0, HEAD_DIM_TILE)
    dim_mask = dims < HEAD_DIM
    query = tl.load(query_ptr + (req * num_heads + head) * HEAD_DIM + dims, mask=dim_mask)
    running_max = -float("inf")
    running_sum = 0.0
    acc = tl.zeros([HEAD_DIM_TILE], dtype=tl.float32)
    for tile_start in range(0, seq_len, TILE):
        positions = tile_start + tl.arange(0, TILE)
        if MISTAKE == 1:
            valid = positions >= 0  # every lane: the last tile unmasked
        else:
            valid = positions < seq_len
        row = block_table_ptr + req * block_table_stride
        if MISTAKE == 2:
            row = block_table_ptr
        physical_block = tl.load(row + positions // block_size, mask=valid, other=0)
        if MISTAKE == 3:
            slots = (positions % block_size) * block_size + physical_block
        else:
            slots = physical_block * block_size + positions % block_size
        offsets = slots[:, None] * slot_stride + head * HEAD_DIM + dims[None, :]
        mask = valid[:, None] & dim_mask[None, :]
        key = tl.load(key_cache_ptr + offsets, mask=mask, other=0.0)
        scores = tl.sum(key * query[None, :], axis=1) * scale
        scores = tl.where(valid, scores, -float("inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=0))
        shift = tl.where(new_max == -float("inf"), 0.0, new_max)
        rescale = tl.exp(running_max - shift)
        weights = tl.exp(scores - shift)
        value = tl.load(value_cache_ptr + offsets, mask=mask, other=0.0)
        acc = acc * rescale + tl.sum(weights[:, None] * value, axis=0)
        running_sum = running_sum * rescale + tl.sum(weights, axis=0)
        running_max = new_max
    denominator = tl.where(running_sum == 0, 1.0, running_sum)
    tl.store(
        out_ptr + (req * num_heads + head) * HEAD_DIM + dims, acc / denominator, mask=dim_mask
    )
    tl.store(lse_ptr + req * num_heads + head, running_max + tl.log(denominator))


def ReadVariant(mistake: int) -> KernelVariant:  # noqa: N802 - reads like the class it returns
    return KernelVariant(_read_variant_kernel, MISTAKE=mistake)


def test_paged_read_solution_passes(solution):
    result = run_check(get_exercise("07.paged_read"), solution.paged_read_kernel)
    assert result.passed, result.report()
    assert result.named == len(get_exercise("07.paged_read").cases()) and result.random > 0


def test_paged_read_variant_harness_is_right():
    result = run_check(get_exercise("07.paged_read"), ReadVariant(READ_RIGHT))
    assert result.passed, result.report()


def test_paged_read_unmasked_last_block_is_named():
    found = failure("07.paged_read", ReadVariant(UNMASKED_LAST_BLOCK))
    assert "one request of 6 in blocks of 4" in found.case_name
    assert found.invariant == (
        "request 0, head 0: the output differs from attention over positions 0..5 "
        "(6 positions in 2 blocks of 4): it reads slots that hold none of the request's "
        "positions 0..5 (its output moves when only those slots change): a lane at or past "
        "seq_len left unmasked, or a lane's slot computed wrong"
    )


def test_paged_read_through_the_wrong_row_is_named():
    found = failure("07.paged_read", ReadVariant(ROW_ZERO))
    assert "two requests in shuffled blocks" in found.case_name
    assert found.invariant.startswith("request 1, head 0: the output differs")
    assert found.invariant.endswith(
        ": request 1 read its keys through row 0 of the block table, not row 1"
    )


def test_paged_read_slot_and_block_swapped_is_rejected():
    found = failure("07.paged_read", ReadVariant(SLOT_BLOCK_SWAPPED))
    # Lane i jumps a whole block per slot: past the cache, or into another request's slots.
    assert "key_cache" in found.invariant or "the output differs" in found.invariant
    assert found.hint.startswith("Lane i of a tile is position tile_start + i")


def test_an_unfinished_paged_read_is_reported_as_not_done():
    @triton.jit
    def stub(
        out_ptr,
        lse_ptr,
        query_ptr,
        key_cache_ptr,
        value_cache_ptr,
        block_table_ptr,
        block_table_stride,
        seq_lens_ptr,
        scale,
        block_size,
        slot_stride,
        HEAD_DIM: tl.constexpr,
        HEAD_DIM_TILE: tl.constexpr,
        TILE: tl.constexpr,
    ):
        # YOUR CODE HERE
        raise NotImplementedError()

    found = failure("07.paged_read", stub)
    assert found.invariant.startswith("not done yet")
