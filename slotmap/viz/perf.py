"""Lesson 08's figures and widget: what the slot-mapping kernels cost, against the floor.

Speed is only worth plotting from a compiled kernel. So the data come from one of two places,
and every figure says which in its title:

* on an accelerator, a live run of ``slotmap bench``'s own functions (``live_results``: the
  small shapes decode256 and prefill8192, block 128, every variant, checked exactly against
  the reference before and after timing; about half a minute, mostly compiling);
* on the CPU interpreter, the committed H200 run (``benchmarks/results/h200.json``): timing
  the interpreter would measure numpy, not a kernel.

* ``draw_variants``: µs per call of every variant on one shape, block size and mode, with the
  empty kernel (launch floor) and the copy of the same bytes (bandwidth floor) as lines and
  the model's prediction, ``max(floor, bytes / bandwidth)``, on each kernel's bar.
* ``draw_eager_vs_graph``: one variant and the empty kernel, eager and in a graph, per shape.
* ``draw_prediction``: the model against every measured kernel (log-log).

Bars carry a ``gid`` ("bar-<variant>") and each figure a ``slotmap_*`` attribute with the
numbers it drew, so tests can compare a figure with the JSON.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotmap.exercises.lesson08 import (
    AT_THE_FLOOR,
    SHAPE_TOKENS,
    bandwidth_gbps,
    committed_results,
    groups_of,
    latency_floor_us,
    lookup,
    model_us,
)
from slotmap.i18n import N_, _, tr
from slotmap.viz.draw import key
from slotmap.viz.style import EDGE, FONT_SIZE, WIDTH, use_cjk_font

if TYPE_CHECKING:
    from ipywidgets import VBox
    from matplotlib.figure import Figure


VARIANT_COLOURS = {
    "window": "#0072B2",
    "direct": "#E69F00",
    "fused-1": "#009E73",
    "fused-2": "#56B4E9",
    "fused-4": "#CC79A7",
    "torch": "#D55E00",
    "empty": "#9e9e9e",
    "copy": "#cfcfcf",
}
KERNELS = ("window", "direct", "fused-1", "fused-2", "fused-4")  # what the model predicts
LIVE_SHAPES = ("decode256", "prefill8192")
LIVE_BLOCK_SIZES = (128,)
_LIVE: dict | None = None


# ---------------------------------------------------------------------------------------------
# The data: live on an accelerator, committed elsewhere
# ---------------------------------------------------------------------------------------------
def measure_bandwidth_gbps(mode: str, megabytes: int = 512) -> float:
    """A device-to-device copy of ``megabytes`` MB, read + write counted, in GB/s."""
    import torch

    from slotmap import bench
    from slotmap.backend import DEVICE

    n = megabytes * 10**6 // 2
    source = torch.ones(n, dtype=torch.uint8, device=DEVICE)
    target = torch.empty_like(source)
    run = lambda: target.copy_(source)  # noqa: E731
    us = bench.time_graph(run, 20, True) if mode == "graph" else bench.time_eager(run, True)
    return 2 * n / (us * 1e3)


def live_results(
    shapes: tuple[str, ...] = LIVE_SHAPES,
    block_sizes: tuple[int, ...] = LIVE_BLOCK_SIZES,
    log=None,
) -> dict:
    """A quick ``slotmap bench`` run on the active backend, in the bench's JSON layout, plus
    ``live: True`` and the card's copy bandwidth (``bandwidth_gbps``)."""
    from slotmap import bench
    from slotmap.backend import BACKEND, DEVICE

    modes = ["eager", "graph"] if BACKEND.name == "cuda" else ["eager"]
    result = {
        "hardware": bench.hardware(),
        "command": f"slotmap.viz.perf.live_results({list(shapes)}, {list(block_sizes)})",
        "graph_calls": 20,
        "records": [],
        "launcher": [],
        "live": True,
    }
    for name in shapes:
        for block_size in block_sizes:
            case = bench.build_case(
                {**bench.SHAPES, **bench.TINY_SHAPES}[name], block_size, DEVICE
            )
            result["records"] += bench.measure_case(
                case, list(bench.VARIANTS), modes, 20, True, log or (lambda line: None)
            )
    result["bandwidth_gbps"] = measure_bandwidth_gbps(modes[-1])
    return result


def results(refresh: bool = False) -> dict:
    """The lesson's data: a live run on an accelerator (made once, then kept), the committed
    H200 run on the CPU interpreter."""
    global _LIVE
    from slotmap.backend import BACKEND

    if BACKEND.interpreted:
        return committed_results()
    if _LIVE is None or refresh:
        _LIVE = live_results()
    return _LIVE


def describe(data: dict) -> str:
    """Where the numbers come from, for titles: hardware, date, live or committed."""
    hw = data["hardware"]
    gpu = hw.get("gpu") or hw["backend"]
    date = str(hw.get("date", ""))[:10]
    if data.get("live"):
        return _("{gpu}, {date}, live run in this notebook").format(gpu=gpu, date=date)
    source = "benchmarks/results/h200.json"
    return _("{gpu}, {date}, committed run: {source}").format(gpu=gpu, date=date, source=source)


def shapes_of(data: dict) -> list[str]:
    return list(dict.fromkeys(r["shape"] for r in data["records"]))


def block_sizes_of(data: dict) -> list[int]:
    return sorted({r["block_size"] for r in data["records"]}, reverse=True)


def modes_of(data: dict) -> list[str]:
    found = {r["mode"] for r in data["records"]}
    return [m for m in ("graph", "eager") if m in found]


def predicted_us(data: dict, shape: str, block_size: int, variant: str) -> float | None:
    """The model's time for one kernel of the run (None: no prediction for this variant)."""
    if variant not in KERNELS or shape not in SHAPE_TOKENS:
        return None
    num_tokens, max_num_tokens = SHAPE_TOKENS[shape]
    mode = "graph" if "graph" in modes_of(data) else "eager"
    floor = latency_floor_us(data, shape, block_size, mode)
    return model_us(
        num_tokens, max_num_tokens, groups_of(variant), bandwidth_gbps(data, block_size), floor
    )


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------
FLOORS = (
    ("empty", "--", N_("launch floor: empty kernel, same grid")),
    ("copy", ":", N_("bandwidth floor: copy of the same bytes")),
)
MODEL = N_("model: max(floor, bytes / bandwidth)")


def variant_times(data: dict, shape: str, block_size: int, mode: str) -> tuple[dict, dict]:
    """(µs per call of every variant the run measured, the model's µs of each kernel) for one
    shape, block size and mode; the model is drawn on graph times (eager ones where the run
    has no graph)."""
    key = (shape, block_size, mode)
    records = [r for r in data["records"] if (r["shape"], r["block_size"], r["mode"]) == key]
    if not records:
        raise ValueError(
            _("no records for {shape}/b{block_size} ({mode}) in {source}").format(
                shape=shape, block_size=block_size, mode=mode, source=describe(data)
            )
        )
    us = {r["variant"]: r["us"] for r in records}
    measured = {v: us[v] for v in VARIANT_COLOURS if v in us}
    predicted = {}
    if mode == "graph" or "graph" not in modes_of(data):
        for variant in measured:
            value = predicted_us(data, shape, block_size, variant)
            if value is not None:
                predicted[variant] = value
    return measured, predicted


def draw_variants(
    shape: str = "huge", block_size: int = 128, mode: str = "graph", data: dict | None = None
) -> Figure:
    """µs per call of every variant (bars), the empty kernel and the copy of the same bytes
    (lines), and the model's prediction (a black tick on each kernel's bar)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    data = data if data is not None else results()
    measured, predicted = variant_times(data, shape, block_size, mode)
    variants, heights = list(measured), list(measured.values())
    use_cjk_font()
    fig, ax = plt.subplots(figsize=(WIDTH, 4.4))
    colours = [VARIANT_COLOURS[v] for v in variants]
    bars = ax.bar(range(len(variants)), heights, 0.7, color=colours, edgecolor=EDGE, linewidth=0.6)
    for bar, variant in zip(bars, variants, strict=True):
        bar.set_gid(f"bar-{variant}")
    handles = []
    for variant, style, label in FLOORS:
        if variant in measured:
            us = measured[variant]
            ax.axhline(us, color="#555555", linestyle=style, linewidth=1.2, zorder=0)
            floor = _("{floor} ({us} µs)").format(floor=tr(label), us=f"{us:.3g}")
            line = {"color": "#555555", "linestyle": style, "label": floor}
            handles.append(Line2D([], [], **line))
    tick = {"color": "black", "linewidth": 2.4, "solid_capstyle": "butt"}
    for index, variant in enumerate(variants):
        if variant in predicted:
            value, gid = predicted[variant], f"predicted-{variant}"
            ax.plot([index - 0.42, index + 0.42], [value, value], **tick, gid=gid)
    if predicted:
        handles.append(Line2D([], [], color="black", linewidth=2.4, label=tr(MODEL)))
    for index, (variant, us) in enumerate(zip(variants, heights, strict=True)):
        above = max(us, predicted.get(variant, 0.0))  # the label clears the model's tick
        ax.text(index, above * 1.08, f"{us:.3g}", ha="center", va="bottom", fontsize=FONT_SIZE - 1)
    ax.set_yscale("log")
    top = max(heights + list(predicted.values()))
    bottom = min(heights + list(predicted.values()))
    ax.set_ylim(bottom / 2.5, top * 4)
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants, fontsize=FONT_SIZE)
    ax.set_ylabel(_("µs per call ({mode})").format(mode=mode), fontsize=FONT_SIZE)
    ax.tick_params(axis="y", labelsize=FONT_SIZE - 1)
    ax.legend(handles=handles, loc="upper left", fontsize=FONT_SIZE - 1, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    num_tokens, max_num_tokens = SHAPE_TOKENS.get(shape, (None, None))
    about = (
        ""
        if num_tokens is None
        else _(" ({tokens} tokens, padded to {max_num_tokens})").format(
            tokens=f"{num_tokens:,}", max_num_tokens=f"{max_num_tokens:,}"
        )
    )
    what = (
        _("inside a CUDA graph of 20 calls: device time")
        if mode == "graph"
        else _("eager: back-to-back Python calls, host launch cost included")
    )
    title = _("{shape}{about}, block {block_size}, {what}\n{source}").format(
        shape=shape, about=about, block_size=block_size, what=what, source=describe(data)
    )
    ax.set_title(title, fontsize=FONT_SIZE + 1)
    fig.tight_layout()
    fig.slotmap_bars = dict(zip(variants, heights, strict=True))
    fig.slotmap_predicted = predicted
    fig.slotmap_source = describe(data)
    return fig


def draw_eager_vs_graph(
    variant: str = "direct", block_size: int = 128, data: dict | None = None
) -> Figure:
    """``variant`` and the empty kernel, eager and in a graph, for every shape of the run."""
    import matplotlib.pyplot as plt

    data = data if data is not None else results()
    shapes = [s for s in shapes_of(data) if lookup(data, s, block_size, variant, "eager")]
    modes = modes_of(data)[::-1]  # eager first
    series = [(v, m) for m in modes for v in (variant, "empty")]
    use_cjk_font()
    fig, ax = plt.subplots(figsize=(WIDTH, 4.2))
    width = 0.8 / len(series)
    values = {}
    for j, (v, m) in enumerate(series):
        heights = [lookup(data, s, block_size, v, m)["us"] for s in shapes]
        values[(v, m)] = heights
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(shapes))]
        look = {"color": VARIANT_COLOURS[v], "hatch": "" if m == "graph" else "//"}
        bars = ax.bar(xs, heights, width, edgecolor=EDGE, linewidth=0.6, label=f"{v}, {m}", **look)
        for bar, us in zip(bars, heights, strict=True):
            bar.set_gid(f"bar-{v}-{m}")
            at = (bar.get_x() + bar.get_width() / 2, us * 1.08)
            ax.text(*at, f"{us:.3g}", ha="center", va="bottom", fontsize=FONT_SIZE - 2)
    ax.set_yscale("log")
    every = [u for h in values.values() for u in h]
    ax.set_ylim(min(every) / 2, max(every) * 5)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes, fontsize=FONT_SIZE)
    ax.set_ylabel(_("µs per call"), fontsize=FONT_SIZE)
    ax.legend(ncol=len(series), loc="upper left", fontsize=FONT_SIZE - 1, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    title = _(
        "{variant} kernel and an empty kernel, block {block_size}: eager (hatched) pays the "
        "host's launch every call, a graph replays it\n{source}"
    ).format(variant=variant, block_size=block_size, source=describe(data))
    ax.set_title(title, fontsize=FONT_SIZE + 1)
    fig.tight_layout()
    fig.slotmap_values = values
    fig.slotmap_shapes = shapes
    return fig


SHAPE_MARKERS = {
    "decode256": "o",
    "decode1024": "s",
    "mixed": "D",
    "prefill8192": "^",
    "huge": "*",
}


def prediction_points(data: dict) -> list[dict]:
    """Every kernel record of the run in graph mode (eager where it has no graph) with the
    model's µs for it, and whether 08.predict_time's check uses it (``checked``)."""
    mode = "graph" if "graph" in modes_of(data) else "eager"
    committed = data["hardware"] == committed_results()["hardware"]
    points = []
    for r in data["records"]:
        if r["mode"] != mode or r["variant"] not in KERNELS:
            continue
        predicted = predicted_us(data, r["shape"], r["block_size"], r["variant"])
        if predicted is not None:
            checked = committed and (r["shape"], r["block_size"], r["variant"]) in AT_THE_FLOOR
            points.append(dict(record=r, predicted=predicted, measured=r["us"], checked=checked))
    return points


def draw_prediction(data: dict | None = None) -> Figure:
    """Measured against predicted µs for every kernel record (graph mode where the run has
    it): on the diagonal the kernel runs at the model's floor."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    data = data if data is not None else results()
    mode = "graph" if "graph" in modes_of(data) else "eager"
    points = prediction_points(data)
    use_cjk_font()
    fig, ax = plt.subplots(figsize=(WIDTH, 5.2))
    for p in points:
        r = p["record"]
        colour, marker = VARIANT_COLOURS[r["variant"]], SHAPE_MARKERS.get(r["shape"], "o")
        look = {"s": 90 if r["shape"] == "huge" else 45, "marker": marker, "edgecolor": colour}
        fill = colour if p["checked"] else "none"
        ax.scatter(p["predicted"], p["measured"], facecolor=fill, **look, linewidth=1.4, zorder=3)
    low = min(min(p["predicted"], p["measured"]) for p in points) / 1.5
    high = max(max(p["predicted"], p["measured"]) for p in points) * 1.5
    line = [low, high]
    ax.plot(line, line, color="black", linewidth=1)
    ax.fill_between(line, line, [1.25 * x for x in line], color="#d9f0d3", zorder=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
    ax.set_xlabel(_("predicted µs: max(floor, bytes / bandwidth)"), fontsize=FONT_SIZE)
    ax.set_ylabel(_("measured µs ({mode})").format(mode=mode), fontsize=FONT_SIZE)
    variants = [v for v in KERNELS if any(p["record"]["variant"] == v for p in points)]
    shapes = [s for s in SHAPE_MARKERS if any(p["record"]["shape"] == s for p in points)]
    marker = {"linestyle": "", "color": "#555555"}
    handles = [key(VARIANT_COLOURS[v], v) for v in variants]
    handles += [Line2D([], [], marker=SHAPE_MARKERS[s], label=s, **marker) for s in shapes]
    hollow = {"markerfacecolor": "none", "markeredgecolor": "#555555"}
    handles += [
        key("#d9f0d3", _("measured 1 to 1.25x the model"), edge=None),
        Line2D([], [], marker="o", linestyle="", label=tr(HOLLOW), **hollow),
    ]
    ax.legend(handles=handles, loc="upper left", fontsize=FONT_SIZE - 1, ncol=2, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    title = _("The model against every measured kernel ({records} records)\n{source}").format(
        records=len(points), source=describe(data)
    )
    ax.set_title(title, fontsize=FONT_SIZE + 1)
    fig.tight_layout()
    fig.slotmap_points = points
    return fig


HOLLOW = N_("hollow: not in 08.predict_time's check")


# ---------------------------------------------------------------------------------------------
# Widget
# ---------------------------------------------------------------------------------------------
def perf_widget(data: dict | None = None, shape: str | None = None) -> VBox:
    """``draw_variants`` with a shape, a block size and a mode to pick."""
    import ipywidgets as widgets

    from slotmap.viz.live import WIDE, choice, live_figure

    data = data if data is not None else results()
    shapes = shapes_of(data)
    controls = {
        "shape": choice(_("shape"), shapes, shape if shape in shapes else shapes[-1]),
        "block_size": widgets.ToggleButtons(
            options=block_sizes_of(data), description=_("block size"), style=WIDE
        ),
        "mode": widgets.ToggleButtons(options=modes_of(data), description=_("mode"), style=WIDE),
    }

    def redraw(shape: str, block_size: int, mode: str):
        return draw_variants(shape, block_size, mode, data)

    return live_figure(redraw, controls)
