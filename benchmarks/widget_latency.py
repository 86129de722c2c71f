"""How long a lesson widget takes to follow a control, on the active backend.

For each widget: build it, then move each of its controls through a few values; every move
re-runs the real kernel, draws the figure and renders the PNG the notebook shows
(``box.seconds`` times all of that; the browser's decoding is not included). Prints a
markdown table of medians and maxima over all moves.

    SLOTMAP_BACKEND=cpu python benchmarks/widget_latency.py [--moves 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics

import matplotlib

matplotlib.use("Agg")

import slotmap  # noqa: E402  (chooses the backend first)
from slotmap.viz.attention import cp_attention_widget, paged_attention_widget  # noqa: E402
from slotmap.viz.circular import ring_widget  # noqa: E402
from slotmap.viz.cp import ownership_widget  # noqa: E402
from slotmap.viz.groups import groups_widget, replay_widget  # noqa: E402
from slotmap.viz.hybrid import hybrid_widget  # noqa: E402
from slotmap.viz.paged import paged_widget  # noqa: E402
from slotmap.viz.perf import perf_widget  # noqa: E402
from slotmap.viz.tiles import tiles_widget  # noqa: E402
from slotmap.viz.window import window_failure_widget, window_widget  # noqa: E402

WIDGETS = {
    "01 paged_widget": paged_widget,
    "02 tiles_widget": tiles_widget,
    "03 window_widget": window_widget,
    "03 window_failure_widget": window_failure_widget,
    "04 ring_widget": ring_widget,
    "05 ownership_widget": ownership_widget,
    "06 hybrid_widget": hybrid_widget,
    "06 groups_widget": groups_widget,
    "06 replay_widget": replay_widget,
    "07 paged_attention_widget": paged_attention_widget,
    "07 cp_attention_widget": cp_attention_widget,
    "08 perf_widget": perf_widget,
}


def values_to_try(control, moves: int) -> list:
    if hasattr(control, "options"):
        options = [o[1] if isinstance(o, tuple) else o for o in control.options]
        return [o for o in options if o != control.value][:moves]
    if isinstance(control.value, bool):
        return [not control.value, control.value][:moves]
    low, high = control.min, control.max
    return [low + (high - low) * (i + 1) // (moves + 1) for i in range(moves)]


def measure(build, moves: int) -> list[float]:
    # Outside a notebook, an Output widget prints its clear-screen codes: keep them out.
    with contextlib.redirect_stdout(io.StringIO()):
        box = build()
        for control in box.controls.values():
            for value in values_to_try(control, moves):
                control.value = value
    return box.seconds[1:]  # every move; the first entry is the widget's first drawing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--moves", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    lines = [
        f"Widget updates on backend `{slotmap.BACKEND.name}`: kernel run + figure + PNG, "
        f"ms per move ({args.moves} moves per control)",
        "",
        "| widget | moves | median | max |",
        "| --- | --- | --- | --- |",
    ]
    for name, build in WIDGETS.items():
        seconds = measure(build, args.moves)
        lines.append(
            f"| {name} | {len(seconds)} | {statistics.median(seconds) * 1e3:.0f} | "
            f"{max(seconds) * 1e3:.0f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
