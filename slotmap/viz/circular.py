"""Lesson 04's figures and widget: a ring-buffer (circular) cache, drawn from real kernel runs.

* ``draw_ring``: one request of a sliding-window layer decoding at ``position``. Its cache is
  one block of ``block_size`` slots reused cyclically. The ring shows which position each
  slot holds after every token 0..position was written (older tokens overwritten); the row
  beside it the whole sliding window, the last ``window`` positions run as one batch, with
  the slots the kernel computed (negative positions, before position 0: PAD_ID).
* ``draw_remainder``: ``p % B`` in Python (floor) and in Triton (truncating, like C), and the
  slot the production kernel gives, for positions around 0.

Patches carry a ``gid`` ("ring-window", "ring-stale", "ring-empty", "batch-slot", "batch-pad",
...) so tests can count what a figure shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from slotmap.backend import DEVICE
from slotmap.exercises.lesson04 import triton_remainder
from slotmap.i18n import _
from slotmap.kernels.slot_mapping import compute_slot_mapping
from slotmap.layout import PAD_SLOT_ID
from slotmap.reference import slot_mapping_oracle
from slotmap.viz import style
from slotmap.viz.draw import CENTRE, key, legend, row_label, shared_slots
from slotmap.viz.style import EDGE, EMPTY, FONT_SIZE, HIGHLIGHT, PAD, WIDTH, boxes, figure

if TYPE_CHECKING:
    from ipywidgets import VBox
    from matplotlib.figure import Figure


WINDOW = style.request_colour(0)  # the one request's tokens, and the ring slots its window holds
STALE = "#9ecae1"  # a slot holding a token older than the window: attention no longer reads it


@dataclass
class RingRun:
    position: int  # the newest token's position
    window: int  # sliding-window size: the batch holds positions position - window + 1 ..
    block_size: int  # slots in the ring
    block_number: int  # the request's one physical block
    batch_positions: list[int]
    batch_slots: list[int]  # from the kernel
    batch_expected: list[int]  # from the oracle
    holder: list[int | None]  # slot j of the ring -> position it holds after the last write
    overwritten: list[list[int]]  # slot j -> positions written there before, oldest first

    def state(self, j: int) -> str:
        """Slot j of the ring: ``window`` (holds a position of the window), ``stale`` (an
        older one) or ``empty`` (never written)."""
        held = self.holder[j]
        if held is None:
            return "empty"
        return "window" if held > self.position - self.window else "stale"


def _slots(positions: list[int], block_number: int, block_size: int) -> tuple[list, list]:
    """(kernel slots, oracle slots) of one circular request."""
    qsl = torch.tensor([0, len(positions)], dtype=torch.int32, device=DEVICE)
    pos = torch.tensor(positions, dtype=torch.int64, device=DEVICE)
    table = torch.tensor([[block_number]], dtype=torch.int32, device=DEVICE)
    kernel = compute_slot_mapping(qsl, pos, table, block_size, circular=True)
    oracle = slot_mapping_oracle(qsl.cpu(), pos.cpu(), table.cpu(), block_size, circular=True)
    return kernel.cpu().tolist(), oracle.tolist()


def run_ring(position: int, window: int, block_size: int, block_number: int = 3) -> RingRun:
    """The batch of this decode step and the ring's content, both through the kernel."""
    batch = list(range(position - window + 1, position + 1))
    batch_slots, batch_expected = _slots(batch, block_number, block_size)
    holder: list[int | None] = [None] * block_size
    overwritten: list[list[int]] = [[] for _ in range(block_size)]
    if position >= 0:
        # Every token 0..position was written once, in order: replay the writes.
        history = list(range(position + 1))
        written, _ = _slots(history, block_number, block_size)
        for p, slot in zip(history, written, strict=True):
            j = slot - block_number * block_size
            if holder[j] is not None:
                overwritten[j].append(holder[j])
            holder[j] = p
    slots = (batch_slots, batch_expected)
    return RingRun(position, window, block_size, block_number, batch, *slots, holder, overwritten)


def draw_ring(
    position: int = 13, window: int = 6, block_size: int = 8, block_number: int = 3
) -> Figure:
    """A ring buffer of ``block_size`` slots after writing positions 0..``position``, and the
    slots of the batch of the last ``window`` positions; returns a matplotlib Figure."""
    return draw_ring_run(run_ring(position, window, block_size, block_number))


def draw_ring_run(run: RingRun) -> Figure:
    """Draw a ``RingRun`` (see ``draw_ring``)."""
    import matplotlib.pyplot as plt

    position, window, block_size = run.position, run.window, run.block_size
    style.use_cjk_font()
    fig = plt.figure(figsize=(WIDTH, 4.6))
    ring_ax = fig.add_axes([0.0, 0.02, 0.42, 0.8])
    batch_ax = fig.add_axes([0.44, 0.3, 0.55, 0.45])
    _paint_ring(ring_ax, run)
    shared = _paint_window_batch(batch_ax, run)
    agree = run.batch_slots == run.batch_expected
    verdict = _("kernel = reference") if agree else _("KERNEL DIFFERS FROM THE REFERENCE")
    if shared:
        verdict += _(
            "; the window ({window}) is larger than the ring ({block_size} slots): "
            "tokens of this batch collide (red)"
        ).format(window=window, block_size=block_size)
    handles = [
        key(WINDOW, _("in the window")),
        key(STALE, _("older than the window")),
        key(EMPTY, _("never written")),
        key("white", _("newest token"), HIGHLIGHT, linewidth=2),
        key(PAD, _("PAD (negative position)")),
        key(HIGHLIGHT, _("slot used twice in the batch")),
    ]
    legend(fig, handles, loc="lower right", bbox_to_anchor=(0.99, 0.02), ncol=3)
    title = _(
        "Ring buffer of one block ({block_size} slots), decoding position {position}: "
        "slot = {block_number}·{block_size} + p mod {block_size}; negative p -> PAD\n"
    ).format(block_size=block_size, position=position, block_number=run.block_number)
    fig.suptitle(title + verdict, fontsize=FONT_SIZE + 1)
    fig.slotmap_run = run
    return fig


RING_COLOURS = {"empty": EMPTY, "window": WINDOW, "stale": STALE}


def _paint_ring(ax, run: RingRun) -> None:
    """Slot j is a wedge clockwise from the top, labelled with the position it holds (inside)
    and its slot number (outside); the newest token's wedge edged in red."""
    from matplotlib.patches import Wedge

    ax.set_axis_off()
    ax.set_aspect("equal")
    ax.set_xlim(-1.45, 1.45)
    ax.set_ylim(-1.3, 1.3)
    step = 360.0 / run.block_size
    size = FONT_SIZE if run.block_size <= 12 else FONT_SIZE - 2
    for j in range(run.block_size):
        start, held, state = 90 - (j + 1) * step, run.holder[j], run.state(j)
        edge = (HIGHLIGHT, 2.6, 3) if held == run.position else (EDGE, 0.8, 2)
        shape = ((0, 0), 1.0, start, start + step)
        wedge = Wedge(*shape, width=0.45, facecolor=RING_COLOURS[state], gid=f"ring-{state}")
        wedge.set(edgecolor=edge[0], linewidth=edge[1], zorder=edge[2])
        ax.add_artist(wedge)
        angle = math.radians(start + step / 2)
        cos, sin = math.cos(angle), math.sin(angle)
        label = "" if held is None else f"p {held}"
        text_colour = "white" if state == "window" else "black"
        ax.text(0.775 * cos, 0.775 * sin, label, **CENTRE, fontsize=size, color=text_colour)
        slot = str(run.block_number * run.block_size + j)
        ax.text(1.16 * cos, 1.16 * sin, slot, **CENTRE, fontsize=FONT_SIZE - 1, color="#555555")
    overwritten = sum(len(o) for o in run.overwritten)
    block = _("block {k}").format(k=run.block_number)
    ax.text(0, 0.08, block, **CENTRE, fontsize=FONT_SIZE + 1)
    note = _("{overwritten} tokens\noverwritten").format(overwritten=overwritten)
    ax.text(0, -0.14, note, **CENTRE, fontsize=FONT_SIZE - 1, color="#555555")


def _paint_window_batch(ax, run: RingRun) -> set[int]:
    """The batch of this step: position and slot of each token, from the kernel; returns the
    slots two of its tokens share (a ring smaller than the window)."""
    ax.set_axis_off()
    pad = [s == PAD_SLOT_ID for s in run.batch_slots]
    colours = [PAD if p else WINDOW for p in pad]
    boxes(ax, 1.1, colours, [str(p) for p in run.batch_positions], text_colour="white")
    shared = shared_slots(run.batch_slots)
    pairs = list(zip(pad, run.batch_slots, strict=True))
    colours = [PAD if p else HIGHLIGHT if s in shared else EMPTY for p, s in pairs]
    gids = [f"batch-{'pad' if p else 'collision' if s in shared else 'slot'}" for p, s in pairs]
    boxes(ax, 0, colours, ["PAD" if p else str(s) for p, s in pairs], gids=gids)
    row_label(ax, 1.1, _("position"), -0.3)
    row_label(ax, 0, _("slot"), -0.3)
    ax.set_xlim(-2.2, max(len(run.batch_positions), 8) + 0.2)
    ax.set_ylim(-0.3, 2.1)
    title = _(
        "the sliding window as one batch: the last {window} positions (kernel output)"
    ).format(window=run.window)
    ax.set_title(title, fontsize=FONT_SIZE)
    return shared


def draw_remainder(
    block_size: int = 4, low: int = -9, high: int = 6, block_number: int = 3
) -> Figure:
    """``p % B``: Python's floor, Triton's truncation (a kernel run), and the circular slot
    the production kernel gives, for positions ``low..high``."""
    positions = list(range(low, high + 1))
    pos = torch.tensor(positions, dtype=torch.int64, device=DEVICE)
    python = [p % block_size for p in positions]
    triton = triton_remainder(pos, block_size).cpu().tolist()
    slots = _slots(positions, block_number, block_size)[0]
    fig, axes = figure(rows=4, height_per_row=0.55)
    fig.set_figheight(fig.get_figheight() + 0.5)
    fig.subplots_adjust(left=0.2, right=0.98, top=0.8, bottom=0.02, hspace=0.25)
    negative = [p < 0 for p in positions]
    rows = [
        (_("position p"), [PAD if n else EMPTY for n in negative], positions, "position"),
        (
            _("Python p % {block_size}\n(floor)").format(block_size=block_size),
            [EMPTY] * len(positions),
            python,
            "python",
        ),
        (
            _("Triton p % {block_size}\n(truncates, like C)").format(block_size=block_size),
            [HIGHLIGHT if t < 0 else EMPTY for t in triton],
            triton,
            "triton",
        ),
        (
            _("circular slot\n(kernel)"),
            [PAD if s == PAD_SLOT_ID else WINDOW for s in slots],
            ["PAD" if s == PAD_SLOT_ID else s for s in slots],
            "slot",
        ),
    ]
    for ax, (label, colours, values, gid) in zip(axes, rows, strict=True):
        text_colour = "white" if gid == "slot" else "black"
        labels = [str(v) for v in values]
        gids = [f"{gid}-negative" if isinstance(v, int) and v < 0 else gid for v in values]
        boxes(ax, 0, colours, labels, gids=gids, font_size=FONT_SIZE - 1, text_colour=text_colour)
        row_label(ax, 0, label)
        ax.set_xlim(-0.2, len(positions) + 0.2)
        ax.set_ylim(-0.1, 0.9)
    title = _(
        "p % {block_size} on negative p: Python floors, Triton and C truncate toward zero "
        "(red: negative offsets).\nThe kernel guards p < 0 before %: negative positions get "
        "PAD, the others block {block_number}'s slots"
    ).format(block_size=block_size, block_number=block_number)
    fig.suptitle(title, fontsize=FONT_SIZE + 1)
    fig.slotmap_values = {
        "positions": positions,
        "python": python,
        "triton": triton,
        "slots": slots,
    }
    return fig


def ring_widget(position: int = 13, window: int = 6, block_size: int = 8) -> VBox:
    """``draw_ring`` with sliders for the newest position, the window and the ring's size."""
    from slotmap.viz.live import live_figure, slider

    controls = {
        "position": slider(_("position"), position, 0, 40),
        "window": slider(_("window"), window, 1, 16),
        "block_size": slider(_("ring slots (block size)"), block_size, 2, 16),
    }
    return live_figure(draw_ring, controls)
