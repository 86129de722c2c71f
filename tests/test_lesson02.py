"""Lesson 02: the kernel exercise rejects known-wrong kernels, the solution passes, and the
tiles figure and widget show what the production kernel wrote."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest
import torch
from lesson_helpers import ROOT, TRITON_IMPORTS, by_gid, failure, import_source

import slotmap  # chooses the backend before any kernel below is decorated
from slotmap.exercises import get_exercise, run_check

matplotlib.use("Agg")

SOLUTION = ROOT / "solutions" / "02_first_kernel.ipynb"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def solution_kernel_source() -> str:
    """The solution notebook's kernel cell, answer included."""
    cells = json.loads(SOLUTION.read_text())["cells"]
    (source,) = [
        "".join(c["source"])
        for c in cells
        if c["cell_type"] == "code" and BEGIN in "".join(c["source"])
    ]
    return "\n".join(line for line in source.split("\n") if line.strip() not in (BEGIN, END))


def load_kernel(tmp_path: Path, source: str, name: str = "first_kernel"):
    """Triton needs a kernel's source file: write one and import it."""
    path = tmp_path / f"kernel_{abs(hash(source))}.py"
    return getattr(import_source(path, TRITON_IMPORTS + source), name)


def mutate(source: str, old: str, new: str) -> str:
    assert old in source, f"the solution no longer contains {old!r}"
    return source.replace(old, new)


def test_solution_passes(tmp_path):
    kernel = load_kernel(tmp_path, solution_kernel_source())
    assert run_check(get_exercise("02.first_kernel"), kernel).passed


MUTANTS = {
    "missing-store-mask": (
        "tl.store(slot_mapping_ptr + offsets, slot_ids, mask=mask)",
        "tl.store(slot_mapping_ptr + offsets, slot_ids)",
        "past the request's end",
    ),
    "forgotten-padding-program": (
        "if req_idx == tl.num_programs(0) - 1:",
        "if req_idx == tl.num_programs(0) + 1:",
        "never written: padding entry",
    ),
    "padding-store-without-mask": (
        "tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=offsets < max_num_tokens)",
        "tl.store(slot_mapping_ptr + offsets, PAD_ID)",
        "the padding program wrote PAD_ID -1 at out[13], past the end of the output",
    ),
    "off-by-one-block-index": (
        "block_indices = pos // block_size",
        "block_indices = pos // block_size + 1",
        "the logical block index is off by one",
    ),
    "tile-loop-skips-last-partial-tile": (
        "range(start_idx, end_idx, TILE_BLOCK_SIZE)",
        "range(start_idx, end_idx - TILE_BLOCK_SIZE + 1, TILE_BLOCK_SIZE)",
        "never written: token",
    ),
    "missing-positions-load-mask": (
        "pos = tl.load(positions_ptr + offsets, mask=mask, other=0)",
        "pos = tl.load(positions_ptr + offsets)",
        "of the load at line",
    ),
    "offset-from-wrong-divisor": (  # once only "tokens 2 and 3 collide in slot 11"
        "pos % block_size",
        "pos % TILE_BLOCK_SIZE",
        "an offset of 5 is outside a block of 3 slots (the offset is 5 % 3 = 2)",
    ),
}


# An unmasked load is only caught where the check can see it: under Triton's interpreter,
# whose loads the check bounds (slotmap.exercises.cases.checked_launch).
INTERPRETED_ONLY = {"missing-positions-load-mask"}
interpreted_only = pytest.mark.skipif(
    not slotmap.BACKEND.interpreted, reason="the bounds check wraps the interpreter's loads"
)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=interpreted_only) if n in INTERPRETED_ONLY else n
        for n in sorted(MUTANTS)
    ],
)
def test_rejects_known_wrong_kernel(tmp_path, name):
    old, new, words = MUTANTS[name]
    kernel = load_kernel(tmp_path, mutate(solution_kernel_source(), old, new))
    result = run_check(get_exercise("02.first_kernel"), kernel)
    assert not result.passed, f"{name} passed the check"
    assert words in result.failure.invariant, result.report()


def test_missing_mask_is_caught_by_the_partial_tile_case(tmp_path):
    old, new, _ = MUTANTS["missing-store-mask"]
    kernel = load_kernel(tmp_path, mutate(solution_kernel_source(), old, new))
    result = run_check(get_exercise("02.first_kernel"), kernel)
    assert "ends in a partial tile, no padding tail" in result.failure.case_name


@interpreted_only
def test_an_unmasked_positions_load_is_named_with_lane_tensor_and_address(tmp_path):
    old, new, _ = MUTANTS["missing-positions-load-mask"]
    kernel = load_kernel(tmp_path, mutate(solution_kernel_source(), old, new))
    found = run_check(get_exercise("02.first_kernel"), kernel).failure
    # Case 1's request fills its tile. In case 2 the last request, tokens 5..10, ends in the
    # tile 9..12: its lanes 2 and 3 read positions[11] and [12], past the 11 positions.
    assert "the last request ends in a partial tile" in found.case_name
    assert found.invariant.startswith("lane 2 (and 1 other lane) of the load at line ")
    assert "pos = tl.load(positions_ptr + offsets)" in found.invariant
    assert "reads positions_ptr[11], outside positions_ptr's 11 int64 entries [0, 11)" in (
        found.invariant
    )


@pytest.mark.skipif(not slotmap.BACKEND.interpreted, reason="a compiled kernel is right there")
def test_a_kernel_decorated_before_the_interpreter_was_chosen_is_named(tmp_path):
    # @triton.jit before `import slotmap.course` gives a JITFunction, compiled for a device:
    # the check said "0 active drivers" with the exercise's hint about tile loops.
    from triton.runtime.jit import JITFunction

    compiled = JITFunction(load_kernel(tmp_path, solution_kernel_source()).fn)
    found = failure("02.first_kernel", compiled)
    assert found.invariant.startswith("your kernel was compiled for a GPU, not run by Triton's")
    assert "before `import slotmap.course` chose the interpreter" in found.invariant
    assert "'0 active drivers'" in found.invariant
    assert found.hint.startswith("Restart the kernel and run the notebook from the top")


def test_rejects_a_plain_python_function():
    result = run_check(get_exercise("02.first_kernel"), lambda *args: None)
    assert "@triton.jit kernel itself" in result.failure.invariant


# --- figure and widget --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lengths, tile, padding",
    [((5, 11, 3), 4, 6), ((8, 0, 4), 4, 0), ((12, 12, 12), 8, 10), ((3, 1), 2, 3)],
)
def test_draw_tiles_shows_every_lane(lengths, tile, padding):
    import matplotlib.pyplot as plt

    from slotmap.viz.tiles import draw_run, run_tiles

    run = run_tiles(lengths, 4, tile, padding)
    fig = draw_run(run)
    num_tokens, max_num_tokens = sum(lengths), sum(lengths) + padding
    # Every output entry was stored by exactly one lane; the rest of each tile is masked.
    assert len(by_gid(fig, "lane")) == max_num_tokens
    tiles = sum(-(-n // tile) for n in lengths) + -(-padding // tile)
    assert len(by_gid(fig, "tile")) == tiles
    assert len(by_gid(fig, "masked")) == tiles * tile - max_num_tokens
    # Lane labels and the output row are the kernel's output, equal to the reference's.
    table = torch.tensor(run_table(run), dtype=torch.int32)
    expected = slotmap.slot_mapping_oracle(
        torch.tensor(run.starts, dtype=torch.int32),
        torch.tensor(run.positions, dtype=torch.int64),
        table,
        4,
        max_num_tokens=max_num_tokens,
    ).tolist()
    out = [int(t.get_text()) for t in by_gid(fig, "out", "text")]
    out += [int(t.get_text()) for t in by_gid(fig, "out-pad", "text")]
    assert out == expected
    assert not by_gid(fig, "unwritten") and not by_gid(fig, "guard-written")
    assert len(by_gid(fig, "guard")) == tile
    assert num_tokens == len(by_gid(fig, "batch"))
    plt.close(fig)


def run_table(run):
    """The block table run_tiles built, recovered from the slots (slot // block_size)."""
    table = []
    for q in range(run.num_reqs):
        row = {}
        for t in range(run.starts[q], run.starts[q + 1]):
            row[run.positions[t] // run.block_size] = run.output[t] // run.block_size
        table.append([row.get(b, 0) for b in range(max(row, default=0) + 1)])
    width = max(len(r) for r in table)
    return [r + [0] * (width - len(r)) for r in table]


def test_one_program_fewer_loses_the_last_request():
    import matplotlib.pyplot as plt

    from slotmap.viz.tiles import draw_tiles

    fig = draw_tiles((5, 11, 3), 4, 4, 6, programs=3)
    assert len(by_gid(fig, "lost")) == 3  # request 2's tokens: padded, never computed
    assert not by_gid(fig, "unwritten")  # every entry is written, whatever the grid
    assert len(by_gid(fig, "out-pad")) == 6  # the padding program still padded
    plt.close(fig)


def test_tiles_widget_redraws_on_change():
    from slotmap.viz.tiles import tiles_widget

    box = tiles_widget((5, 11, 3), tile_size=4, padding=6)
    first = box.figure
    assert not by_gid(first, "lost")
    box.controls["short"].value = True  # launch one program fewer
    assert box.figure is not first
    assert len(by_gid(box.figure, "lost")) == 3
    box.controls["tile_size"].value = 8  # tiles of 8 lanes
    assert len(by_gid(box.figure, "tile")) == 1 + 2 + 1  # requests 0 and 1, then padding
