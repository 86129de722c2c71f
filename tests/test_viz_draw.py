"""The lessons' shared drawing primitives (``slotmap.viz.draw``, ``slotmap.viz.style.boxes``):
each figure module runs its kernel into a dataclass, then paints with these, so they are
written once. The lesson tests pin the figures; these pin the primitives and that they stay
the only copy."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from slotmap.viz import draw, style  # noqa: E402

VIZ = Path(draw.__file__).parent


def test_text_is_measured_in_one_place():
    """Every figure shortens or drops a label with ``draw.text_points``; no module keeps its
    own copy of the measure (three did, with two different results)."""
    measuring = []
    for path in sorted(VIZ.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "matplotlib.textpath":
                measuring.append(path.name)
    assert measuring == ["draw.py"]


def test_the_painters_draw_their_cells_with_the_shared_cell():
    """No figure module builds its own labelled cell (a Rectangle plus its centred text):
    ``draw.cell``, ``draw.Canvas`` and ``style.boxes`` do."""
    own = []
    for path in sorted(VIZ.glob("*.py")):
        if path.name in ("draw.py", "style.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in ("cell", "title", "row_title"):
                own.append(f"{path.name}:{node.name}")
    assert own == []


def test_first_fitting_takes_the_first_that_fits_or_the_default():
    wide = draw.text_points("virtual block 12", 8)
    assert draw.text_points("vb 12", 8) < wide
    names = ["virtual block 12", "vb 12"]
    assert draw.first_fitting(names, wide + 1, 8, "") == "virtual block 12"
    assert draw.first_fitting(names, wide - 1, 8, "") == "vb 12"
    assert draw.first_fitting(names, 1, 8, "") == ""
    # A list of labels fits only when every one of them does.
    pairs = [["block 0 → physical 4", "block 1 → physical 7"], ["b0→4", "b1→7"]]
    assert draw.first_fitting(pairs, draw.text_points("b0→4", 8) + 1, 8, None) == pairs[1]


def test_text_points_measures_the_widest_line():
    both = draw.text_points("4\n12345", 9)
    assert both == draw.text_points("12345", 9) > draw.text_points("4", 9)


def test_scattered_table_draws_distinct_blocks_and_pads_with_zero():
    rows = draw.scattered_table([2, 0, 3], 7, random.Random(0))
    assert [len(row) for row in rows] == [3, 3, 3]
    used = rows[0][:2] + rows[2][:3]
    assert len(set(used)) == 5 and all(0 <= b < 7 for b in used)
    assert rows[0][2:] == [0] and rows[1] == [0, 0, 0]
    assert rows == draw.scattered_table([2, 0, 3], 7, random.Random(0))


def test_landed_and_earlier_say_what_a_batch_wrote_where():
    positions = [[2, 3], [0]]
    assert draw.landed(positions, [10, 11, -1]) == {10: (0, 2), 11: (0, 3)}
    # Request 0 starts at position 2: positions 0 and 1 were written by earlier steps.
    assert draw.earlier(positions, [[5, 0], [1, 0]], 4) == {20: (0, 0), 21: (0, 1)}
    assert draw.blocks_used([2, 0, 9], [2, 1, 0], 4) == [1, 1, 0]
    assert draw.starts_of([3, 0, 2]) == [0, 3, 3, 5]
    assert draw.shared_slots([4, 5, 4, -1, -1]) == {4}


def test_boxes_tag_their_patches_and_texts():
    import matplotlib.pyplot as plt

    fig, (ax,) = style.figure(1)
    patches = style.boxes(
        ax, 0, ["red", "blue", "red"], ["1", "", "3"], gids=["a", "b", "c"], text_gid="label"
    )
    assert [p.get_gid() for p in patches] == ["a", "b", "c"]
    assert [(t.get_text(), t.get_gid()) for t in ax.texts] == [("1", "label"), ("3", "label")]
    assert [p.get_gid() for p in style.boxes(ax, 1, ["red"] * 2, gids="row")] == ["row", "row"]
    plt.close(fig)


def test_canvas_cache_paints_every_slot_once_with_its_kind():
    import matplotlib.pyplot as plt

    canvas = draw.Canvas(20, 6)
    landed = {0: (0, 0), 1: (0, 1), 5: (1, 7)}
    origins = canvas.cache(
        0, 4, 3, landed, "cache", collisions={5}, shared={2: 2}, earlier={9: (1, 3)}
    )
    kinds = [p.get_gid() for p in canvas.ax.patches]
    assert len(kinds) == 3 * 4
    assert kinds.count("cache-slot") == 2 and kinds.count("cache-collision") == 1
    assert kinds.count("cache-shared") == 1 and kinds.count("cache-earlier") == 1
    assert kinds.count("cache-empty") == 12 - 5
    # Blocks side by side, GAP apart, while they fit the canvas's width.
    assert origins == [(0, 0), (4 + draw.GAP, 0), (2 * (4 + draw.GAP), 0)]
    captions = [t.get_text() for t in canvas.ax.texts if t.get_gid() == "cache-caption"]
    assert len(captions) == 3 and captions[2].startswith("block 2")
    plt.close(canvas.fig)


def test_canvas_token_rows_mark_collisions_and_pad_the_tail():
    import matplotlib.pyplot as plt

    canvas = draw.Canvas(12, 4)
    rows = [draw.SlotRow("ring", [8, 9, 8], "ring-slot", "ring-pad", {8})]
    canvas.token_rows(0, [[0, 1], [5]], rows, 5)
    kinds = [p.get_gid() for p in canvas.ax.patches]
    assert kinds.count("token") == 3 and kinds.count("pad-token") == 2
    assert kinds.count("ring-collision") == 2 and kinds.count("ring-slot") == 1
    assert kinds.count("ring-pad") == 2
    plt.close(canvas.fig)
