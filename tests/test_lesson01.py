"""Lesson 01: the exercises reject known-wrong answers, the solutions pass, and the figure and
widget show what the kernel returned."""

from __future__ import annotations

from collections import Counter

import matplotlib
import pytest
import torch
from lesson_helpers import by_gid, failure, solution_module

import slotmap
from slotmap.exercises import get_exercise, run_check

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    return solution_module(tmp_path_factory.mktemp("solution01"), "01_paged_kv_cache.ipynb")


# --- 01.slot_of ---------------------------------------------------------------------------------
def test_slot_of_solution_passes(solution):
    assert run_check(get_exercise("01.slot_of"), solution.slot_of).passed


def test_slot_of_reference_passes():
    assert run_check(get_exercise("01.slot_of"), slotmap.token_slot).passed


def off_by_one(position, row, block_size):
    return row[position // block_size + 1] * block_size + position % block_size


def logical_as_physical(position, row, block_size):
    return (position // block_size) * block_size + position % block_size


def offset_wrong_divisor(position, row, block_size):
    return row[position // block_size] * block_size + position % len(row)


def div_and_mod_swapped(position, row, block_size):
    return row[position % block_size] * block_size + position // block_size


def float_division(position, row, block_size):
    return row[int(position / block_size)] * block_size + position / block_size


@pytest.mark.parametrize(
    "wrong, words",
    [
        pytest.param(off_by_one, "off by one", id="off-by-one-block-index"),
        pytest.param(logical_as_physical, "never consulted", id="logical-block-as-physical"),
        pytest.param(offset_wrong_divisor, "block offset", id="offset-from-wrong-divisor"),
        pytest.param(float_division, "not an integer", id="float-division"),
        # Once reported as an off-by-one block index: row[1] is also row[p % 4] for p = 1.
        pytest.param(div_and_mod_swapped, "// and % are swapped", id="div-and-mod-swapped"),
    ],
)
def test_slot_of_rejects(wrong, words):
    assert words in failure("01.slot_of", wrong).invariant


def test_swapped_div_and_mod_are_not_called_an_off_by_one():
    found = failure("01.slot_of", div_and_mod_swapped)
    assert "off by one" not in found.invariant
    assert "position 1 landed in slot 8 = block_table_row[1 % 4] * 4 + 1 // 4" in found.invariant
    assert "offset inside the block" in found.hint and "logical block" in found.hint


def test_slot_of_report_names_expected_and_got():
    result = run_check(get_exercise("01.slot_of"), off_by_one)
    assert result.failure.expected == "slot 28" and result.failure.got == "slot 8"
    assert "the first token" in result.failure.case_name


# --- 01.slot_mapping ----------------------------------------------------------------------------
def reference_slot_mapping(
    qsl,
    positions,
    table,
    block_size,
    *,
    num_tokens,
    max_num_tokens,
    out,
    pad_id=-1,
    row_of=None,
    position_of=None,
    pad=True,
    pad_from=None,
):
    starts, pos, rows = qsl.tolist(), positions.tolist(), table.tolist()
    for q in range(len(starts) - 1):
        for t in range(starts[q], starts[q + 1]):
            p = pos[t] if position_of is None else position_of(t, starts[q])
            row = rows[q if row_of is None else row_of(q)]
            out[t] = row[p // block_size] * block_size + p % block_size
    if pad:
        first = num_tokens if pad_from is None else pad_from(positions)
        out[first:max_num_tokens] = pad_id
    return out


def test_slot_mapping_solution_passes(solution):
    assert run_check(get_exercise("01.slot_mapping"), solution.slot_mapping).passed


@pytest.mark.parametrize(
    "options, words",
    [
        pytest.param({"pad": False}, "never written", id="forgot-padding"),
        pytest.param(
            {"pad_from": len}, "only the first num_tokens", id="padding-from-len-positions"
        ),
        # Once only "tokens 2 and 3 collide in slot 30".
        pytest.param(
            {"row_of": lambda q: 0},
            "collide in slot 30: position 2 of request 1 landed in slot 30 = block_table[0][0] "
            "* 4 + 2: it read request 0's row, not its own",
            id="row-0-for-every-request",
        ),
        pytest.param(
            {"position_of": lambda t, s: t - s}, "should be in slot", id="token-index-as-position"
        ),
    ],
)
def test_slot_mapping_rejects(options, words):
    def wrong(*args, **kwargs):
        return reference_slot_mapping(*args, **kwargs, **options)

    assert words in failure("01.slot_mapping", wrong).invariant


def test_slot_mapping_rejects_a_new_tensor():
    def returns_new(qsl, positions, table, block_size, *, out, **kwargs):
        return slotmap.slot_mapping_oracle(qsl, positions, table, block_size, **kwargs)

    assert "new tensor" in failure("01.slot_mapping", returns_new).invariant


# --- figure and widget --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lengths, block_size, extra",
    [
        ((5, 11, 3), 4, {}),
        ((3, 0, 7), 1, {"max_num_tokens": 12}),
        ((2, 9), 3, {"first_positions": (6, 4)}),
    ],
)
def test_draw_paged_shows_the_kernels_slots(lengths, block_size, extra):
    from slotmap.viz.paged import draw_paged, paged_batch

    fig = draw_paged(lengths, block_size, **extra)
    batch = paged_batch(lengths, block_size, **extra)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    expected = slotmap.slot_mapping_oracle(
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor([p for row in batch.positions for p in row], dtype=torch.int64),
        torch.tensor(batch.block_table, dtype=torch.int32),
        block_size,
        max_num_tokens=batch.max_num_tokens,
    ).tolist()
    num_tokens = sum(lengths)
    # One coloured cache slot per real token, labelled with the positions stored there.
    cache = by_gid(fig, "cache-slot")
    assert len(cache) == num_tokens
    labels = Counter(int(t.get_text()) for t in by_gid(fig, "cache-slot", "text"))
    assert labels == Counter(p for row in batch.positions for p in row)
    # The slot row shows the reference's slots; padding entries show PAD_SLOT_ID.
    slot_texts = [int(t.get_text()) for t in by_gid(fig, "slot", "text")]
    pad_texts = [int(t.get_text()) for t in by_gid(fig, "pad-slot", "text")]
    assert slot_texts + pad_texts == expected
    # Every used block-table entry has an arrow; every other cache slot is empty.
    used = sum(batch.blocks_used)
    assert len(by_gid(fig, "table-entry")) == used
    assert len(by_gid(fig, "block-arrow")) == used
    cells = len(cache) + len(by_gid(fig, "cache-empty")) + len(by_gid(fig, "cache-earlier"))
    assert cells == batch.num_physical_blocks * block_size
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_draw_paged_places_each_token_in_its_slot():
    from slotmap.viz import paged

    batch = paged.paged_batch((5, 11, 3), 4)
    fig = paged.draw_batch(batch)
    per_line, block_width = paged._cache_layout(batch, max(batch.max_num_tokens, 20.0))
    # Read back each coloured cache cell's slot from where it is drawn.
    xs = sorted(
        {round(p.get_y(), 3) for p in by_gid(fig, "cache-slot") + by_gid(fig, "cache-empty")}
    )
    drawn = set()
    for patch in by_gid(fig, "cache-slot"):
        line = xs.index(round(patch.get_y(), 3))
        column, offset = divmod(round(patch.get_x() * 10), round(block_width * 10))
        drawn.add((line * per_line + column) * batch.block_size + offset // 10)
    assert drawn == set(batch.slots[: batch.num_tokens])


def test_paged_widget_redraws_on_change():
    from slotmap.viz.paged import paged_widget

    box = paged_widget((5, 11, 3), block_size=4)
    first = box.figure
    assert len(by_gid(first, "cache-slot")) == 19
    box.controls["request_0"].value = 9
    assert box.figure is not first
    assert len(by_gid(box.figure, "cache-slot")) == 23


def _arrow_points(fig, arrow, samples: int = 40) -> list[tuple[float, float]]:
    """Points along an arrow's drawn path, in data coordinates (the head left out)."""
    import numpy as np

    ax = fig.axes[0]
    fig.canvas.draw()
    # A patch's path is in its own coordinates; its transform takes them to the display.
    shaft = arrow.get_path().to_polygons(closed_only=False)[0]
    line = ax.transData.inverted().transform(arrow.get_transform().transform(shaft))
    points = []
    for (x0, y0), (x1, y1) in zip(line, line[1:], strict=False):
        for t in np.linspace(0, 1, samples):
            points.append((x0 + t * (x1 - x0), y0 + t * (y1 - y0)))
    return points


@pytest.mark.parametrize(
    "lengths, first_positions, seed", [((5, 11, 3), None, 0), ((1, 1, 1), (6, 12, 2), 3)]
)
def test_figure_arrows_land_on_their_block_and_cross_nothing(lengths, first_positions, seed):
    """Each block-table arrow ends on the edge of the physical block its entry names, and
    its path runs through no block of the cache and no entry of the table (an arrow drawn
    straight across the picture seems to point at whatever it passes)."""
    import matplotlib.pyplot as plt

    from slotmap.viz import paged

    batch = paged.paged_batch(lengths, 4, first_positions=first_positions, seed=seed)
    fig = paged.draw_batch(batch)
    cells = [
        p
        for gid in ("cache-slot", "cache-empty", "cache-earlier", "table-entry", "table-unused")
        for p in by_gid(fig, gid)
    ]
    boxes = [
        (p.get_x(), p.get_y(), p.get_x() + p.get_width(), p.get_y() + p.get_height())
        for p in cells
    ]
    slots = by_gid(fig, "cache-slot") + by_gid(fig, "cache-empty") + by_gid(fig, "cache-earlier")
    arrows = by_gid(fig, "block-arrow")
    entries = by_gid(fig, "table-entry")
    assert len(arrows) == len(entries) == sum(batch.blocks_used)
    landed = []
    for arrow in arrows:
        points = _arrow_points(fig, arrow)
        inside = [
            (x, y)
            for x, y in points
            for x0, y0, x1, y1 in boxes
            if x0 + 0.05 < x < x1 - 0.05 and y0 + 0.05 < y < y1 - 0.05
        ]
        assert inside == [], "an arrow runs through a block or a table entry"
        # The end: the first slot of a physical block, on its edge.
        x_end, y_end = points[-1]
        first = [
            p
            for p in slots
            if abs(p.get_x() - x_end) < 0.1
            and p.get_y() - 0.05 <= y_end <= p.get_y() + p.get_height() + 0.05
        ]
        assert len(first) == 1, f"arrow ends at ({x_end:.2f}, {y_end:.2f}), not on a block"
        landed.append(round(first[0].get_x(), 2))
    plt.close(fig)
    assert len(landed) == len(arrows)
