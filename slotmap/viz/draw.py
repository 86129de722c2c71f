"""The drawing primitives every lesson's figure is made of, and the small batch builders the
figures share: a figure's module runs the kernel into a dataclass, then paints it with these.

* measuring text (``text_points``, ``fits``) so a label is shortened or dropped, never drawn
  over its neighbour;
* a labelled cell (``cell``), a row caption (``row_label``), a legend key (``key``);
* ``Canvas``: one axes measured in cells, y downwards, with a KV-cache painter (``cache``);
* what a batch wrote where (``landed``, ``earlier``), a block table drawn from a shuffled pool
  (``scattered_table``) and the batch's tensors (``batch_tensors``).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from slotmap.i18n import N_, _, tr
from slotmap.viz import style

if TYPE_CHECKING:
    import torch
    from matplotlib.axes import Axes
    from matplotlib.legend import Legend
    from matplotlib.patches import Patch, Rectangle

GAP = 0.5  # space between two physical blocks in a KV-cache picture, in cells
MIN_FONT = 8.0  # points: no text of a Canvas figure is smaller
MAX_CELLS = 44  # widest canvas, in cells: a two-digit label at MIN_FONT still fits a cell
SHARED = "#9ecae1"  # a slot of a prefix-cached block that other requests share
CENTRE = {"ha": "center", "va": "center"}
RIGHT = {"ha": "right", "va": "center"}  # a row's caption, left of the row
ABOVE = {"ha": "center", "va": "bottom"}  # a caption over a block or a bar
BELOW = {"ha": "center", "va": "top"}  # a caption under a block
EMPTY = style.EMPTY
BLOCK_CAPTIONS = (
    N_("block {k} · slots {first}-{last}"),
    N_("block {k}: {first}-{last}"),
    N_("block {k}"),
    "{k}",
)


class SlotRow(NamedTuple):
    """A row of slots under a batch's tokens (``Canvas.token_rows``)."""

    title: str
    slots: Sequence[int]
    gid: str  # its cells' gid; ``-slot`` becomes ``-collision`` on a slot in ``collisions``
    pad_gid: str  # the padding tail's
    collisions: set[int] = frozenset()


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def text_points(text: str, size: float) -> float:
    """Width of ``text`` in points at font size ``size`` (the widest of its lines), measured by
    matplotlib without drawing it."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    font = FontProperties(size=size)
    measure = TextToPath().get_text_width_height_descent
    return max(measure(line or " ", font, ismath=False)[0] for line in text.split("\n"))


def first_fitting(candidates: Sequence[Any], room: float, size: float, default: Any = None) -> Any:
    """The first candidate (a text, or a list of texts that must all fit) whose texts are at
    most ``room`` points wide at ``size``; ``default`` when none is."""
    for candidate in candidates:
        texts = [candidate] if isinstance(candidate, str) else candidate
        if all(text_points(text, size) <= room for text in texts):
            return candidate
    return default


def pale(colour: str, amount: float = 0.55) -> tuple[float, float, float]:
    """``colour`` mixed with white."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1 - c) * amount for c in to_rgb(colour))


# ---------------------------------------------------------------------------------------------
# Cells, captions, legend keys
# ---------------------------------------------------------------------------------------------
def cell(
    ax: Axes,
    x: float,
    y: float,
    colour: Any,
    label: object,
    gid: str | None,
    *,
    wide: float = 1.0,
    high: float = 0.8,
    size: float = style.FONT_SIZE,
    text_colour: str = "black",
    hatch: str | None = None,
    edge: str = style.EDGE,
    linewidth: float = 0.6,
    hatch_colour: str | None = None,
) -> Rectangle:
    """One box ``wide`` x ``high`` at (x, y), labelled in its middle; patch and label carry
    ``gid`` so that a test can read the figure back. Returns the patch."""
    from matplotlib.patches import Rectangle

    extra = {} if hatch_colour is None else {"hatchcolor": hatch_colour}
    box = dict(facecolor=colour, edgecolor=edge, linewidth=linewidth, hatch=hatch, gid=gid)
    patch = Rectangle((x, y), wide, high, **box, **extra)
    ax.add_artist(patch)
    if label != "":
        centre = (x + wide / 2, y + high / 2)
        ax.text(*centre, str(label), **CENTRE, fontsize=size, color=text_colour, gid=gid)
    return patch


def row_label(ax: Axes, y: float, text: str, x: float = -0.4, **kwargs: Any) -> None:
    """A row's caption, right-aligned in the margin left of the row at height ``y``."""
    kwargs.setdefault("fontsize", style.FONT_SIZE)
    ax.text(x, y + 0.4, text, **RIGHT, **kwargs)


def key(colour: Any, label: str, edge: str = style.EDGE, **kwargs: Any) -> Patch:
    """A legend entry: a box of ``colour``."""
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, edgecolor=edge, label=label, **kwargs)


def legend(owner: Any, handles: list, **kwargs: Any) -> Legend:
    """A frameless legend of ``handles`` on a figure or axes, at the notes' size."""
    kwargs = {"fontsize": style.FONT_SIZE - 1, "frameon": False, **kwargs}
    return owner.legend(handles=handles, **kwargs)


# ---------------------------------------------------------------------------------------------
# A canvas measured in cells
# ---------------------------------------------------------------------------------------------
class Canvas:
    """One axes measured in cells (a token, an entry or a slot is one cell wide), y downwards.

    ``width`` and ``height`` in cells; the figure is ``style.WIDTH`` wide, so a cell gets
    narrower as ``width`` grows. Callers keep ``width`` at most ``MAX_CELLS``, so that cell
    labels stay at ``MIN_FONT`` or larger; ``fits`` tells whether a caption fits its room.
    """

    def __init__(self, width: float, height: float, left: float = 0.14, title_lines: int = 2):
        self.width = width
        cell_inches = style.WIDTH * (0.97 - left) / width
        self.cell_points = cell_inches * 72
        self.font = max(MIN_FONT, min(style.FONT_SIZE, self.cell_points * 0.55))
        self.small = MIN_FONT  # captions, notes, block numbers
        row_inches = max(cell_inches, 0.27)  # rows stay tall enough for their text
        title_inches = 0.12 + 0.21 * title_lines
        axes_inches = (height + 1.6) * row_inches
        self.fig, (self.ax,) = style.figure(1, height_per_row=axes_inches + title_inches)
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
        does. One format for a whole cache, so that its captions look alike. A format marked
        with ``N_`` is translated here."""
        formats = [tr(f) for f in formats]
        return next((f for f in formats if self.fits(f.format(**widest), cells)), formats[-1])

    def cell(
        self, x: float, y: float, colour: Any, label: object, gid: str, **kwargs: Any
    ) -> Rectangle:
        """A cell (``draw.cell``) whose label takes the cells' size, or the captions' smaller
        one where it would not fit (a three-digit slot in a narrow cell)."""
        if "size" not in kwargs or kwargs["size"] is None:
            text, wide = str(label), kwargs.get("wide", 1.0)
            kwargs["size"] = self.font if self.fits(text, wide, self.font) else self.small
        return cell(self.ax, x, y, colour, label, gid, **kwargs)

    def earlier(self, x: float, y: float, request: int, position: int, gid: str) -> Rectangle:
        """A slot an earlier step wrote: hatched in the request's colour, its position in
        black on the pale cell (the same look in every lesson-06 figure)."""
        colour = style.request_colour(request)
        look = {
            "hatch": "///",
            "linewidth": 1.2,
            "edge": colour,
            "hatch_colour": pale(colour, 0.4),
        }
        return self.cell(x, y, pale(colour, 0.85), position, gid, **look)

    def row_title(self, y: float, text: str, x: float = -0.25) -> None:
        """A row's caption in the left margin."""
        row_label(self.ax, y, text, x)

    def heading(self, y: float, text: str, x: float = 0.0, colour: str = "black") -> None:
        """A section's heading, just above the row at ``y``."""
        self.ax.text(
            x, y - 0.3, text, ha="left", va="bottom", fontsize=style.FONT_SIZE, color=colour
        )

    def title(self, text: str) -> None:
        """The figure's title, at the top."""
        self.fig.suptitle(text, fontsize=style.FONT_SIZE + 1, y=0.995, va="top")

    def note(self, x: float, y: float, text: str, **kwargs: Any) -> None:
        """A small grey text (a caption, a block number) at (x, y)."""
        kwargs.setdefault("fontsize", self.small)
        kwargs.setdefault("color", style.EDGE)
        self.ax.text(x, y, text, **kwargs)

    def token_rows(
        self,
        y: float,
        positions: Sequence[Sequence[int]],
        rows: Sequence[SlotRow],
        max_num_tokens: int,
    ) -> None:
        """The batch: each token coloured by its request and labelled with its position, and
        under it one row per ``SlotRow``, then the padding tail (``pad-token`` over
        ``row.pad_gid`` cells, labelled PAD where that fits)."""
        self.row_title(y, _("token's position"))
        for k, row in enumerate(rows):
            self.row_title(y + 1 + k, row.title)
        token = 0
        for request, row_positions in enumerate(positions):
            colour = style.request_colour(request)
            for position in row_positions:
                self.cell(token, y, colour, position, "token", text_colour="white")
                for k, row in enumerate(rows):
                    slot, hit = row.slots[token], row.slots[token] in row.collisions
                    gid = row.gid.replace("-slot", "-collision") if hit else row.gid
                    edge = {"edge": style.HIGHLIGHT, "linewidth": 2.4} if hit else {}
                    self.cell(token, y + 1 + k, colour, slot, gid, text_colour="white", **edge)
                token += 1
        pad = "PAD" if self.fits("PAD", 1) else ""
        for x in range(token, max_num_tokens):
            self.cell(x, y, style.PAD, "", "pad-token", hatch="///")
            for k, row in enumerate(rows):
                self.cell(x, y + 1 + k, style.PAD, pad, row.pad_gid, size=self.small)

    def table_rows(
        self,
        x0: float,
        y: float,
        rows: Sequence[Sequence[int]],
        used: Sequence[int],
        label_x: float | None = None,
    ) -> None:
        """Block-table rows, one per request, coloured by request where used."""
        for request, row in enumerate(rows):
            if label_x is not None:
                caption = _("request {request}").format(request=request)
                self.note(label_x, y + request + 0.4, caption, **RIGHT, color="black")
            for b, physical in enumerate(row):
                on = b < used[request]
                colour, label = (style.request_colour(request), physical) if on else (EMPTY, "")
                gid = "table-entry" if on else "table-unused"
                self.cell(x0 + b, y + request, colour, label, gid, text_colour="white")

    def cache(
        self,
        y: float,
        block_size: int,
        num_blocks: int,
        landed: dict[int, tuple[int, int]],
        gid: str,
        *,
        formats: Sequence[str] = BLOCK_CAPTIONS,
        line_height: float = 2.0,
        collisions: set[int] = frozenset(),
        shared: dict[int, int] | None = None,
        earlier: dict[int, tuple[int, int]] | None = None,
        caption_gid: str | None = None,
    ) -> list[tuple[float, float]]:
        """A KV cache of ``num_blocks`` blocks over the canvas's width, a caption under each
        block (the longest of ``formats`` that fits); returns each block's (x, y).

        ``landed``: slot -> (request, position) written by this batch (edged in red where in
        ``collisions``); ``shared``: slot -> position held by a prefix-cached block (hatched,
        in ``SHARED``); ``earlier``: slot -> (request, position) an earlier step wrote.
        """
        per_line = max(1, int((self.width + GAP) // (block_size + GAP)))
        k = num_blocks - 1
        widest = {"k": k, "first": k * block_size, "last": (k + 1) * block_size - 1}
        caption = self.caption_format(formats, widest, block_size + GAP * 0.8)
        shared, earlier = shared or {}, earlier or {}
        origins = []
        for physical in range(num_blocks):
            line, column = divmod(physical, per_line)
            bx, by = column * (block_size + GAP), y + line * line_height
            origins.append((bx, by))
            for offset in range(block_size):
                slot, x = physical * block_size + offset, bx + offset
                if slot in landed:
                    request, position = landed[slot]
                    hit = slot in collisions
                    kind = f"{gid}-collision" if hit else f"{gid}-slot"
                    edge = {"edge": style.HIGHLIGHT, "linewidth": 2.4} if hit else {}
                    colour = style.request_colour(request)
                    self.cell(x, by, colour, position, kind, text_colour="white", **edge)
                elif slot in shared:
                    self.cell(x, by, SHARED, shared[slot], f"{gid}-shared", hatch="///")
                elif slot in earlier:
                    self.earlier(x, by, *earlier[slot], f"{gid}-earlier")
                else:
                    self.cell(x, by, EMPTY, "", f"{gid}-empty")
            first = physical * block_size
            label = caption.format(k=physical, first=first, last=first + block_size - 1)
            at = (bx + block_size / 2, by + 0.95)
            self.note(*at, label, ha="center", va="top", gid=caption_gid or f"{gid}-caption")
        return origins


# ---------------------------------------------------------------------------------------------
# What a batch is, and what it wrote where
# ---------------------------------------------------------------------------------------------
def starts_of(lengths: Sequence[int]) -> list[int]:
    """``query_start_loc`` of requests of these lengths."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return starts


def batch_tensors(
    lengths: Sequence[int], positions: Sequence[Sequence[int]], device: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(query_start_loc, positions) tensors of a batch on ``device`` (``slotmap.DEVICE``)."""
    import torch

    import slotmap

    device = device or slotmap.DEVICE
    flat = [p for row in positions for p in row]
    return (
        torch.tensor(starts_of(lengths), dtype=torch.int32, device=device),
        torch.tensor(flat, dtype=torch.int64, device=device),
    )


def blocks_used(firsts: Sequence[int], lengths: Sequence[int], block_size: int) -> list[int]:
    """Block-table entries each request uses: up to the block of its last position."""
    pairs = zip(firsts, lengths, strict=True)
    return [(f + n - 1) // block_size + 1 if n else 0 for f, n in pairs]


def scattered_table(used: Sequence[int], pool: int, rng: random.Random) -> list[list[int]]:
    """One block-table row per request, ``used[q]`` physical blocks drawn without repeats from
    a shuffled pool of ``pool`` blocks (a request's blocks scattered over the cache, as in a
    real paged cache), unused entries 0."""
    drawn = rng.sample(range(pool), sum(used))
    width = max(max(used, default=0), 1)
    rows, taken = [], 0
    for count in used:
        rows.append(drawn[taken : taken + count] + [0] * (width - count))
        taken += count
    return rows


def landed(positions: Sequence[Sequence[int]], slots: Sequence[int]) -> dict:
    """slot -> (request, position) of every token of the batch that got a slot (not PAD)."""
    found, token = {}, 0
    for request, row in enumerate(positions):
        for position in row:
            if slots[token] >= 0:
                found[slots[token]] = (request, position)
            token += 1
    return found


def earlier(
    positions: Sequence[Sequence[int]], rows: Sequence[Sequence[int]], block_size: int
) -> dict:
    """slot -> (request, position) of the positions before each request's first one: the
    tokens earlier steps wrote."""
    found = {}
    for request, row in enumerate(positions):
        for p in range(row[0] if row else 0):
            found[rows[request][p // block_size] * block_size + p % block_size] = (request, p)
    return found


def shared_slots(slots: Sequence[int]) -> set[int]:
    """Slots (not PAD) that two tokens of a batch write: in a ring, a collision."""
    return {s for s in slots if s >= 0 and slots.count(s) > 1}
