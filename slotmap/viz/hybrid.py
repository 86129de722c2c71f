"""Lesson 06's hybrid-blocks figure and widget, drawn from real kernel runs.

``draw_hybrid`` builds a batch whose KV-cache manager hands out physical KV blocks of K =
``kv_cache_block_size`` tokens, each K/B = ``blocks_per_kv_block`` attention blocks of B =
``block_size`` tokens (the course's notation), expands its block table into attention
blocks (``slotmap.expand_block_table``), runs the production kernel
``slotmap.compute_slot_mapping`` on the active backend and draws what it returned: the
batch's tokens and slots, each request's two block tables (every physical KV block above the
attention blocks it holds) and the KV cache, each physical block split into its attention
blocks, the slots earlier steps wrote hatched. ``hybrid_widget`` redraws it on every change
of its sliders.

The small cell grid (``Canvas``) is shared with lesson 06's other figures (``viz.groups``).
Patches and texts carry a gid (``token``, ``slot``, ``kv-entry``, ``attention-entry``,
``cache-slot``, ``cache-earlier``, ``cache-empty``, ...) so that a test can read a figure back.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slotmap.viz import style

GAP = 0.5  # space between two physical blocks in a KV-cache picture, in cells
MIN_FONT = 8.0  # points: no text of lesson 06's figures is smaller
MAX_CELLS = 44  # widest canvas, in cells: a two-digit label at MIN_FONT still fits a cell


@functools.lru_cache(maxsize=4096)
def text_points(text: str, size: float) -> float:
    """Width of ``text`` in points at font size ``size`` (matplotlib's own measure)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    width, _, _ = TextToPath().get_text_width_height_descent(
        text, FontProperties(size=size), ismath=False
    )
    return width


class Canvas:
    """One axes measured in cells (a token, an entry or a slot is one cell wide), y downwards.

    ``width`` and ``height`` in cells; the figure is ``style.WIDTH`` wide, so a cell gets
    narrower as ``width`` grows. Callers keep ``width`` at most ``MAX_CELLS``, so that cell
    labels stay at ``MIN_FONT`` or larger; ``fits`` tells whether a caption fits its room.
    """

    def __init__(self, width: float, height: float, left: float = 0.14, title_lines: int = 2):
        from slotmap.viz.style import figure

        self.width = width
        cell_inches = style.WIDTH * (0.97 - left) / width
        self.cell_points = cell_inches * 72
        self.font = max(MIN_FONT, min(style.FONT_SIZE, self.cell_points * 0.55))
        self.small = MIN_FONT  # captions, notes, block numbers
        row_inches = max(cell_inches, 0.27)  # rows stay tall enough for their text
        title_inches = 0.12 + 0.21 * title_lines
        axes_inches = (height + 1.6) * row_inches
        self.fig, (self.ax,) = figure(1, height_per_row=axes_inches + title_inches)
        top = axes_inches / (axes_inches + title_inches)
        self.fig.subplots_adjust(left=0.01, right=0.99, top=top, bottom=0.01)
        margin = left / (0.97 - left) * width
        self.ax.set_xlim(-margin, width + 0.3)
        self.ax.set_ylim(height + 0.2, -1.4)

    def fits(self, text: str, cells: float, size: float | None = None) -> bool:
        """Whether ``text`` at ``size`` (default: the captions' size) fits ``cells`` cells,
        a point of room left on each side."""
        return text_points(text, size or self.small) <= cells * self.cell_points - 2

    def caption_format(self, formats: Sequence[str], widest: dict, cells: float) -> str:
        """The first (longest) of ``formats`` (``str.format`` templates) whose caption for
        ``widest`` (the widest block's fields) fits ``cells`` cells; the last one if none
        does. One format for a whole cache, so that its captions look alike."""
        return next((f for f in formats if self.fits(f.format(**widest), cells)), formats[-1])

    def label_size(self, label: str, cells: float) -> float:
        """The cell labels' size, or the captions' (smaller) one where the label would not
        fit its cell (a three-digit slot in a narrow cell)."""
        return self.font if self.fits(label, cells, self.font) else self.small

    def cell(
        self,
        x: float,
        y: float,
        colour: str,
        label: object,
        gid: str,
        *,
        wide: float = 1.0,
        text_colour: str = "black",
        hatch: str | None = None,
        edge: str = style.EDGE,
        linewidth: float = 0.6,
        size: float | None = None,
        hatch_colour: str | None = None,
    ):
        from matplotlib.patches import Rectangle

        extra = {} if hatch_colour is None else {"hatchcolor": hatch_colour}
        patch = Rectangle((x, y), wide, 0.8, facecolor=colour, edgecolor=edge,
                          linewidth=linewidth, hatch=hatch, gid=gid, **extra)  # fmt: skip
        self.ax.add_artist(patch)
        if label != "":
            self.ax.text(x + wide / 2, y + 0.4, str(label), ha="center", va="center",
                         fontsize=size or self.label_size(str(label), wide), color=text_colour,
                         gid=gid)  # fmt: skip
        return patch

    def earlier(self, x: float, y: float, request: int, position: int, gid: str):
        """A slot an earlier step wrote: hatched in the request's colour, its position in
        black on the pale cell (the same look in every lesson-06 figure)."""
        colour = style.request_colour(request)
        return self.cell(x, y, _pale(colour, 0.85), position, gid, hatch="///", linewidth=1.2,
                         edge=colour, hatch_colour=_pale(colour, 0.4))  # fmt: skip

    def row_title(self, y: float, text: str, x: float = -0.25) -> None:
        self.ax.text(x, y + 0.4, text, ha="right", va="center", fontsize=style.FONT_SIZE)

    def heading(self, y: float, text: str, x: float = 0.0, colour: str = "black") -> None:
        self.ax.text(x, y - 0.3, text, ha="left", va="bottom", fontsize=style.FONT_SIZE,
                     color=colour)  # fmt: skip

    def title(self, text: str) -> None:
        self.fig.suptitle(text, fontsize=style.FONT_SIZE + 1, y=0.995, va="top")

    def note(self, x: float, y: float, text: str, **kwargs) -> None:
        kwargs.setdefault("fontsize", self.small)
        kwargs.setdefault("color", style.EDGE)
        self.ax.text(x, y, text, **kwargs)


def _pale(colour: str, amount: float = 0.55) -> tuple[float, float, float]:
    """``colour`` mixed with white."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1 - c) * amount for c in to_rgb(colour))


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def token_rows(
    canvas: Canvas, y: float, positions: Sequence[Sequence[int]], slots: Sequence[int],
    max_num_tokens: int, slot_title: str = "kernel's slot",
) -> None:  # fmt: skip
    """The batch: each token coloured by its request and labelled with its position, the
    kernel's slot under it, then the padding tail."""
    canvas.heading(y, "batch tokens (colour: request)")
    canvas.row_title(y, "token's position")
    canvas.row_title(y + 1, slot_title)
    token = 0
    for request, row in enumerate(positions):
        colour = style.request_colour(request)
        for position in row:
            canvas.cell(token, y, colour, position, "token", text_colour="white")
            canvas.cell(token, y + 1, colour, slots[token], "slot", text_colour="white")
            token += 1
    for pad in range(token, max_num_tokens):
        canvas.cell(pad, y, style.PAD, "", "pad-token", hatch="///")
        canvas.cell(pad, y + 1, style.PAD, "PAD" if canvas.fits("PAD", 1) else "", "pad-slot",
                    size=canvas.small)  # fmt: skip


@dataclass
class HybridRun:
    """One batch with hybrid blocks, and the slot mapping the kernel returned for it."""

    block_size: int  # the attention block (the kernel's block_size)
    blocks_per_kv_block: int
    positions: list[list[int]]  # per request
    kv_table: list[list[int]]  # the manager's table: physical KV blocks (unused entries 0)
    table: list[list[int]]  # expand_block_table(kv_table): attention blocks
    kv_used: list[int]  # physical KV blocks each request's positions reach
    num_kv_blocks: int  # physical KV blocks in the cache
    max_num_tokens: int
    slots: list[int]  # the kernel's output, [max_num_tokens]
    expected: list[int]  # slot_mapping_oracle on the same inputs
    whole: list[int]  # the oracle with whole KV blocks: block_size = kv, unexpanded table

    @property
    def kv_cache_block_size(self) -> int:
        return self.block_size * self.blocks_per_kv_block

    @property
    def num_tokens(self) -> int:
        return sum(len(row) for row in self.positions)


def run_hybrid(
    lengths: Sequence[int] = (7, 10),
    block_size: int = 2,
    blocks_per_kv_block: int = 3,
    *,
    first_positions: Sequence[int] | None = None,
    padding: int = 0,
    seed: int = 5,
) -> HybridRun:
    """Build a batch on ``slotmap.DEVICE``, expand its table and run the production kernel.

    Request q holds positions ``first_positions[q] ..`` (0: a prefill); its physical KV
    blocks are drawn without repeats from a shuffled pool a few blocks larger than needed.
    """
    import slotmap

    kv = block_size * blocks_per_kv_block
    lengths = [int(n) for n in lengths]
    firsts = [0] * len(lengths) if first_positions is None else [int(p) for p in first_positions]
    positions = [list(range(f, f + n)) for f, n in zip(firsts, lengths, strict=True)]
    kv_used = [(f + n - 1) // kv + 1 if n else 0 for f, n in zip(firsts, lengths, strict=True)]
    num_kv_blocks = sum(kv_used) + 2
    pool = random.Random(seed).sample(range(num_kv_blocks), sum(kv_used))
    width = max(max(kv_used, default=0), 1)
    kv_table, used = [], 0
    for count in kv_used:
        kv_table.append(pool[used : used + count] + [0] * (width - count))
        used += count

    device = slotmap.DEVICE
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    qsl = torch.tensor(starts, dtype=torch.int32, device=device)
    pos = torch.tensor([p for row in positions for p in row], dtype=torch.int64, device=device)
    kv_blocks = torch.tensor(kv_table, dtype=torch.int32, device=device)
    table = slotmap.expand_block_table(kv_blocks, blocks_per_kv_block)
    max_num_tokens = sum(lengths) + padding
    counts = {"max_num_tokens": max_num_tokens}
    slots = slotmap.compute_slot_mapping(
        qsl, pos, table, block_size, kv_cache_block_size=kv, **counts
    )
    expected = slotmap.slot_mapping_oracle(
        qsl.cpu(), pos.cpu(), table.cpu(), block_size, kv_cache_block_size=kv, **counts
    )
    whole = slotmap.slot_mapping_oracle(qsl.cpu(), pos.cpu(), kv_blocks.cpu(), kv, **counts)
    return HybridRun(block_size, blocks_per_kv_block, positions, kv_table,
                     table.cpu().tolist(), kv_used, num_kv_blocks, max_num_tokens,
                     slots.cpu().tolist(), expected.tolist(), whole.tolist())  # fmt: skip


def draw_hybrid(
    lengths: Sequence[int] = (7, 10),
    block_size: int = 2,
    blocks_per_kv_block: int = 3,
    *,
    first_positions: Sequence[int] | None = None,
    padding: int = 0,
    seed: int = 5,
):
    """Run the kernel with hybrid blocks and draw tokens, both block tables and the cache."""
    run = run_hybrid(lengths, block_size, blocks_per_kv_block,
                     first_positions=first_positions, padding=padding, seed=seed)  # fmt: skip
    return draw_hybrid_run(run)


def draw_hybrid_run(run: HybridRun):
    """Draw a ``HybridRun`` (see ``draw_hybrid``).

    The lesson's notation: B = ``block_size`` (the attention block), K =
    ``kv_cache_block_size`` (the physical KV block), K/B = ``BLOCKS_PER_KV_BLOCK``.
    """
    size, per, kv = run.block_size, run.blocks_per_kv_block, run.kv_cache_block_size
    table_width = len(run.table[0]) if run.table else 0
    width = float(max(run.max_num_tokens, table_width, 2 * kv + GAP, 24))
    per_line = max(1, int((width + GAP) // (kv + GAP)))
    cache_lines = -(-run.num_kv_blocks // per_line)
    y_token = 0.0
    y_table = 3.7
    y_cache = y_table + len(run.positions) * 2.9 + 2.0
    height = y_cache + cache_lines * 2.3
    canvas = Canvas(width, height)

    token_rows(canvas, y_token, run.positions, run.slots, run.max_num_tokens)

    # Block tables: the manager's entry k spans the attention blocks k * K/B .. (k + 1) * K/B
    # - 1 that expand_block_table puts under it.
    canvas.heading(
        y_table,
        f"block tables: the manager's physical KV blocks (K = {plural(kv, 'token')}) over the "
        f"attention blocks (B = {plural(size, 'token')}) the kernel indexes",
    )
    for request, (kv_row, row) in enumerate(zip(run.kv_table, run.table, strict=True)):
        y = y_table + request * 2.6
        colour = style.request_colour(request)
        canvas.row_title(y, f"request {request}: KV blocks")
        canvas.row_title(y + 1, "attention blocks")
        for k, physical in enumerate(kv_row):
            used = k < run.kv_used[request]
            canvas.cell(k * per, y, colour if used else style.EMPTY, physical if used else "",
                        "kv-entry" if used else "kv-unused", wide=per, text_colour="white",
                        linewidth=1.4)  # fmt: skip
            for j in range(per):
                entry = row[k * per + j]
                canvas.cell(k * per + j, y + 1, colour if used else style.EMPTY,
                            entry if used else "",
                            "attention-entry" if used else "attention-unused",
                            text_colour="white")  # fmt: skip
        # The kernel's logical (attention) block b reads entry b of the expanded row.
        for a in range(len(row)):
            canvas.note(a + 0.5, y + 1.9, f"{a}", ha="center", va="top")
        canvas.note(-0.25, y + 1.9, "logical block", ha="right", va="top")

    # The cache: physical KV block k = attention blocks k * K/B .. (k + 1) * K/B - 1, K slots.
    landed: dict[int, tuple[int, int]] = {}
    token = 0
    for request, row in enumerate(run.positions):
        for position in row:
            landed[run.slots[token]] = (request, position)
            token += 1
    # What earlier steps wrote: the positions before each request's first one (a later chunk).
    earlier: dict[int, tuple[int, int]] = {}
    for request, row in enumerate(run.positions):
        for p in range(row[0] if row else 0):
            earlier[run.kv_table[request][p // kv] * kv + p % kv] = (request, p)
    canvas.heading(
        y_cache - 0.45,
        f"KV cache: {plural(run.num_kv_blocks, 'physical KV block')} of K = "
        f"{plural(kv, 'slot')}, each K/B = {plural(per, 'attention block')} (numbered above) "
        f"of B = {size}\nlabel: the position stored there"
        + ("; hatched: written by earlier steps" if earlier else ""),
    )
    canvas.row_title(y_cache, "slots")
    last = run.num_kv_blocks - 1
    caption = canvas.caption_format(
        ["KV block {k}: slots {first}-{last}", "KV block {k}: {first}-{last}", "KV block {k}",
         "KV {k}", "{k}"],
        {"k": last, "first": last * kv, "last": last * kv + kv - 1},
        kv + GAP * 0.8,
    )  # fmt: skip
    for physical in range(run.num_kv_blocks):
        line, column = divmod(physical, per_line)
        x0 = column * (kv + GAP)
        y = y_cache + line * 2.3
        for offset in range(kv):
            slot = physical * kv + offset
            if slot in landed:
                request, position = landed[slot]
                canvas.cell(x0 + offset, y, style.request_colour(request), position,
                            "cache-slot", text_colour="white")  # fmt: skip
            elif slot in earlier:
                canvas.earlier(x0 + offset, y, *earlier[slot], "cache-earlier")
            else:
                canvas.cell(x0 + offset, y, style.EMPTY, "", "cache-empty")
        # Attention-block borders inside the physical block, and the physical block's outline.
        for j in range(per):
            canvas.cell(x0 + j * size, y, "none", "", "attention-block", wide=size,
                        linewidth=1.6)  # fmt: skip
            canvas.note(x0 + j * size + size / 2, y - 0.08, str(physical * per + j),
                        ha="center", va="bottom")  # fmt: skip
        canvas.cell(x0, y, "none", "", "kv-block", wide=kv, linewidth=2.2, edge="black")
        first = physical * kv
        label = caption.format(k=physical, first=first, last=first + kv - 1)
        canvas.note(x0 + kv / 2, y + 0.95, label, ha="center", va="top", gid="kv-block-label")

    agree = run.slots == run.expected
    same = run.slots[: run.num_tokens] == run.whole[: run.num_tokens]
    verdict = "kernel = reference" if agree else "KERNEL DIFFERS FROM THE REFERENCE"
    verdict += (
        "; the same slots as whole KV blocks (block_size = K, unexpanded table)"
        if same
        else "; NOT the slots of whole KV blocks"
    )
    canvas.title(
        f"Hybrid blocks: K = K/B x B = {per} x {size} = {kv}; "
        f"slot = expanded[q, p // B] * B + p % B with B = {size}\n"
        f"slotmap.compute_slot_mapping: {verdict}"
    )
    canvas.fig.slotmap_run = run
    return canvas.fig


def hybrid_widget(
    lengths: Sequence[int] = (7, 10), block_size: int = 2, blocks_per_kv_block: int = 3
):
    """Sliders for two request lengths, where request 1 starts, the attention block B and
    K/B, the attention blocks per KV block; every change re-runs the kernel and redraws."""
    import ipywidgets as widgets

    from slotmap.viz.live import columns, live_figure

    style_ = {"description_width": "initial"}
    controls = {
        "request_0": widgets.IntSlider(value=lengths[0], min=0, max=14, description="request 0"),
        "request_1": widgets.IntSlider(value=lengths[1], min=0, max=14, description="request 1"),
        "first_1": widgets.IntSlider(
            value=0, min=0, max=12, description="request 1 starts at", style=style_
        ),
        "block_size": widgets.IntSlider(
            value=block_size, min=1, max=4, description="B (attention block)", style=style_
        ),
        "blocks_per_kv_block": widgets.IntSlider(
            value=blocks_per_kv_block,
            min=1,
            max=4,
            description="K/B (blocks per KV block)",
            style=style_,
        ),  # fmt: skip
        "seed": widgets.IntSlider(value=5, min=0, max=20, description="shuffle"),
    }
    names = list(controls)
    layout = columns([controls[n] for n in names[:3]], [controls[n] for n in names[3:]])

    def draw(request_0, request_1, first_1, block_size, blocks_per_kv_block, seed):
        return draw_hybrid((request_0, request_1), block_size, blocks_per_kv_block,
                           first_positions=(0, first_1), seed=seed)  # fmt: skip

    return live_figure(draw, controls, layout)
