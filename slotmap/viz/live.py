"""The one widget pattern every lesson uses: controls, and a figure redrawn from a real kernel
run at every change."""

from __future__ import annotations

import base64
import contextlib
import io
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from slotmap.i18n import _

if TYPE_CHECKING:
    from ipywidgets import Dropdown, HBox, IntSlider, VBox


def live_figure(
    draw: Callable[..., Any],
    controls: dict[str, Any],
    layout: Any | None = None,
) -> VBox:
    """Controls + an Output showing ``draw(**{name: control.value})``, redrawn on every change.

    ``layout``: how the controls are arranged (default: one row). Returns the widget box, with
    ``box.controls`` (name -> control; tests move them), ``box.figure`` (the latest figure)
    and ``box.seconds`` (how long each redraw took: kernel run, figure and its PNG, without
    the browser's part)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    output = widgets.Output()
    # Controls wrap onto a second row rather than squeezing their sliders.
    row = widgets.HBox(list(controls.values()), layout=widgets.Layout(flex_flow="row wrap"))
    box = widgets.VBox([layout or row, output])
    box.controls, box.figure, box.seconds = controls, None, []

    def redraw(_change: Any = None) -> None:
        start = time.perf_counter()
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                figure = draw(**{name: control.value for name, control in controls.items()})
        except Exception as error:
            if _kernel() is None:
                raise  # outside a notebook, the caller sees it
            shown = [_error_output(error)]  # in one, the widget shows it, as a cell would
        else:
            box.figure = figure
            # One PNG render: the inline backend's plt.show() would crop to a tight bounding
            # box, which draws the figure twice (the course's figures fill their canvas).
            png = io.BytesIO()
            figure.savefig(png, format="png")
            # Closed, so that the inline backend does not show it a second time, frozen, under
            # the widget when the cell ends (the Figure object stays usable: tests inspect it).
            plt.close(figure)
            shown = [_png_output(png.getvalue(), figure)]
        if printed.getvalue():
            shown.insert(
                0, {"output_type": "stream", "name": "stdout", "text": printed.getvalue()}
            )
        # The Output's state, set in one assignment, rather than `with output: display(...)`:
        # output captured that way is echoed back by nbclient on the kernel's shell socket while
        # it waits there for the cell's reply, and the send can swallow the reply's wake-up
        # (docs/headless-stall.md): plain nbconvert and nbclient then stall a finished cell.
        output.outputs = tuple(shown)
        box.seconds.append(time.perf_counter() - start)

    for control in controls.values():
        control.observe(redraw, names="value")
    redraw()
    return box


def _kernel() -> Any:
    """The running IPython kernel's shell, or None outside one."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _png_output(png: bytes, figure: Any) -> dict:
    """A display_data output of the PNG, as ``display(Image(png))`` would publish it."""
    width, height = (round(v) for v in figure.get_size_inches() * figure.dpi)
    data = {
        "image/png": base64.b64encode(png).decode("ascii"),
        "text/plain": f"<Figure size {width}x{height}>",
    }
    return {"output_type": "display_data", "data": data, "metadata": {}}


def _error_output(error: BaseException) -> dict:
    """An error output of ``error`` with its traceback, as a cell that raised it shows."""
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    return {
        "output_type": "error",
        "ename": type(error).__name__,
        "evalue": str(error),
        "traceback": [line.rstrip("\n") for line in lines],
    }


def columns(*groups: list) -> HBox:
    """Controls in side-by-side columns that wrap under each other in a narrow notebook."""
    import ipywidgets as widgets

    return widgets.HBox(
        [widgets.VBox(list(group)) for group in groups],
        layout=widgets.Layout(flex_flow="row wrap"),
    )


WIDE = {"description_width": "initial"}  # the whole description, however long


def slider(description: str, value: int, low: int, high: int, wide: bool = True) -> IntSlider:
    """An integer slider from ``low`` to ``high``."""
    import ipywidgets as widgets

    style = WIDE if wide else {}
    return widgets.IntSlider(value=value, min=low, max=high, description=description, style=style)


def choice(description: str, options: Sequence, value: Any = None, wide: bool = True) -> Dropdown:
    """A dropdown of ``options`` (default value: the first)."""
    import ipywidgets as widgets

    value = options[0] if value is None else value
    style = WIDE if wide else {}
    return widgets.Dropdown(options=options, value=value, description=description, style=style)


def request_sliders(lengths: Sequence[int], high: int, count: int = 3) -> dict:
    """``request_0`` .. : one length slider a request, ``count`` of them (missing ones 0)."""
    lengths = list(lengths)[:count] + [0] * (count - len(lengths))
    return {
        f"request_{q}": slider(_("request {request}").format(request=q), n, 0, high, False)
        for q, n in enumerate(lengths)
    }


def split_columns(controls: dict, first: int) -> HBox:
    """The first ``first`` controls in one column, the rest in a second (``columns``)."""
    values = list(controls.values())
    return columns(values[:first], values[first:])


def sweep_live_figures(limit: int = 4) -> int:
    """Move every control of every live figure in this kernel through its range (a slider's
    ends, a choice's first ``limit`` options, both states of a box), one control at a time,
    then back: each change re-runs the real kernel at that setting. Returns the redraws.

    For recording what the widgets launch at every setting a learner can reach
    (``slotmap.ascend``), not for the lessons."""
    from ipywidgets.widgets.widget import _instances

    redraws = 0
    for box in [w for w in list(_instances.values()) if hasattr(w, "controls")]:
        for control in box.controls.values():
            start = control.value
            if hasattr(control, "options") and control.options:
                labels = [o[1] if isinstance(o, tuple) else o for o in control.options]
                values = labels[:limit] + labels[-1:]
            elif hasattr(control, "min") and hasattr(control, "max"):
                values = [control.min, control.max]
            elif isinstance(start, bool):
                values = [not start]
            else:
                continue
            for value in [*values, start]:
                if value != control.value:
                    # A setting may be one the figure refuses (it says why): go on sweeping.
                    with contextlib.suppress(Exception):
                        control.value = value
                    redraws += 1
    return redraws
