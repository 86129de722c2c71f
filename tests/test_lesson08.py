"""Lesson 08 (performance): its checks reject the classic byte-counting and model mistakes and
accept the solutions; its figures draw the run's numbers; its widget redraws on a change."""

from __future__ import annotations

import json
import time

import pytest
from lesson_helpers import ROOT, failure, solution_module

from slotmap.exercises import get_exercise, lesson08, run_check

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from slotmap.viz import perf  # noqa: E402

COMMITTED = lesson08.committed_results()


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    return solution_module(tmp_path_factory.mktemp("solution08"), "08_performance.ipynb")


# ---------------------------------------------------------------------------------------------
# 08.bytes_moved
# ---------------------------------------------------------------------------------------------
def test_bytes_moved_solution_passes(solution):
    assert run_check(get_exercise("08.bytes_moved"), solution.bytes_moved).passed


def test_int32_positions_are_rejected():
    found = failure("08.bytes_moved", lambda n, m, g: g * (4 * n + 4 * m))
    assert "positions counted as 4 bytes" in found.invariant
    assert (found.expected, found.got) == ("3,072", "2,048")


def test_one_groups_bytes_for_all_groups_is_rejected():
    found = failure("08.bytes_moved", lambda n, m, g: 8 * n + 4 * m)
    assert "one group's bytes for 4 groups" in found.invariant
    assert "huge, four groups" in found.case_name


def test_positions_counted_once_for_all_groups_is_rejected():
    found = failure("08.bytes_moved", lambda n, m, g: 8 * n + 4 * g * m)
    assert "counted once for all groups" in found.invariant


def test_forgotten_padding_tail_is_rejected():
    found = failure("08.bytes_moved", lambda n, m, g: g * 12 * n)
    assert "padding tail was left out" in found.invariant
    assert "6400 tokens padded to 8192" in found.case_name


def test_a_float_answer_is_accepted_only_when_whole():
    assert run_check(get_exercise("08.bytes_moved"), lambda n, m, g: float(g * (8 * n + 4 * m)))
    found = failure("08.bytes_moved", lambda n, m, g: g * (8 * n + 4 * m) + 0.5)
    assert "not a whole number of bytes" in found.invariant


# ---------------------------------------------------------------------------------------------
# 08.predict_time: against the committed H200 measurements, then the model
# ---------------------------------------------------------------------------------------------
def right(n, m, g, gbps, floor):
    return max(floor, g * (8 * n + 4 * m) / (gbps * 1e3))


def test_predict_time_solution_passes(solution):
    result = run_check(get_exercise("08.predict_time"), solution.predict_us)
    assert result.passed, result.report()
    assert result.named == 4 and result.random > 0


def test_the_model_fits_every_record_the_check_uses():
    for key in lesson08.AT_THE_FLOOR:
        case = lesson08.record_case(COMMITTED, *key)
        ratio = case.measured_us / right(*case.args())
        assert lesson08.BAND[0] <= ratio <= lesson08.BAND[1], (key, ratio)


def test_forgetting_the_floor_is_rejected():
    found = failure(
        "08.predict_time", lambda n, m, g, gbps, floor: g * (8 * n + 4 * m) / gbps / 1e3
    )
    assert "decode256/128/direct (graph), measured 1.75 µs" in found.invariant
    assert "too fast" in found.invariant and "has no floor" in found.invariant


def test_the_band_reads_the_same_in_the_exercise_and_in_its_failure():
    # The notebook said "0.95-1.25x the prediction", the failure "0.80-1.05x the measurement".
    words = lesson08.band_words()
    assert words == "the measurement must be between 0.95× and 1.25× your prediction"
    found = failure(
        "08.predict_time", lambda n, m, g, gbps, floor: 2 * right(n, m, g, gbps, floor)
    )
    assert f"({words})" in found.invariant
    text = (ROOT / "solutions" / "08_performance.ipynb").read_text(encoding="utf-8")
    assert words in " ".join("".join(json.loads(text)["cells"][5]["source"]).split())


def test_adding_the_floor_is_rejected():
    found = failure(
        "08.predict_time", lambda n, m, g, gbps, floor: floor + right(n, m, g, gbps, 0)
    )
    assert "huge/128/direct (graph), measured 13.04 µs" in found.invariant
    assert "1.24x too slow" in found.invariant
    # The evidence is the committed run's own numbers: measured 13.04, max 12.7, sum 16.2.
    assert "huge/128/direct measured 13.04 µs, the larger is 12.7 µs, the sum 16.2 µs" in (
        found.invariant
    )


def test_int32_positions_in_the_prediction_are_rejected():
    found = failure(
        "08.predict_time",
        lambda n, m, g, gbps, floor: max(floor, g * (4 * n + 4 * m) / gbps / 1e3),
    )
    assert "huge/128/direct" in found.invariant and "1.54x too fast" in found.invariant
    assert "positions counted as 4 bytes" in found.invariant
    from slotmap import i18n

    i18n.use("zh")
    try:
        found = failure(
            "08.predict_time",
            lambda n, m, g, gbps, floor: max(floor, g * (4 * n + 4 * m) / gbps / 1e3),
        )
    finally:
        i18n.use("en")
    assert "位置按 4 字节计算了：它们是 int64，每个 token 8 字节" in found.invariant


def test_ignoring_groups_is_rejected():
    found = failure(
        "08.predict_time", lambda n, m, g, gbps, floor: max(floor, (8 * n + 4 * m) / gbps / 1e3)
    )
    # The fused kernel runs under the model on the huge shape (L2 serves re-read positions):
    # four groups are graded against the model itself.
    assert "predict_us(4194304, 4194304, 4, 3990, 3.5) should be 50.4578 µs, got 12.6144" in (
        found.invariant
    )
    assert "did you count the bytes per token for every group?" in found.invariant


def test_positions_read_once_for_all_groups_is_rejected():
    found = failure(
        "08.predict_time",
        lambda n, m, g, gbps, floor: max(floor, (8 * n + 4 * g * m) / gbps / 1e3),
    )
    assert "should be 50.4578 µs, got 25.2289" in found.invariant
    assert "counted once for all groups" in found.invariant


def test_forgotten_padding_in_the_prediction_is_rejected():
    # The measured shapes are not padded: the model cases catch it.
    found = failure(
        "08.predict_time", lambda n, m, g, gbps, floor: max(floor, g * 12 * n / gbps / 1e3)
    )
    assert "padded batch" in found.case_name
    assert "padding tail was left out" in found.invariant


def test_gigabytes_as_two_to_the_thirty_are_rejected():
    # 7% off: inside the measured band, outside the model's 0.1%.
    found = failure(
        "08.predict_time",
        lambda n, m, g, gbps, floor: max(floor, g * (8 * n + 4 * m) / (gbps * 2**30 / 1e6)),
    )
    assert "10^9 bytes a second" in found.invariant


def test_seconds_instead_of_microseconds_are_rejected():
    found = failure("08.predict_time", lambda *args: right(*args) * 1e-6)
    assert "in seconds" in found.invariant


def test_a_prediction_that_is_not_a_number_is_rejected():
    found = failure("08.predict_time", lambda *args: "fast")
    assert "not a number of µs" in found.invariant


# ---------------------------------------------------------------------------------------------
# Figures: what they draw is the JSON's numbers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "block_size", "mode"),
    [
        pytest.param("huge", 128, "graph", id="huge-b128-graph"),
        pytest.param("decode256", 16, "graph", id="decode256-b16-graph"),
        pytest.param("mixed", 128, "eager", id="mixed-b128-eager"),
    ],
)
def test_variant_bars_are_the_records(shape, block_size, mode):
    fig = perf.draw_variants(shape, block_size, mode, COMMITTED)
    ax = fig.axes[0]
    bars = {p.get_gid()[4:]: p.get_height() for p in ax.patches if p.get_gid()}
    expected = {
        r["variant"]: r["us"]
        for r in COMMITTED["records"]
        if (r["shape"], r["block_size"], r["mode"]) == (shape, block_size, mode)
    }
    assert bars == expected and len(bars) == 8
    floors = sorted(line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() != "-")
    assert floors == sorted([expected["empty"], expected["copy"]])
    ticks = {line.get_gid()[10:]: line.get_ydata()[0] for line in ax.get_lines() if line.get_gid()}
    if mode == "graph":
        assert set(ticks) == {"window", "direct", "fused-1", "fused-2", "fused-4"}
        floor = lesson08.latency_floor_us(COMMITTED, shape, block_size)
        n, m = lesson08.SHAPE_TOKENS[shape]
        gbps = lesson08.bandwidth_gbps(COMMITTED, block_size)
        assert ticks["fused-4"] == pytest.approx(right(n, m, 4, gbps, floor))
    else:
        assert ticks == {}
    assert "NVIDIA H200, 2026-11-30, committed run" in ax.get_title()


def test_huge_direct_is_drawn_at_the_copy():
    fig = perf.draw_variants("huge", 128, "graph", COMMITTED)
    bars = fig.slotmap_bars
    assert bars["direct"] / bars["copy"] == pytest.approx(13.0352 / 12.72, rel=1e-3)
    assert fig.slotmap_predicted["direct"] == pytest.approx(50331648 / 3956.89e3, rel=1e-4)


def test_eager_vs_graph_shows_every_shape_both_ways():
    fig = perf.draw_eager_vs_graph("direct", 128, COMMITTED)
    ax = fig.axes[0]
    shapes = perf.shapes_of(COMMITTED)
    assert fig.slotmap_shapes == shapes
    for variant in ("direct", "empty"):
        for mode in ("eager", "graph"):
            heights = [
                p.get_height() for p in ax.patches if p.get_gid() == f"bar-{variant}-{mode}"
            ]
            want = [lesson08.lookup(COMMITTED, s, 128, variant, mode)["us"] for s in shapes]
            assert heights == want
    # Eager pays the host's launch: never less than the device's work, and on the
    # latency-bound shapes (all but huge) more than twice the graph.
    eager, graph = fig.slotmap_values[("direct", "eager")], fig.slotmap_values[("direct", "graph")]
    assert all(e >= g for e, g in zip(eager, graph, strict=True))
    latency_bound = [i for i, s in enumerate(shapes) if s != "huge"]
    assert latency_bound and all(eager[i] > 2 * graph[i] for i in latency_bound)


def test_prediction_plot_has_a_point_per_kernel_record():
    fig = perf.draw_prediction(COMMITTED)
    points = fig.slotmap_points
    kernels = [
        r for r in COMMITTED["records"] if r["mode"] == "graph" and r["variant"] in perf.KERNELS
    ]
    assert len(points) == len(kernels) == 50
    assert len(fig.axes[0].collections) >= 50
    checked = {
        (p["record"]["shape"], p["record"]["block_size"], p["record"]["variant"])
        for p in points
        if p["checked"]
    }
    assert checked == set(lesson08.AT_THE_FLOOR)
    for p in points:
        r = p["record"]
        case_floor = lesson08.latency_floor_us(COMMITTED, r["shape"], r["block_size"])
        n, m = lesson08.SHAPE_TOKENS[r["shape"]]
        gbps = lesson08.bandwidth_gbps(COMMITTED, r["block_size"])
        assert p["predicted"] == pytest.approx(
            right(n, m, lesson08.groups_of(r["variant"]), gbps, case_floor)
        )
        assert p["measured"] == r["us"]


def test_the_cpu_uses_the_committed_run():
    import slotmap

    if not slotmap.BACKEND.interpreted:
        pytest.skip("an accelerator measures live")
    assert perf.results() is COMMITTED
    assert perf.describe(COMMITTED).endswith("committed run: benchmarks/results/h200.json")


# ---------------------------------------------------------------------------------------------
# Widget
# ---------------------------------------------------------------------------------------------
def test_perf_widget_redraws_on_a_change():
    pytest.importorskip("ipywidgets")
    box = perf.perf_widget(COMMITTED)
    first = box.figure
    assert box.controls["shape"].value == "huge"
    start = time.perf_counter()
    box.controls["shape"].value = "decode1024"
    elapsed = time.perf_counter() - start
    assert box.figure is not first
    assert (
        box.figure.slotmap_bars["direct"]
        == lesson08.lookup(COMMITTED, "decode1024", 128, "direct", "graph")["us"]
    )
    box.controls["mode"].value = "eager"
    assert (
        box.figure.slotmap_bars["empty"]
        == lesson08.lookup(COMMITTED, "decode1024", 128, "empty", "eager")["us"]
    )
    assert box.figure.slotmap_predicted == {}
    print(f"perf widget update: {elapsed * 1000:.0f} ms")


# ---------------------------------------------------------------------------------------------
# 08.serving_path: the simplest launch path that fits a step's host budget
# ---------------------------------------------------------------------------------------------
def simplest_fitting(host_us, rate, share):
    budget = share * 1e6 / rate
    return next((p for p in ("jit", "mapper", "graph") if host_us[p] <= budget), "none")


def test_serving_path_solution_passes(solution):
    result = run_check(get_exercise("08.serving_path"), solution.serving_path)
    assert result.passed, result.report()
    assert result.named == 6 and result.random > 0


def test_the_named_cases_read_the_committed_ladder_and_cover_every_answer():
    host = json.loads((ROOT / "benchmarks/results/h200-host-run19.json").read_text("utf-8"))
    ways = host["ladder"]["host_us"]
    assert lesson08.ladder_paths() == {
        "jit": ways["raw-jit"],
        "mapper": ways["mapper"],
        "graph": ways["graph-replay"],
    }
    answers = [lesson08.choose_path(*case.args()) for _, case in lesson08._path_cases()]
    assert set(answers) == {"jit", "mapper", "graph", "none"}


@pytest.mark.parametrize(
    ("wrong", "said"),
    [
        (lambda h, r, s: simplest_fitting(h, r, s / 1e3), "milliseconds"),
        (lambda h, r, s: simplest_fitting(h, r, 1.0), "whole step"),
        (lambda h, r, s: simplest_fitting(h, r, s / 100), "a fraction"),
        (
            lambda h, r, s: next(
                (p for p in ("graph", "mapper", "jit") if h[p] <= s * 1e6 / r), "none"
            ),
            "simplest path that fits",
        ),
        (
            lambda h, r, s: "graph" if simplest_fitting(h, r, s) == "none" else None,
            "the answer is one of",
        ),
    ],
    ids=[
        "period in milliseconds",
        "the whole step",
        "share as a percentage",
        "the cheapest path",
        "not a path name",
    ],
)
def test_serving_path_mistakes_are_named(wrong, said):
    found = failure("08.serving_path", wrong)
    assert said in found.invariant or said in found.hint, found.invariant


def test_never_answering_none_is_named():
    def never_none(h, r, s):
        answer = simplest_fitting(h, r, s)
        return "graph" if answer == "none" else answer

    found = failure("08.serving_path", never_none)
    assert "the answer is 'none'" in found.invariant
    assert "20,000 steps" in found.case_name
