"""The live figure's Output shows its figure as widget state, set in one assignment, and never
by capturing output: nbclient echoes captured output back to the kernel on the shell socket it
is waiting on, which can stall a plain ``jupyter nbconvert --execute`` (docs/headless-stall.md).
"""

from __future__ import annotations

import base64

import matplotlib
import pytest

matplotlib.use("Agg")
pytest.importorskip("ipywidgets")

import matplotlib.pyplot as plt  # noqa: E402

from slotmap.viz import live  # noqa: E402


def draw(width: int, fail: bool = False):
    if fail:
        raise ValueError("a setting the figure refuses")
    print(f"drawing {width}")
    fig, ax = plt.subplots(figsize=(width, 1), dpi=50)
    ax.plot([0, 1], [0, width])
    return fig


def shown(box) -> list[dict]:
    return list(box.children[1].outputs)


def test_the_figure_is_the_outputs_state_not_captured_output(capsys):
    width = live.slider("width", 2, 1, 4)
    box = live.live_figure(draw, {"width": width})
    printed, figure = shown(box)
    assert printed == {"output_type": "stream", "name": "stdout", "text": "drawing 2\n"}
    assert figure["output_type"] == "display_data"
    assert base64.b64decode(figure["data"]["image/png"]).startswith(b"\x89PNG")
    assert figure["data"]["text/plain"] == "<Figure size 100x50>"
    assert box.children[1].msg_id == ""  # nothing was captured into the Output
    assert capsys.readouterr().out == ""  # and nothing went to the cell instead
    first = figure["data"]["image/png"]
    width.value = 3  # a redraw replaces the figure, in one assignment
    printed, figure = shown(box)
    assert printed["text"] == "drawing 3\n" and figure["data"]["image/png"] != first
    assert figure["data"]["text/plain"] == "<Figure size 150x50>"
    assert box.figure.get_size_inches()[0] == 3 and len(box.seconds) == 2


def test_an_error_shows_in_the_widget_in_a_notebook_and_reaches_the_caller_outside(
    monkeypatch,
):
    width, fail = live.slider("width", 2, 1, 4), live.choice("fail", [False, True])
    box = live.live_figure(draw, {"width": width, "fail": fail})
    with pytest.raises(ValueError, match="refuses"):
        fail.value = True
    monkeypatch.setattr(live, "_kernel", lambda: object())  # as inside an IPython kernel
    width.value = 3
    (error,) = shown(box)
    assert (error["output_type"], error["ename"], error["evalue"]) == (
        "error",
        "ValueError",
        "a setting the figure refuses",
    )
    assert "Traceback" in error["traceback"][0]
    assert box.figure.get_size_inches()[0] == 2  # the last figure drawn
