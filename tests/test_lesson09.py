"""The capstone (exercise 09): its checks accept the solution, report the stubs as not done,
reject the classic mistakes of a fused multi-group kernel with the right message, and judge
a GPU time against lesson 08's model (the comparison tested here with numbers passed in)."""

from __future__ import annotations

import pytest
import triton
import triton.language as tl
from lesson_helpers import ROOT, TRITON_IMPORTS, KernelVariant, code_cells, failure, import_source
from lesson_helpers import solution_module as solution_of

import slotmap
from slotmap.exercises import get_exercise, lesson08, lesson09, run_check
from slotmap.layout import cdiv, next_power_of_2


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    return solution_of(tmp_path_factory.mktemp("solution09"), "09_capstone.ipynb")


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    """The shipped exercise's code cells (stubs in place) as a module."""
    cells = code_cells(ROOT / "exercises" / "09_capstone.ipynb")
    source = "\n\n".join(c for c in cells if "def " in c)
    return import_source(tmp_path_factory.mktemp("stub09") / "stub09.py", TRITON_IMPORTS + source)


# ---------------------------------------------------------------------------------------------
# The solution passes, the stubs are not done
# ---------------------------------------------------------------------------------------------
def test_window_solution_passes(solution):
    result = run_check(get_exercise("09.group_window"), solution.group_window_size)
    assert result.passed, result.report()


def test_kernel_solution_passes(solution):
    result = run_check(get_exercise("09.fused_groups"), solution.fused_slot_mappings_kernel)
    assert result.passed, result.report()
    assert result.named == len(lesson09._fused_cases()) and result.random > 0


@pytest.mark.parametrize(
    ("exercise", "name"),
    [
        ("09.group_window", "group_window_size"),
        ("09.fused_groups", "fused_slot_mappings_kernel"),
        ("09.fused_groups_time", "fused_slot_mappings_kernel"),
    ],
)
def test_stubs_are_reported_not_done(stub, exercise, name):
    result = run_check(get_exercise(exercise), getattr(stub, name))
    assert not result.passed and "not done yet" in result.failure.invariant, result.report()


# ---------------------------------------------------------------------------------------------
# 09.group_window: the known-wrong windows
# ---------------------------------------------------------------------------------------------
def _paged(sizes, circular):
    return [s for s, c in zip(sizes, circular, strict=True) if not c]


def test_window_without_its_plus_one_is_rejected():
    def no_plus_one(tile, sizes, circular):
        paged = _paged(sizes, circular)
        return next_power_of_2(cdiv(tile, min(paged))) if paged else 1

    found = failure("09.group_window", no_plus_one)
    assert found.case_name.startswith("named case 'full attention (blocks of 4)")
    assert "should be 4, got 2: the window has no +1" in found.invariant
    # The report shows what the production kernel does with that window.
    assert "the production kernel launched with it gives position" in found.invariant
    from slotmap import i18n

    i18n.use("zh")
    try:
        found = failure("09.group_window", no_plus_one)
    finally:
        i18n.use("en")
    assert "窗口没有 +1：cdiv(8, 4) 个块能覆盖从块边界开始的 tile" in found.invariant


def test_window_of_the_largest_block_size_is_rejected():
    def largest(tile, sizes, circular):
        paged = _paged(sizes, circular)
        return next_power_of_2(cdiv(tile, max(paged)) + 1) if paged else 1

    found = failure("09.group_window", largest)
    assert "two paged groups" in found.case_name
    assert "should be 8, got 2: the window fits the LARGEST block size (8)" in found.invariant


def test_window_counting_a_ring_is_rejected():
    found = failure("09.group_window", lambda t, s, c: next_power_of_2(cdiv(t, min(s)) + 1))
    assert "a ring of 2 beside blocks of 8" in found.case_name
    assert "a circular group's block size was counted" in found.invariant


def test_window_not_a_power_of_two_is_rejected():
    def exact_count(tile, sizes, circular):
        paged = _paged(sizes, circular)
        return cdiv(tile, min(paged)) + 1 if paged else 1

    found = failure("09.group_window", exact_count)
    assert "not a power of two" in found.invariant


# ---------------------------------------------------------------------------------------------
# 09.fused_groups: one kernel with the known mistakes as a constexpr switch
# ---------------------------------------------------------------------------------------------
# The kernel compares MISTAKE with literals: a compiled kernel reads no plain global.
RIGHT, NO_PADDING, FIRST_BLOCK_SIZE, NO_NEGATIVE_GUARD, ROW_ZERO, ROWS_TOKENS_APART = range(6)
UNMASKED_WINDOW, FLOAT_WINDOW, NO_BASE_RESET = 6, 7, 8


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens", "num_reqs"])
def _variant_kernel(
    num_tokens,
    max_num_tokens,
    num_reqs,
    query_start_loc_ptr,
    positions_ptr,
    block_tables_ptr,
    block_tables_group_stride,
    block_table_stride,
    block_sizes_ptr,
    circular_ptr,
    slot_mappings_ptr,
    slot_mappings_stride,
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
    BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
    MISTAKE: tl.constexpr = 0,
    WINDOW_DIVISOR: tl.constexpr = 1,  # 2: a window of half the entries (no +1, see below)
):
    group_idx = tl.program_id(0)
    req_idx = tl.program_id(1)
    if MISTAKE == 4:  # ROW_ZERO
        slot_mapping_ptr = slot_mappings_ptr
    elif MISTAKE == 5:  # ROWS_TOKENS_APART
        slot_mapping_ptr = slot_mappings_ptr + group_idx * max_num_tokens
    else:
        slot_mapping_ptr = slot_mappings_ptr + group_idx * slot_mappings_stride
    if MISTAKE != 1:  # NO_PADDING
        if req_idx == num_reqs:
            for tile_start in range(num_tokens, max_num_tokens, TILE_BLOCK_SIZE):
                offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
                tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=offsets < max_num_tokens)
            return
    if MISTAKE == 2:  # FIRST_BLOCK_SIZE
        block_size = tl.load(block_sizes_ptr)
    else:
        block_size = tl.load(block_sizes_ptr + group_idx)
    is_circular = tl.load(circular_ptr + group_idx) != 0
    row_ptr = block_tables_ptr + group_idx * block_tables_group_stride
    row_ptr += req_idx * block_table_stride
    start_idx = tl.load(query_start_loc_ptr + req_idx)
    end_idx = tl.load(query_start_loc_ptr + req_idx + 1)
    for tile_start in range(start_idx, end_idx, TILE_BLOCK_SIZE):
        offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offsets < end_idx
        pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
        if MISTAKE == 3:  # NO_NEGATIVE_GUARD
            has_slot = mask
            safe_pos = pos
        else:
            has_slot = pos >= 0
            safe_pos = tl.where(has_slot, pos, 0)
        block_indices = tl.where(is_circular, 0, safe_pos // block_size)
        slot_offsets = safe_pos % block_size
        valid = mask & has_slot
        base = tl.min(tl.where(valid, block_indices, 2147483647), axis=0)
        if MISTAKE != 8:  # NO_BASE_RESET
            base = tl.where(base == 2147483647, 0, base)
        window_indices = base + tl.arange(0, BLOCK_TABLE_WINDOW_SIZE // WINDOW_DIVISOR)
        if MISTAKE == 6:  # UNMASKED_WINDOW
            window = tl.load(row_ptr + window_indices)
        else:
            window = tl.load(
                row_ptr + window_indices, mask=window_indices < block_table_stride, other=0
            )
        if MISTAKE == 7:  # FLOAT_WINDOW: exact only below 2^24
            relative = tl.where(valid, block_indices - base, 0)
            block_numbers = tl.gather(window.to(tl.float32), relative, 0).to(tl.int32)
        else:
            block_numbers = tl.gather(window, tl.where(valid, block_indices - base, 0), 0)
        slot_ids = tl.where(has_slot, block_numbers * block_size + slot_offsets, PAD_ID)
        tl.store(slot_mapping_ptr + offsets, slot_ids, mask=mask)


def Variant(mistake: int = RIGHT, **constants) -> KernelVariant:  # noqa: N802
    return KernelVariant(_variant_kernel, MISTAKE=mistake, **constants)


def test_variant_harness_is_right():
    assert run_check(get_exercise("09.fused_groups"), Variant(RIGHT)).passed


def test_forgotten_padding_program_is_rejected():
    found = failure("09.fused_groups", Variant(NO_PADDING))
    assert found.case_name.startswith("named case 'two groups")
    assert found.invariant == (
        "group 0 (blocks of 4): slot_mapping[10] was never written: padding entry 10 (past "
        "the last real token 9)"
    )
    assert "padding program" in found.hint


def test_one_group_block_size_for_all_groups_is_rejected():
    found = failure("09.fused_groups", Variant(FIRST_BLOCK_SIZE))
    assert found.case_name.startswith("named case 'two groups")
    assert found.invariant.startswith(
        "group 1 (a ring of 8): its slots are those of blocks of 4 tokens (group 0 (blocks of "
        "4)'s block size), but its own blocks hold 8"
    )
    assert "own group's block size from block_sizes" in found.hint


def test_window_without_its_plus_one_fails_in_the_kernel():
    # The kernel launched with next_power_of_2(cdiv(tile, b)) entries, half the right window
    # wherever the +1 matters: a tile that starts mid-block reaches past it.
    found = failure("09.fused_groups", Variant(WINDOW_DIVISOR=2))
    if slotmap.BACKEND.interpreted:  # a GPU gathers garbage instead of raising
        assert found.case_name == "named case 'group 1's blocks hold 2 tokens, group 0's 4'"
        assert "a lane gathered outside the window" in found.invariant


def test_negative_positions_not_guarded_are_rejected():
    found = failure("09.fused_groups", Variant(NO_NEGATIVE_GUARD))
    assert "sliding windows only" in found.case_name
    assert found.invariant.startswith(
        "group 0 (a ring of 4): token 0 (request 0) has position -3, before position 0 of its "
        "sliding window: it has no slot and must get PAD_ID -1, got"
    )
    assert "truncates toward zero" in found.hint


def test_every_group_writing_row_zero_is_rejected():
    found = failure("09.fused_groups", Variant(ROW_ZERO))
    assert found.invariant.startswith(
        "group 1 (a ring of 8)'s row was never written, while row 0 was: every group's "
        "programs wrote row 0"
    )
    assert "group_idx * slot_mappings_stride" in found.hint


def test_rows_max_num_tokens_apart_are_rejected():
    found = failure("09.fused_groups", Variant(ROWS_TOKENS_APART))
    assert found.invariant.startswith("a lane wrote ")
    assert "just past the end of group 0 (blocks of 4)'s row (column 12" in found.invariant
    assert "rows are slot_mappings_stride apart, which need not be max_num_tokens" in (
        found.invariant
    )


@pytest.mark.skipif(not slotmap.BACKEND.interpreted, reason="loads are checked interpreted")
def test_an_unmasked_window_load_is_caught_by_the_bounds_check():
    # Group 1's second request sits in blocks 3 and 4 of the last row of the stacked tables:
    # a window of 8 from block 3, unmasked, reads past the tensor's end.
    found = failure("09.fused_groups", Variant(UNMASKED_WINDOW))
    assert found.case_name == "named case 'group 1's blocks hold 2 tokens, group 0's 4'"
    assert found.invariant.startswith("lane 5 (and 2 other lanes) of the load at line ")
    assert "reads block_tables_ptr[32], outside block_tables_ptr's 32 int32 entries" in (
        found.invariant
    )
    assert found.hint.startswith("Mask every load whose lanes can point outside its tensor")


def test_a_float32_window_is_rejected_on_block_numbers_above_2_to_the_24():
    # Passed every check while the cases numbered their blocks below 2^24.
    found = failure("09.fused_groups", Variant(FLOAT_WINDOW))
    assert "block numbers above 2^24" in found.case_name
    assert "(block numbers above 2^24 occur: a table holds blocks up to 2^31 - 1)" in (
        found.invariant
    )
    assert "a float32 holds integers exactly only up to 2^24" in found.invariant
    assert "Keep block numbers int32" in found.hint


@pytest.mark.skipif(not slotmap.BACKEND.interpreted, reason="loads are checked interpreted")
def test_a_window_base_left_at_int32_max_is_caught_by_the_bounds_check():
    # Harmless with the smallest window (1 entry: the sentinel's address is masked), so it
    # passed; with a wider window INT32_MAX + 1 wraps to -2^31 and the load reads far outside.
    found = failure("09.fused_groups", Variant(NO_BASE_RESET))
    assert "launched with a window of 4 entries" in found.case_name
    assert found.invariant.startswith("lane 1 (and 2 other lanes) of the load at line ")
    assert found.invariant.endswith(
        ": request 1's tiles have no lane with a slot (every position is negative), so the "
        "window's base stayed at the INT32_MAX sentinel and INT32_MAX + 1 wrapped to -2^31"
    )
    assert found.hint.startswith("A tile in which no lane has a slot starts its window at 0")


def test_fused_check_wants_a_kernel():
    found = failure("09.fused_groups", lambda *args: None)
    assert "expected a @triton.jit kernel" in found.invariant


def test_named_cases_agree_with_the_library_kernel():
    # The cases are valid batches: the library's fused kernel maps them as the reference does.
    for name, case in lesson09._fused_cases():
        t = lesson09.fused_tensors(case)
        got = slotmap.compute_slot_mappings(
            t["query_start_loc"][: case.num_reqs + 1],
            t["positions"],
            list(t["block_tables"]),
            case.block_sizes,
            circular=case.circular,
            max_num_tokens=case.padded_length,
        )
        assert got.cpu().tolist() == case.expected(), name


# ---------------------------------------------------------------------------------------------
# 09.fused_groups_time
# ---------------------------------------------------------------------------------------------
def measurement(measured_us: float) -> lesson09.TimeMeasurement:
    # mixed, two groups: 167,936 bytes at 4,000 GB/s = 0.042 µs, under the 2.0 µs floor.
    return lesson09.TimeMeasurement("mixed", 2, 6400, 8192, measured_us, 2.0, 4000.0, 1.9)


def test_time_model_is_lesson_08s():
    m = measurement(3.0)
    assert m.predicted_us == lesson08.model_us(6400, 8192, 2, 4000.0, 2.0) == 2.0
    bandwidth_bound = lesson09.TimeMeasurement("huge", 2, 1 << 22, 1 << 22, 9.0, 2.0, 4000.0)
    assert bandwidth_bound.predicted_us == pytest.approx(2 * 12 * (1 << 22) / 4e6)


@pytest.mark.parametrize("measured", [1.0, 2.0, 6.0, 12.0])
def test_a_time_within_the_band_passes(measured):
    assert lesson09.time_verdict(measurement(measured)) is None


def test_a_time_far_above_the_model_is_rejected():
    wrong = lesson09.time_verdict(measurement(12.5))
    assert wrong.invariant.startswith(
        "on mixed with 2 groups your kernel took 12.5 µs a call in a CUDA graph, 6.25x lesson "
        "08's model (max(floor 2 µs, 167,936 bytes / 4,000 GB/s) = 2 µs); up to 6x passes"
    )
    assert "the library's fused kernel took 1.9 µs on the H200" in wrong.invariant
    assert (wrong.expected, wrong.got) == ("at most 12 µs", "12.5 µs")


def test_a_time_far_below_the_model_is_rejected():
    wrong = lesson09.time_verdict(measurement(0.5))
    assert "4x faster than lesson 08's model" in wrong.invariant
    assert "did every program write its row?" in wrong.invariant


@pytest.mark.skipif(slotmap.BACKEND.name == "cuda", reason="the CPU's answer")
def test_time_check_says_it_needs_a_gpu_and_is_skipped_not_passed(solution):
    result = run_check(get_exercise("09.fused_groups_time"), solution.fused_slot_mappings_kernel)
    assert not result.passed and result.failure is None, result.report()
    assert result.skipped == lesson09.NEEDS_GPU.format(slotmap.BACKEND.name)
    assert result.report().startswith("SKIP 09.fused_groups_time: timing needs an NVIDIA GPU")
    assert result.record()["skipped"] == result.skipped  # what slotmap grade reads


@pytest.mark.skipif(slotmap.BACKEND.name == "cuda", reason="the CPU's answer")
def test_time_check_without_a_gpu_still_rejects_a_wrong_kernel():
    found = failure("09.fused_groups_time", Variant(ROW_ZERO))
    assert "'s row was never written, while row 0 was" in found.invariant


@pytest.mark.skipif(slotmap.BACKEND.name != "cuda", reason="times a kernel in a CUDA graph")
def test_time_check_on_a_gpu(solution):
    for shape, groups in lesson09.TIME_SHAPES:
        m = lesson09.measure_fused_time(solution.fused_slot_mappings_kernel, shape, groups)
        ratio = m.measured_us / m.predicted_us
        print(
            f"{shape} x{groups}: {m.measured_us:.3f} us, model {m.predicted_us:.3f} us, "
            f"floor {m.floor_us:.3f} us, copy {m.copy_gbps:.0f} GB/s, ratio {ratio:.2f}"
        )
    result = run_check(get_exercise("09.fused_groups_time"), solution.fused_slot_mappings_kernel)
    assert result.passed, result.report()
