"""Lesson 05 (context parallelism): its checks reject the known mistakes in the partition
invariant's words and accept the solutions; its figures show what the kernel wrote on each
rank; its widget re-runs the kernel; its multi-process run proves the invariant, finds the
collisions of a rejected configuration, and reports a failing rank."""

from __future__ import annotations

import importlib
import shutil
import sys
import time

import pytest
import torch
import triton
import triton.language as tl
from lesson_helpers import ROOT, KernelVariant, code_cells, failure, import_source

import slotmap
from slotmap import cp, reference
from slotmap.distributed import RankContext, RankFailed, run_ranks
from slotmap.exercises import get_exercise, run_check

# One rank per device on an accelerator: a rank function's check spawns two.
needs_two_ranks = pytest.mark.skipif(cp.max_ranks() < 2, reason="two ranks need two devices")

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from slotmap.viz import cp as cp_viz  # noqa: E402

PAD = slotmap.PAD_SLOT_ID


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    """The solution's code cells as a module; a ``%%writefile NAME`` cell is written to NAME
    next to it (importable by spawned ranks: the folder joins sys.path while the module runs)."""
    folder = tmp_path_factory.mktemp("solution05")
    notebook = ROOT / "solutions" / "05_context_parallel.ipynb"
    python = []
    for source in code_cells(notebook):
        first, _, body = source.partition("\n")
        if first.startswith("%%writefile "):
            (folder / first.split()[1]).write_text(body + "\n", encoding="utf-8")
        else:
            python.append(source)
    sys.path.insert(0, str(folder))
    yield import_source(folder / "solution05.py", "\n\n".join(python))
    sys.path.remove(str(folder))


# ---------------------------------------------------------------------------------------------
# 05.is_local
# ---------------------------------------------------------------------------------------------
def test_is_local_solution_passes(solution):
    result = run_check(get_exercise("05.is_local"), solution.is_local)
    assert result.passed, result.report()


def steps(rule):
    """An is_local that gets step 1 right and decides ``stored`` by ``rule``."""

    def is_local(p, r, w, i, kv):
        return p // (kv * w), p % (kv * w), rule(p, r, w, i, kv)

    return is_local


def test_owner_without_the_interleave_is_rejected():
    # I = 1 behaviour: ownership switches every position instead of every I positions.
    found = failure("05.is_local", steps(lambda p, r, w, i, kv: p % w == r))
    assert "interleave 2" in found.case_name
    assert "position 1 is stored by rank 0, but your is_local puts it on rank 1" in found.invariant
    assert "as if the interleave were 1" in found.invariant
    assert found.got == "rank 1"


def test_owner_by_whole_kv_blocks_is_rejected():
    found = failure("05.is_local", steps(lambda p, r, w, i, kv: (p // kv) % w == r))
    assert "whole kv blocks per rank" in found.invariant


def test_segment_without_its_modulo_leaves_positions_without_owner():
    found = failure("05.is_local", steps(lambda p, r, w, i, kv: (p % (kv * w)) // i == r))
    assert found.invariant.startswith("position 2 has no owner")
    assert "False for every rank r in 0..1" in found.invariant
    assert "owner 2 % 2 = 0" in found.expected


def test_a_rank_that_claims_everything_is_rejected():
    found = failure("05.is_local", steps(lambda p, r, w, i, kv: True))
    assert "position 0 is claimed by ranks 0 and 1: exactly one rank may store it" in (
        found.invariant
    )


def test_is_local_must_answer_true_or_false():
    found = failure("05.is_local", steps(lambda p, r, w, i, kv: None))
    assert found.invariant == "is_local(0, 0, 2, 1, 4) returned None, not True or False"


def test_the_one_line_shortcut_alone_is_rejected_for_want_of_step_one():
    # (p // I) % W owns every position right under the launchers' rule (next test), so a
    # bare answer cannot show step 1: the check asks for the virtual block and offset.
    found = failure("05.is_local", lambda p, r, w, i, kv: (p // i) % w == r)
    assert found.invariant == (
        "is_local(0, 0, 2, 1, 4) returned True, not (virtual_block, virtual_offset, stored)"
    )
    assert "step 1" in found.hint


def test_the_shortcut_names_every_owner_under_the_launchers_rule_and_only_there():
    # Decided by testing: every legal configuration (I divides K) agrees with the steps on
    # three virtual blocks; with I not dividing K (rejected by the launchers) they differ.
    illegal = set()
    for w in range(1, 7):
        for kv in range(1, 13):
            for i in range(1, 2 * kv + 1):
                agree = all(
                    (p // i) % w == reference.cp_steps(p, kv, kv, w, i).owner
                    for p in range(3 * kv * w)
                )
                if kv % i == 0:
                    assert agree, (w, i, kv)
                elif not agree:
                    illegal.add((w, i, kv))
    assert (2, 8, 4) in illegal  # position 8: vo = 0, rank 0; the shortcut says rank 1


def test_the_shortcut_with_step_one_passes():
    # Not a mistake: with kv % I == 0 a virtual block is whole rounds of W segments, so
    # (p // I) % W == ((p % V) // I) % W. The check must accept it (the exercise says why).
    shortcut = steps(lambda p, r, w, i, kv: (p // i) % w == r)
    result = run_check(get_exercise("05.is_local"), shortcut)
    assert result.passed, result.report()


@pytest.mark.parametrize(
    ("mistake", "rule", "message"),
    [
        pytest.param(
            "offset in the kv block",
            lambda p, w, kv: (p // (kv * w), p % kv),
            "position 4 sits in virtual block 0 at virtual offset 4, but is_local(4, 0, 2, 1, "
            "4) gives virtual block 0, offset 0",
            id="vo-mod-kv",
        ),
        pytest.param(
            "kv block for the virtual block",
            lambda p, w, kv: (p // kv, p % (kv * w)),
            "position 4 sits in virtual block 0 at virtual offset 4, but is_local(4, 0, 2, 1, "
            "4) gives virtual block 1, offset 4",
            id="vb-by-kv",
        ),
    ],
)
def test_a_wrong_step_one_is_named_though_every_owner_is_right(mistake, rule, message):
    def is_local(p, r, w, i, kv):
        return (*rule(p, w, kv), (p // i) % w == r)

    found = failure("05.is_local", is_local)
    assert found.invariant == message, mistake
    assert found.got == f"virtual block {message.split('virtual block ')[-1]}"


# ---------------------------------------------------------------------------------------------
# 05.local_block_and_offset
# ---------------------------------------------------------------------------------------------
def _local(position, block_size, kv, world, interleave, *, mistake=""):
    virtual_block, vo = divmod(position, kv * world)
    if mistake == "p instead of vo":
        vo = position
    if mistake == "no * I":
        lo = vo // (world * interleave) + vo % interleave
    else:
        lo = vo // (world * interleave) * interleave + vo % interleave
    per = 1 if mistake == "no blocks per kv block" else kv // block_size
    block = (0 if mistake == "no virtual block" else virtual_block * per) + lo // block_size
    offset = lo if mistake == "offset not reduced" else lo % block_size
    return block, offset


def test_local_block_and_offset_solution_passes(solution):
    result = run_check(get_exercise("05.local_block_and_offset"), solution.local_block_and_offset)
    assert result.passed, result.report()


def test_local_variant_harness_is_right():
    assert run_check(get_exercise("05.local_block_and_offset"), _local).passed


def local_failure(mistake: str):
    return failure("05.local_block_and_offset", lambda *args: _local(*args, mistake=mistake))


def test_packing_without_the_interleave_factor_collides():
    found = local_failure("no * I")
    assert found.invariant == (
        "positions 1 and 4 both land on rank 0 at logical block 0, offset 1: they would "
        "share a slot"
    )
    assert "position 4: logical block 0, offset 2 (local position 2)" in found.expected


def test_forgotten_virtual_block_collides():
    found = local_failure("no virtual block")
    assert "positions 0 and 8 both land on rank 0 at logical block 0, offset 0" in found.invariant


def test_forgotten_blocks_per_kv_block_collides_with_hybrid_blocks():
    found = local_failure("no blocks per kv block")
    assert "hybrid" in found.case_name
    assert "positions 8 and 16 both land on rank 0 at logical block 1, offset 0" in (
        found.invariant
    )


def test_the_plain_formula_leaves_holes():
    found = failure("05.local_block_and_offset", lambda p, bs, kv, w, i: divmod(p, bs))
    assert found.invariant.startswith("rank 0 is not packed: its local position 1")
    assert found.got == "local positions [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]"


def test_packing_the_position_instead_of_the_virtual_offset_leaves_holes():
    found = local_failure("p instead of vo")
    assert "rank 0 is not packed: its local position 4" in found.invariant


def test_an_offset_outside_the_block_is_named():
    found = local_failure("offset not reduced")
    assert "an offset is in 0..3" in found.invariant


@pytest.mark.parametrize("exercise", ["05.is_local", "05.local_block_and_offset", "05.cp_kernel"])
def test_hints_name_the_steps_without_printing_the_solution(exercise):
    hint = get_exercise(exercise).hint
    assert "Step" in hint or "step" in hint
    for formula in (
        "lo =",
        "vo =",
        "% W",
        "// (W",
        "* I",
        "== r",
        "lo // block_size",
        "has_slot =",
        "block_indices =",
        "lo % ",
    ):
        assert formula not in hint, (exercise, formula)


def test_a_failure_leads_with_the_broken_invariant_and_the_step_in_its_hint():
    found = local_failure("no * I")
    assert found.hint.startswith("Step 3 packs this rank's segments")
    assert "whole rounds of W·I positions" in found.hint


# ---------------------------------------------------------------------------------------------
# 05.cp_kernel: one kernel with the known mistakes as a constexpr switch
# ---------------------------------------------------------------------------------------------
RIGHT, INTERLEAVE_ONE, NO_TIMES_I, EVERY_RANK, NO_MODULO_W, NO_STORE_MASK = range(6)


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
    KV_CACHE_BLOCK_SIZE: tl.constexpr,
    BLOCKS_PER_KV_BLOCK: tl.constexpr,
    TOTAL_CP_WORLD_SIZE: tl.constexpr,
    TOTAL_CP_RANK: tl.constexpr,
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
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
    W: tl.constexpr = TOTAL_CP_WORLD_SIZE
    I: tl.constexpr = CP_KV_CACHE_INTERLEAVE_SIZE  # noqa: E741 - the lesson's name
    for tile_start in range(start_idx, end_idx, TILE_BLOCK_SIZE):
        offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offsets < end_idx
        pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
        vb = pos // (KV_CACHE_BLOCK_SIZE * W)
        vo = pos % (KV_CACHE_BLOCK_SIZE * W)
        if MISTAKE == 1:
            has_slot = vo % W == TOTAL_CP_RANK
        elif MISTAKE == 3:
            has_slot = pos == pos
        elif MISTAKE == 4:
            has_slot = vo // I == TOTAL_CP_RANK
        else:
            has_slot = (vo // I) % W == TOTAL_CP_RANK
        if MISTAKE == 2:
            lo = vo // (W * I) + vo % I
        else:
            lo = vo // (W * I) * I + vo % I
        block_indices = vb * BLOCKS_PER_KV_BLOCK + lo // block_size
        slot_offsets = lo % block_size
        block_numbers = tl.load(
            block_table_ptr + req_idx * block_table_stride + block_indices,
            mask=mask & has_slot,
            other=0,
        )
        slot_ids = tl.where(has_slot, block_numbers * block_size + slot_offsets, PAD_ID)
        if MISTAKE == 5:
            tl.store(slot_mapping_ptr + offsets, slot_ids)
        else:
            tl.store(slot_mapping_ptr + offsets, slot_ids, mask=mask)


@triton.jit
def _stub_kernel(
    num_tokens,
    max_num_tokens,
    query_start_loc_ptr,
    positions_ptr,
    block_table_ptr,
    block_table_stride,
    block_size,
    slot_mapping_ptr,
    KV_CACHE_BLOCK_SIZE: tl.constexpr,
    BLOCKS_PER_KV_BLOCK: tl.constexpr,
    TOTAL_CP_WORLD_SIZE: tl.constexpr,
    TOTAL_CP_RANK: tl.constexpr,
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # YOUR CODE HERE
    raise NotImplementedError()


def Variant(mistake: int) -> KernelVariant:  # noqa: N802 - reads like the class it returns
    return KernelVariant(_variant_kernel, MISTAKE=mistake)


def test_cp_kernel_solution_passes(solution):
    result = run_check(get_exercise("05.cp_kernel"), solution.cp_kernel)
    assert result.passed, result.report()


def test_cp_kernel_variant_harness_is_right():
    result = run_check(get_exercise("05.cp_kernel"), Variant(RIGHT))
    assert result.passed, result.report()


def test_kernel_owner_without_the_interleave_is_rejected():
    found = failure("05.cp_kernel", Variant(INTERLEAVE_ONE))
    assert "interleave 2" in found.case_name
    assert found.invariant == (
        "token 1 (request 0, position 1) is stored by rank 1, but it belongs to rank 0"
    )


def test_kernel_packing_without_the_interleave_factor_collides():
    found = failure("05.cp_kernel", Variant(NO_TIMES_I))
    assert "positions 1 and 4 (tokens 1 and 4) both land on rank 0 in slot 21" in found.invariant


def test_kernel_without_ownership_stores_every_token_on_every_rank():
    found = failure("05.cp_kernel", Variant(EVERY_RANK))
    assert "token 0 (request 0, position 0) is stored by ranks [0, 1]" in found.invariant
    assert "exactly one rank may store it" in found.invariant


def test_kernel_segment_without_its_modulo_leaves_tokens_without_owner():
    found = failure("05.cp_kernel", Variant(NO_MODULO_W))
    assert "token 2 (request 0, position 2) has no owner: every rank wrote PAD_ID" in (
        found.invariant
    )


def test_kernel_missing_store_mask_is_rejected():
    found = failure("05.cp_kernel", Variant(NO_STORE_MASK))
    assert found.invariant.startswith("on rank 0: ")
    assert "past the request's end" in found.invariant or "padding entry" in found.invariant


def test_an_unfinished_kernel_is_reported_as_not_done():
    found = failure("05.cp_kernel", _stub_kernel)
    assert found.invariant.startswith("not done yet")


# ---------------------------------------------------------------------------------------------
# 05.rank_fn: real ranks (each spawn imports torch: few cases)
# ---------------------------------------------------------------------------------------------
RANK_FN_MODULE = """
import slotmap


def rank_fn(ctx, batch):
    query_start_loc, positions, block_table = batch.tensors(ctx.rank, ctx.device)
    slots = slotmap.compute_slot_mapping(
        query_start_loc, positions, block_table, batch.block_size,
        kv_cache_block_size=batch.kv_cache_block_size, cp_world_size=ctx.world_size,
        cp_rank={cp_rank}, cp_interleave=batch.interleave, max_num_tokens=batch.max_num_tokens,
    )
    return slots.cpu().tolist()


def stub(ctx, batch):
    # YOUR CODE HERE
    raise NotImplementedError()
"""


@pytest.fixture(scope="module")
def rank_fns(tmp_path_factory):
    """Modules a spawned rank can import: the right rank_fn, and one where every rank passes
    cp_rank 0."""
    folder = tmp_path_factory.mktemp("rank_fns")
    for name, cp_rank in (("rank_fn_right", "ctx.rank"), ("rank_fn_rank_zero", "0")):
        (folder / f"{name}.py").write_text(RANK_FN_MODULE.format(cp_rank=cp_rank))
    sys.path.insert(0, str(folder))
    yield {n: importlib.import_module(n) for n in ("rank_fn_right", "rank_fn_rank_zero")}
    sys.path.remove(str(folder))


@needs_two_ranks
def test_rank_fn_solution_passes_after_a_notebook_kernel_ran_under_the_interpreter(
    solution, monkeypatch
):
    # Triton's interpreter copies its globals, __file__ included, into a notebook kernel's
    # (__main__'s): spawned ranks then ran interpreter.py as __main__ and died on import. One
    # check of the solution's rank_fn, every case spawning ranks, under such a __main__.
    import my_rank_fn  # written by the solution's %%writefile cell
    from triton.runtime import interpreter

    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__spec__", None)  # a kernel's __main__ is no module run by name
    monkeypatch.setattr(main, "__file__", interpreter.__file__, raising=False)
    result = run_check(get_exercise("05.rank_fn"), my_rank_fn.rank_fn)
    assert result.passed, result.report()
    assert (result.named, result.random) == (2, 0)  # named cases only: every one spawns ranks
    assert main.__file__ == interpreter.__file__  # put back as it was


@needs_two_ranks
def test_the_solution_grades_pass_under_slotmap_grade(tmp_path):
    # The grader's kernel writes my_rank_fn.py in its own folder, and its ranks start: under
    # root, as a user of its own, its interpreter must start again (the sandbox's probe).
    from slotmap.exercises.grade import GradeOptions, grade_folder

    folder = tmp_path / "submissions"
    folder.mkdir()
    shutil.copy(ROOT / "solutions" / "05_context_parallel.ipynb", folder)
    (graded,) = grade_folder(folder, options=GradeOptions(timeout=120))
    assert graded.results == dict.fromkeys(
        ("05.is_local", "05.local_block_and_offset", "05.cp_kernel", "05.rank_fn"), "PASS"
    ), graded


@needs_two_ranks
def test_rank_fn_where_every_rank_is_rank_zero_is_rejected(rank_fns):
    found = failure("05.rank_fn", rank_fns["rank_fn_rank_zero"].rank_fn)
    assert "two ranks, interleave 2" in found.case_name
    assert found.invariant == (
        "token 0 (position 0) is stored by ranks [0, 1]: exactly one rank may store it "
        "(does every rank pass its own cp_rank?)"
    )


@needs_two_ranks
def test_an_unfinished_rank_fn_is_reported_as_not_done(rank_fns):
    found = failure("05.rank_fn", rank_fns["rank_fn_right"].stub)
    assert found.invariant.startswith("not done yet")


@needs_two_ranks
def test_a_rank_fn_defined_in_the_notebook_is_sent_to_a_module():
    def rank_fn(ctx, batch):
        return []

    found = failure("05.rank_fn", rank_fn)
    assert found.invariant.startswith("run_ranks cannot start 'rank_fn'")
    assert "%%writefile" in found.hint


@needs_two_ranks
def test_a_rank_fn_defined_in_the_notebook_is_sent_to_a_module_in_chinese_too():
    """The judge tells run_ranks' refusal apart by its class: its words are translated."""
    from slotmap import i18n

    def rank_fn(ctx, batch):
        return []

    i18n.use("zh")
    try:
        found = failure("05.rank_fn", rank_fn)
    finally:
        i18n.use("en")
    assert "请把它放进一个模块" in found.invariant, found.invariant
    assert "%%writefile" in found.hint


def test_a_rank_fn_from_a_notebook_cell_after_a_kernel_ran_is_sent_to_a_module(monkeypatch):
    # After a notebook kernel ran under the interpreter, __main__ carries interpreter.py's
    # __file__ and looks like a script: the ranks started, died on "Can't get attribute
    # 'rank_fn' on <module '__main__'>" (in stderr only) and the check said "rank 0 died".
    from triton.runtime import interpreter

    def rank_fn(ctx, batch):
        return []

    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__file__", interpreter.__file__, raising=False)
    monkeypatch.setattr(rank_fn, "__module__", "__main__")
    monkeypatch.setattr(rank_fn, "__qualname__", "rank_fn")  # a cell's function: no <locals>
    found = failure("05.rank_fn", rank_fn)
    assert found.invariant.startswith("'rank_fn' is defined in a notebook cell")
    assert "rank functions must live in a module" in found.invariant
    assert "Can't get attribute 'rank_fn' on <module '__main__'>" in found.invariant
    assert "%%writefile my_rank_fn.py" in found.hint and "my_rank_fn.rank_fn" in found.hint


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------
def gids(ax, prefix: str) -> list:
    return [p for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


@pytest.mark.parametrize(
    ("world", "rank", "interleave", "kv", "length"),
    [
        pytest.param(2, 0, 2, 4, 20, id="W2-I2"),
        pytest.param(3, 2, 2, 4, 23, id="W3-I2-rank2"),
        pytest.param(4, 1, 1, 8, 32, id="W4-I1"),
        pytest.param(1, 0, 1, 4, 5, id="no-cp"),
    ],
)
def test_ownership_figure_shows_what_each_ranks_kernel_wrote(world, rank, interleave, kv, length):
    fig = cp_viz.draw_ownership(world, rank, interleave, kv, length)
    ax = fig.axes[0]
    run = fig.slotmap_run
    assert run.valid
    for r in range(world):
        n = cp.local_length(length, world, r, interleave, kv)
        # Top row: one box per position the rank owns, in its colour.
        assert len(gids(ax, f"position-rank-{r}")) == n
        # Its local layout: n boxes, labelled with its positions in order (packed).
        assert len(gids(ax, f"local-rank-{r}")) == n
        # Its kernel's output is the oracle's.
        assert run.slots[r] == cp.expected_slots(run.batch, r)
    assert not gids(ax, "position-bad") and not gids(ax, "local-collision")
    # The bottom row: the chosen rank's slot mapping, PAD where another rank owns the token.
    slot_labels = [t.get_text() for t in ax.texts if t.get_gid() == "slot-label"]
    expected = cp.expected_slots(run.batch, rank)
    assert slot_labels == ["PAD" if s == PAD else str(s) for s in expected]
    assert len(gids(ax, "slot-pad")) == length - cp.local_length(
        length, world, rank, interleave, kv
    )


def test_ownership_figure_explains_the_outline_in_its_legend():
    fig = cp_viz.draw_ownership(
        world_size=3, rank=1, interleave=2, kv_cache_block_size=4, seq_len=20
    )
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "outlined: rank 1's positions" in labels
    outlined = [
        p
        for p in fig.axes[0].patches
        if (p.get_gid() or "").startswith("position-") and p.get_linewidth() == 2.0
    ]
    assert len(outlined) == cp.local_length(20, 3, 1, 2, 4)


def _text_boxes(fig, gid: str):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [
        t.get_window_extent(renderer)
        for ax in fig.axes
        for t in ax.texts
        if t.get_gid() == gid and t.get_text()
    ]


@pytest.mark.parametrize(
    ("world", "rank", "interleave", "kv", "length"),
    [
        pytest.param(2, 0, 1, 2, 32, id="kv2-W2-32"),
        pytest.param(1, 0, 1, 2, 32, id="kv2-W1-32"),
        pytest.param(1, 0, 1, 6, 32, id="kv6-W1-32"),
        pytest.param(4, 3, 1, 8, 32, id="W4-kv8"),
        pytest.param(4, 0, 8, 2, 32, id="rejected-W4-I8-kv2"),
        pytest.param(1, 0, 1, 8, 1, id="one-position"),
    ],
)
def test_ownership_figure_fits_every_row_and_label_at_the_widget_extremes(
    world, rank, interleave, kv, length
):
    fig = cp_viz.draw_ownership(world, rank, interleave, kv, length)
    ax = fig.axes[0]
    # The figure is as wide as its widest row: no box beyond the axes' right end.
    right = max(p.get_x() + p.get_width() for p in ax.patches)
    assert right <= ax.get_xlim()[1]
    # Labels over blocks and virtual blocks never overlap their neighbours.
    for gid in ("block-label", "virtual-block-label"):
        extents = sorted(_text_boxes(fig, gid), key=lambda b: (round(b.y0), b.x0))
        for left, next_one in zip(extents, extents[1:], strict=False):
            if abs(left.y0 - next_one.y0) < 1:  # same row
                assert left.x1 <= next_one.x0, gid
    # Nothing is drawn past the figure's edges.
    width, height = fig.bbox.width, fig.bbox.height
    texts = [t for a in fig.axes for t in a.texts] + [fig._suptitle]
    texts += [t for legend in fig.legends for t in legend.get_texts()]
    renderer = fig.canvas.get_renderer()
    for text in texts:
        box = text.get_window_extent(renderer)
        assert box.x0 >= -0.5 and box.x1 <= width + 0.5, text.get_text()
        assert box.y0 >= -0.5 and box.y1 <= height + 0.5, text.get_text()


def test_ownership_figure_shortens_block_labels_that_do_not_fit():
    wide = cp_viz.draw_ownership(
        world_size=1, rank=0, interleave=1, kv_cache_block_size=6, seq_len=32
    )
    labels = [t.get_text() for t in wide.axes[0].texts if t.get_gid() == "block-label"]
    assert labels[0].startswith("block 0 → physical ") and len(labels) == 6
    narrow = cp_viz.draw_ownership(
        world_size=2, rank=0, interleave=1, kv_cache_block_size=2, seq_len=32
    )
    run = narrow.slotmap_run
    labels = [t.get_text() for t in narrow.axes[0].texts if t.get_gid() == "block-label"]
    assert labels[:2] == [f"b0→{run.tables[0][0]}", f"b1→{run.tables[0][1]}"]
    vb = [
        t.get_text()
        for t in cp_viz.draw_ownership(1, 0, 1, 2, 32).axes[0].texts
        if t.get_gid() == "virtual-block-label"
    ]
    assert vb[0] == "vb 0" and len(vb) == 16


def test_ownership_figure_shows_the_rejected_configuration_colliding():
    fig = cp_viz.draw_ownership(
        world_size=2, rank=0, interleave=8, kv_cache_block_size=4, seq_len=16
    )
    run = fig.slotmap_run
    assert not run.valid
    assert "not a multiple of cp_interleave 8" in run.launcher_message
    ax = fig.axes[0]
    # Positions 4..7 and 8..11 share rank 0's local positions 4..7: four red boxes.
    assert len(gids(ax, "local-collision")) == 4
    labels = {t.get_text() for t in ax.texts}
    assert {"4|8", "5|9", "6|10", "7|11"} <= labels
    assert len(gids(ax, "slot-collision")) == 8  # the eight tokens whose slot is taken twice
    assert len(gids(ax, "local-rank-1")) == 0  # rank 1 stores nothing
    assert "REJECTED" in fig._suptitle.get_text()


def test_five_steps_figure_matches_the_reference_and_the_kernel():
    fig = cp_viz.draw_five_steps(
        world_size=3, interleave=2, kv_cache_block_size=4, block_size=2, num_positions=20
    )
    for p, steps in enumerate(fig.slotmap_steps):
        assert steps.owner == cp.owner_of(p, 3, 2, 4)
        assert steps.block * 2 + steps.offset == cp.local_position(p, 3, 2, 4)
    batch = cp.CPBatch((20,), 2, 4, 3, 2)
    expected = [cp.expected_slots(batch, cp.owner_of(p, 3, 2, 4))[p] for p in range(20)]
    assert fig.slotmap_slots == expected
    slot_row = fig.axes[-1]
    assert [t.get_text() for t in slot_row.texts][:20] == [str(s) for s in expected]


def test_five_steps_figure_shows_the_block_tables_step_5_reads():
    fig = cp_viz.draw_five_steps(
        world_size=2, interleave=2, kv_cache_block_size=4, block_size=4, num_positions=20
    )
    tables = fig.slotmap_tables
    shown = [t.get_text() for t in fig.texts if t.get_gid() == "block-table"]
    assert shown == ["block tables"] + [f"rank {r}: {tables[r]}" for r in range(2)]
    for s, slot in zip(fig.slotmap_steps, fig.slotmap_slots, strict=True):
        assert s.block == s.virtual_block and s.offset == s.local_offset  # B = K: the plain case
        assert slot == tables[s.owner][s.block] * 4 + s.offset  # step 5, by hand


# ---------------------------------------------------------------------------------------------
# Widget
# ---------------------------------------------------------------------------------------------
def test_ownership_widget_redraws_on_a_change():
    pytest.importorskip("ipywidgets")
    box = cp_viz.ownership_widget()
    first = box.figure
    box.controls["world_size"].value = 3
    assert box.controls["rank"].max == 2
    box.controls["rank"].value = 2
    start = time.perf_counter()
    box.controls["interleave"].value = 1
    elapsed = time.perf_counter() - start
    run = box.figure.slotmap_run
    assert box.figure is not first
    assert (run.batch.world_size, run.batch.interleave) == (3, 1)
    assert run.slots[2] == cp.expected_slots(run.batch, 2)
    box.controls["world_size"].value = 1  # the rank slider follows: only rank 0 is left
    assert box.controls["rank"].value == 0
    assert box.figure.slotmap_run.batch.world_size == 1
    print(f"ownership widget update: {elapsed * 1000:.0f} ms")


# ---------------------------------------------------------------------------------------------
# The multi-process run (gloo on the CPU; one device per rank elsewhere)
# ---------------------------------------------------------------------------------------------
needs = pytest.mark.skipif(cp.max_ranks() < 3, reason="needs 3 devices of this backend")
needs2 = pytest.mark.skipif(cp.max_ranks() < 2, reason="needs 2 devices of this backend")
BATCH = cp.CPBatch((13, 1, 6), 2, 4, 3, 2, starts=(0, 21, 5), max_num_tokens=23, seed=1)
REJECTED = cp.CPBatch((16,), 4, 4, 2, 8)


@pytest.fixture(scope="module")
def evidence():
    return run_ranks(cp.cp_slot_mapping_rank, 3, BATCH, timeout_s=90)


@needs
def test_the_ranks_prove_every_token_has_exactly_one_slot(evidence):
    assert [e.rank for e in evidence] == [0, 1, 2]
    assert len({e.pid for e in evidence}) == 3
    assert all(
        e.communication == {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}[slotmap.BACKEND.name]
        for e in evidence
    )
    for e in evidence:
        assert e.proved and e.packed and e.padding_ok and e.agrees_with_reference
        assert e.slots == cp.expected_slots(BATCH, e.rank)  # the production kernel's output
        assert e.owner_count == [1] * BATCH.num_tokens  # the all_reduce
        assert e.collisions == [] and e.notes == []
    # The all_gather: every rank saw the same ownership, and it is the formula's.
    assert all(e.owners == evidence[0].owners for e in evidence)
    for token, p in enumerate(BATCH.positions):
        column = [evidence[0].owners[r][token] for r in range(3)]
        assert column == [int(r == cp.owner_of(p, 3, 2, 4)) for r in range(3)]


@needs
def test_the_rank_run_figure_draws_the_evidence(evidence):
    fig = cp_viz.draw_rank_run(evidence, BATCH)
    ax = fig.axes[0]
    assert len(gids(ax, "count-ok")) == BATCH.num_tokens and not gids(ax, "count-bad")
    for e in evidence:
        assert len(gids(ax, f"slot-rank-{e.rank}")) == sum(e.owners[e.rank])
    assert "proved it" in fig._suptitle.get_text()


@needs2
def test_the_ranks_find_the_collisions_of_the_rejected_configuration():
    unchecked = cp.CPBatch(**{**REJECTED.__dict__, "skip_launcher_checks": True})
    results = run_ranks(cp.cp_slot_mapping_rank, 2, unchecked, timeout_s=90)
    assert not any(e.proved for e in results)  # the group's verdict reached both ranks
    assert results[0].collisions == [(4, 8, 4), (5, 9, 5), (6, 10, 6), (7, 11, 7)]
    assert "tokens 4 and 8 collide in slot 4 on rank 0" in results[0].notes
    assert results[1].owners[1] == [0] * 16  # rank 1 stores nothing
    assert results[0].owner_count == [1] * 16  # ownership alone cannot see the collision
    fig = cp_viz.draw_rank_run(results, unchecked)
    assert "NOT PROVED" in fig._suptitle.get_text()


@needs2
def test_a_rejected_configuration_fails_every_rank_and_run_ranks_reports_it():
    start = time.monotonic()
    with pytest.raises(
        RankFailed,
        match=r"rank \d:(.|\n)*kv_cache_block_size 4 is not a "
        r"multiple of cp_interleave 8",
    ):
        run_ranks(cp.cp_slot_mapping_rank, 2, REJECTED, timeout_s=60)
    assert time.monotonic() - start < 50


def test_a_rank_refuses_a_batch_for_another_world():
    # Checked before any collective, so it needs no process group.
    ctx = RankContext(0, 3, torch.device("cpu"), "cpu", "gloo")
    with pytest.raises(ValueError, match="the batch is for 2 ranks, the group has 3"):
        cp.cp_slot_mapping_rank(ctx, REJECTED)


@needs2
def test_the_ranks_say_what_broke_in_the_learners_language(monkeypatch):
    # Each rank is a process of its own: it speaks what $SLOTMAP_LANG says, as a kernel does.
    monkeypatch.setenv("SLOTMAP_LANG", "zh")
    unchecked = cp.CPBatch(**{**REJECTED.__dict__, "skip_launcher_checks": True})
    results = run_ranks(cp.cp_slot_mapping_rank, 2, unchecked, timeout_s=90)
    assert "token 4 和 token 8 在 rank 0 上撞在了同一个槽位 4" in results[0].notes
