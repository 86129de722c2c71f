"""Lesson 08's exercises: predict a slot-mapping kernel's time from the bytes it moves.

* ``08.bytes_moved``: ``bytes_moved(num_tokens, max_num_tokens, groups) -> int``, the bytes
  one call moves to and from memory: each group's programs read every token's position
  (int64, 8 B) and write every entry of their output row, padding included (int32, 4 B).
* ``08.predict_time``: ``predict_us(num_tokens, max_num_tokens, groups, copy_gbps, floor_us)
  -> float``, the model ``max(floor, bytes / bandwidth)`` in µs. Checked against the
  MEASURED H200 times of the committed run (``benchmarks/results/h200.json``, on every
  backend: grading never depends on a noisy live run) for the kernels that reach the model,
  and against the model itself on random inputs.

The judges name the classic mistakes: int32 positions (4 B), one group's bytes for G groups,
positions counted once for all groups, the padding tail forgotten, the floor forgotten or
added instead of taken as the larger, GB as 2**30, and µs confused with seconds.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from hypothesis import strategies as st

from slotmap.exercises.core import Exercise, Wrong, register
from slotmap.i18n import N_, _

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "benchmarks" / "results" / "h200.json"

POSITION_BYTES = 8  # positions are int64
SLOT_BYTES = 4  # slot_mapping is int32
TABLE_ENTRY_BYTES = 4  # block-table entries are int32

# Tokens of each benchmark shape (slotmap.bench.SHAPES): (num_tokens, max_num_tokens).
SHAPE_TOKENS = {
    "decode256": (256, 256),
    "decode1024": (1024, 1024),
    "mixed": (4 * 1536 + 256, 8192),
    "prefill8192": (8192, 8192),
    "huge": (64 * 65536, 64 * 65536),
}
# The latency floor of the direct kernel on the decode shapes on the H200: its token grid
# leaves the chain position -> block-table entry -> store, whose cost benchmarks/sweep.py's
# ladder measures ("2 dependent loads + store"; docs/performance.md, "The floors").
# Elsewhere the floor is the empty kernel on the same grid, measured in the same run.
H200_CHAIN_FLOOR_US = {"decode256": 1.61, "decode1024": 1.61}

# measured / predicted must lie in this band: a floor is not beaten by more than run-to-run
# noise (about 3%, benchmarks/NOTES.md), and the direct kernel the check compares with sits
# 2% to 13% above it (decode1024 is the farthest).
BAND = (0.95, 1.25)
RELATIVE = 1e-3  # against the model itself: float arithmetic only


def band_words() -> str:
    """The band in words, as exercise 08's text states it."""
    return _(
        "the measurement must be between {band:.2f}× and {band2:.2f}× your prediction"
    ).format(band=BAND[0], band2=BAND[1])


# ---------------------------------------------------------------------------------------------
# The model (the lesson shows it; the exercises ask for it)
# ---------------------------------------------------------------------------------------------
def kernel_bytes(num_tokens: int, max_num_tokens: int, groups: int = 1) -> int:
    """Bytes one call moves: each group reads the positions and writes its padded row."""
    return groups * (POSITION_BYTES * num_tokens + SLOT_BYTES * max_num_tokens)


def model_us(
    num_tokens: int, max_num_tokens: int, groups: int, copy_gbps: float, floor_us: float
) -> float:
    """max(latency floor, bytes / copy bandwidth), in µs (GB/s = 1e9 bytes a second)."""
    return max(floor_us, kernel_bytes(num_tokens, max_num_tokens, groups) / (copy_gbps * 1e3))


# ---------------------------------------------------------------------------------------------
# The committed measurements
# ---------------------------------------------------------------------------------------------
@cache
def committed_results() -> dict:
    """The committed H200 run of ``slotmap bench`` (hardware, records, launcher)."""
    return json.loads(COMMITTED.read_text(encoding="utf-8"))


def lookup(results: dict, shape: str, block: int, variant: str, mode: str) -> dict | None:
    for r in results["records"]:
        if (r["shape"], r["block_size"], r["variant"], r["mode"]) == (shape, block, variant, mode):
            return r
    return None


def bandwidth_gbps(results: dict, block: int | None = None) -> float:
    """The copy bandwidth of the run: the largest shape's copy (same block size if given),
    in a graph where the run has one. A small copy is latency-bound, not a bandwidth."""
    copies = [r for r in results["records"] if r["variant"] == "copy" and r["gbps"]]
    graph = [r for r in copies if r["mode"] == "graph"] or copies
    if "bandwidth_gbps" in results:  # a live run measures the card's copy separately
        return float(results["bandwidth_gbps"])
    if not graph:
        raise ValueError("the results hold no copy measurement")
    same = [r for r in graph if block is None or r["block_size"] == block] or graph
    largest = max(same, key=lambda r: r["bytes"])
    return float(largest["gbps"])


def latency_floor_us(results: dict, shape: str, block: int, mode: str = "graph") -> float:
    """The model's floor: the H200's measured dependent chain on the decode grids (committed
    run, graph mode), else the empty kernel on the same grid in the same run."""
    committed = results.get("hardware") == committed_results()["hardware"]
    if committed and mode == "graph" and shape in H200_CHAIN_FLOOR_US:
        return H200_CHAIN_FLOOR_US[shape]
    empty = lookup(results, shape, block, "empty", mode)
    if empty is None:
        raise ValueError(f"no empty-kernel record for {shape}/b{block} ({mode})")
    return float(empty["us"])


def groups_of(variant: str) -> int:
    return int(variant.split("-")[1]) if variant.startswith("fused-") else 1


@dataclass(frozen=True)
class TimeCase:
    """One call to predict: the batch, the run's bandwidth and floor, and (for a record of
    the committed run) the measured time."""

    num_tokens: int
    max_num_tokens: int
    groups: int
    copy_gbps: float
    floor_us: float
    measured_us: float | None = None
    record: str = ""  # "huge/128/direct (graph)"

    def args(self) -> tuple:
        return (self.num_tokens, self.max_num_tokens, self.groups, self.copy_gbps, self.floor_us)

    def __str__(self) -> str:
        text = (
            f"num_tokens={self.num_tokens}, max_num_tokens={self.max_num_tokens}, "
            f"groups={self.groups}, copy_gbps={self.copy_gbps:g}, floor_us={self.floor_us:g}"
        )
        if self.record:
            text += f"  [{self.record}, measured {self.measured_us:.4g} µs]"
        return text


def record_case(results: dict, shape: str, block: int, variant: str) -> TimeCase:
    """The time case of one graph-mode record of ``results``."""
    r = lookup(results, shape, block, variant, "graph")
    if r is None:
        raise ValueError(f"no record {shape}/{block}/{variant} (graph)")
    num_tokens, max_num_tokens = SHAPE_TOKENS[shape]
    return TimeCase(
        num_tokens,
        max_num_tokens,
        groups_of(variant),
        bandwidth_gbps(results, block),
        latency_floor_us(results, shape, block),
        float(r["us"]),
        f"{shape}/{block}/{variant} (graph)",
    )


# The records the model is checked against: the kernels that reach it. Lesson 08 shows the
# others: the window kernel sits above it (its reduction and gather), the fused kernel's
# extra programs lift its floor on decode1024 and mixed, and on the huge shape the fused
# kernel runs UNDER the model: its groups' programs load the positions again, which the
# model counts, but the L2 cache serves many of those loads (benchmarks/NOTES.md).
AT_THE_FLOOR = [
    (shape, block, variant)
    for block in (128, 16)
    for shape in ("decode256", "decode1024", "huge")
    for variant in ("direct",)
]


@cache
def _overlap_evidence() -> str:
    """The committed run's own case for max() over sum: the huge shape, direct, block 128."""
    results = committed_results()
    n, m = SHAPE_TOKENS["huge"]
    measured = lookup(results, "huge", 128, "direct", "graph")["us"]
    floor = latency_floor_us(results, "huge", 128)
    bandwidth = kernel_bytes(n, m) / (bandwidth_gbps(results, 128) * 1e3)
    return _(
        "the data: huge/128/direct measured {measured:.4g} µs, the larger is {max:.3g} "
        "µs, the sum {value:.3g} µs"
    ).format(measured=measured, max=max(floor, bandwidth), value=floor + bandwidth)


# ---------------------------------------------------------------------------------------------
# What a wrong number usually means
# ---------------------------------------------------------------------------------------------
def _mistakes(n: int, m: int, g: int, gbps: float, floor: float) -> list[tuple[float, str]]:
    """(value, explanation) of the known-wrong models, most specific first."""

    def time(b: float, bw: float = gbps) -> float:
        return max(floor, b / (bw * 1e3))

    right = kernel_bytes(n, m, g)
    return [
        (
            time(g * (4 * n + 4 * m)),
            _("positions counted as 4 bytes: they are int64, 8 bytes a token"),
        ),
        (
            time(8 * n + 4 * m),
            _(
                "did you count the bytes per token for every group? Each of the {g} groups' "
                "programs reads the positions and writes its own slot row: G x (8 + 4) bytes a "
                "token"
            ).format(g=g),
        ),
        (
            time(8 * n + 4 * g * m),
            _(
                "the positions were counted once for all groups: the fused kernel gives each "
                "group its own programs and each loads the positions again (the bench's GB/s "
                "column counts them once: the least a kernel could move, not what this one's "
                "loads ask for)"
            ),
        ),
        (
            time(g * (8 * n + 4 * n)),
            _(
                "the padding tail was left out: every group writes all max_num_tokens entries of "
                "its output row (PAD_ID in the tail), 4 bytes each"
            ),
        ),
        (
            time(g * (8 * n + 8 * m)),
            _("slots counted as 8 bytes: slot_mapping is int32, 4 bytes an entry"),
        ),
        (
            time(right, gbps * 2**30 / 1e9),
            _("GB/s here means 10^9 bytes a second (the bench divides by 1e9), not 2^30"),
        ),
        (
            right / (gbps * 1e3),
            _(
                "the prediction has no floor: a kernel never takes less than its latency floor "
                "(here {floor} µs: launching the grid and the dependent loads before the "
                "store), however few bytes it moves"
            ).format(floor=f"{floor:g}"),
        ),
        (
            floor + right / (gbps * 1e3),
            _(
                "the floor was added to the bandwidth time: while thousands of programs stream "
                "their bytes, the launch and the first loads overlap with them, so the time is "
                "the larger of the two ({evidence})"
            ).format(evidence=_overlap_evidence()),
        ),
        (floor, _("the prediction is the floor alone: the bytes were left out")),
        (
            model_us(n, m, g, gbps, floor) * 1e-6,
            _("the prediction is in seconds: the answer is in µs (bytes / (GB/s x 1e3) is µs)"),
        ),
        (
            model_us(n, m, g, gbps, floor) * 1e3,
            _("the prediction is in nanoseconds: the answer is in µs"),
        ),
    ]


def diagnose_prediction(case: TimeCase, got: float) -> str:
    """Which known mistake ``got`` matches, in words ("" when none does)."""
    expected = model_us(*case.args())
    for value, why in _mistakes(*case.args()):
        if not math.isclose(value, expected, rel_tol=RELATIVE) and math.isclose(
            got, value, rel_tol=RELATIVE
        ):
            return why
    return ""


def _number(got: object, call: str) -> float:
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        raise Wrong(
            _("{call} returned {got!r}, not a number of µs").format(call=call, got=got),
            _("a float"),
            repr(got),
        )
    value = float(got)
    if not math.isfinite(value) or value <= 0:
        raise Wrong(
            _("{call} returned {value}: a time must be a positive, finite number of µs").format(
                call=call, value=value
            )
        )
    return value


PREDICT_HINT = N_(
    "Count the bytes from the kernel's loads and stores: what each token moves, what "
    "each entry of an output row moves, and how many rows. Mind the units (1 GB/s is "
    "1e3 bytes a µs), and remember the launch floor: the slower limit is the one "
    "that binds."
)


def judge_prediction(candidate: Callable[..., float], case: TimeCase) -> None:
    call = "predict_us({}, {}, {}, {:g}, {:g})".format(*case.args())
    got = _number(candidate(*case.args()), call)
    expected = model_us(*case.args())
    why = diagnose_prediction(case, got)
    if case.measured_us is not None:
        ratio = case.measured_us / got
        if BAND[0] <= ratio <= BAND[1]:
            return
        speed = f"{ratio:.3g}x too fast" if ratio > 1 else f"{1 / ratio:.3g}x too slow"
        raise Wrong(
            _(
                "predicted {got:.4g} µs for {record}, measured {measured_us:.4g} µs: {speed} "
                "({band_words})"
            ).format(
                got=got,
                record=case.record,
                measured_us=case.measured_us,
                speed=speed,
                band_words=band_words(),
            )
            + (f": {why}" if why else ""),
            _(
                "{expected:.4g} µs (max(floor, bytes / bandwidth)); measured {measured_us:.4g} µs"
            ).format(expected=expected, measured_us=case.measured_us),
            f"{got:.4g} µs",
            PREDICT_HINT,
        )
    if not math.isclose(got, expected, rel_tol=RELATIVE):
        raise Wrong(
            _("{call} should be {expected:.6g} µs, got {got:.6g}").format(
                call=call, expected=expected, got=got
            )
            + (f": {why}" if why else _(" ({value:.3g}x the model)").format(value=got / expected)),
            f"{expected:.6g} µs",
            f"{got:.6g} µs",
            PREDICT_HINT,
        )


def _time_cases() -> list[tuple[str, TimeCase]]:
    results = committed_results()
    return [
        (
            N_("decode256/128/direct: 3 KB, latency-bound"),
            record_case(results, "decode256", 128, "direct"),
        ),
        (
            N_("huge/128/direct: 50 MB, bandwidth-bound"),
            record_case(results, "huge", 128, "direct"),
        ),
        (
            N_("the huge shape in four groups (model)"),
            TimeCase(64 * 65536, 64 * 65536, 4, 3990.0, 3.5),
        ),
        (
            N_("a padded batch with two groups (model)"),
            TimeCase(3_000_000, 4_194_304, 2, 4000.0, 2.0),
        ),
    ]


@st.composite
def _synthetic_time_case(draw: st.DrawFn) -> TimeCase:
    num_tokens = draw(st.integers(0, 1 << 23))
    max_num_tokens = num_tokens + draw(st.integers(0, 1 << 21))
    return TimeCase(
        num_tokens,
        max_num_tokens,
        draw(st.integers(1, 4)),
        draw(st.sampled_from([500.0, 1600.0, 3300.0, 3939.0, 4800.0, 8000.0])),
        draw(st.sampled_from([0.8, 1.2, 2.0, 3.5, 15.0])),
    )


def _time_strategy() -> st.SearchStrategy:
    results = committed_results()
    records = [record_case(results, *key) for key in AT_THE_FLOOR]
    return st.one_of(st.sampled_from(records), _synthetic_time_case())


register(
    Exercise(
        id="08.predict_time",
        title=N_("predict a kernel's time from the bytes it moves"),
        cases=_time_cases,
        strategy=_time_strategy,
        judge=judge_prediction,
        hint=PREDICT_HINT,
        max_examples=60,
    )
)


# ---------------------------------------------------------------------------------------------
# 08.bytes_moved
# ---------------------------------------------------------------------------------------------
BYTES_HINT = N_(
    "Per group: 8 bytes for each real token's position (int64, read) and 4 bytes for "
    "each of the max_num_tokens entries of the output row (int32, written, padding "
    "included)."
)


@dataclass(frozen=True)
class BytesCase:
    num_tokens: int
    max_num_tokens: int
    groups: int

    def __str__(self) -> str:
        return (
            f"num_tokens={self.num_tokens}, max_num_tokens={self.max_num_tokens}, "
            f"groups={self.groups}"
        )


def diagnose_bytes(case: BytesCase, got: int) -> str:
    n, m, g = case.num_tokens, case.max_num_tokens, case.groups
    expected = kernel_bytes(n, m, g)
    known = [
        (g * (4 * n + 4 * m), "positions counted as 4 bytes: they are int64, 8 bytes a token"),
        (
            8 * n + 4 * m,
            f"one group's bytes for {g} groups: each group's programs read the positions and "
            "write their own row",
        ),
        (
            8 * n + 4 * g * m,
            "the positions were counted once for all groups: each group's programs read them "
            "again (once is the least a kernel could move, not what this one moves)",
        ),
        (
            g * 12 * n,
            "the padding tail was left out: every entry of the output row is written, "
            "max_num_tokens of them",
        ),
        (g * (8 * n + 8 * m), "slots counted as 8 bytes: slot_mapping is int32, 4 bytes"),
        (
            g * (8 * m + 4 * m),
            "positions counted for the padding tail too: only real tokens have a position to read",
        ),
        (expected * 8, "bits, not bytes"),
    ]
    for value, why in known:
        if value != expected and got == value:
            return why
    return ""


def judge_bytes(candidate: Callable[..., int], case: BytesCase) -> None:
    call = f"bytes_moved({case.num_tokens}, {case.max_num_tokens}, {case.groups})"
    got = candidate(case.num_tokens, case.max_num_tokens, case.groups)
    if hasattr(got, "item"):
        got = got.item()
    if isinstance(got, float) and got.is_integer():
        got = int(got)
    if isinstance(got, bool) or not isinstance(got, int):
        raise Wrong(
            _("{call} returned {got!r}, not a whole number of bytes").format(call=call, got=got),
            _("an int"),
            repr(got),
        )
    expected = kernel_bytes(case.num_tokens, case.max_num_tokens, case.groups)
    if got == expected:
        return
    why = diagnose_bytes(case, got)
    raise Wrong(
        _("{call} should be {expected:,} bytes, got {got:,}").format(
            call=call, expected=expected, got=got
        )
        + (f": {why}" if why else _(" ({value:+,} bytes)").format(value=got - expected)),
        f"{expected:,}",
        f"{got:,}",
        BYTES_HINT,
    )


def _bytes_cases() -> list[tuple[str, BytesCase]]:
    return [
        (N_("decode256: 256 requests x 1 token"), BytesCase(256, 256, 1)),
        (N_("huge: 64 x 65536 tokens"), BytesCase(*SHAPE_TOKENS["huge"], 1)),
        (N_("mixed: 6400 tokens padded to 8192"), BytesCase(*SHAPE_TOKENS["mixed"], 1)),
        (N_("huge, four groups in one launch"), BytesCase(*SHAPE_TOKENS["huge"], 4)),
        (N_("an empty batch: only the padding tail, two groups"), BytesCase(0, 8, 2)),
    ]


@st.composite
def _bytes_strategy(draw: st.DrawFn) -> BytesCase:
    num_tokens = draw(st.integers(0, 100_000))
    return BytesCase(num_tokens, num_tokens + draw(st.integers(0, 5000)), draw(st.integers(1, 4)))


register(
    Exercise(
        id="08.bytes_moved",
        title=N_("the bytes one slot-mapping call moves"),
        cases=_bytes_cases,
        strategy=lambda: _bytes_strategy(),
        judge=judge_bytes,
        hint=BYTES_HINT,
        max_examples=60,
    )
)


# ---------------------------------------------------------------------------------------------
# 08.serving_path: which launch path a serving loop takes, from the committed host ladder.
# ---------------------------------------------------------------------------------------------
COMMITTED_HOST = ROOT / "benchmarks" / "results" / "h200-host-run19.json"
# The paths a loop can take, simplest first: the JIT needs nothing, the mapper needs its
# buffers held, a graph needs a captured graph per token bucket and the batch padded to it.
PATHS = ("jit", "mapper", "graph")
NO_PATH = "none"
# Where each path's host µs a step comes from in the committed ladder.
LADDER_WAYS = {"jit": "raw-jit", "mapper": "mapper", "graph": "graph-replay"}


@cache
def committed_host() -> dict:
    """The committed H200 run with the host-cost ladder and the serving trace (run 19)."""
    return json.loads(COMMITTED_HOST.read_text(encoding="utf-8"))


def ladder_paths(results: dict | None = None) -> dict[str, float]:
    """Host µs a step of each path, from a run's ladder (default: the committed run)."""
    host_us = (results or committed_host())["ladder"]["host_us"]
    return {path: float(host_us[way]) for path, way in LADDER_WAYS.items()}


def step_budget_us(steps_per_second: float, share: float) -> float:
    """The host µs a step leaves the slot mapping: its share of the step's period."""
    return share * 1e6 / steps_per_second


def choose_path(host_us: dict[str, float], steps_per_second: float, share: float) -> str:
    """The simplest path whose host µs a step fits the budget; NO_PATH if none does."""
    budget = step_budget_us(steps_per_second, share)
    return next((path for path in PATHS if host_us[path] <= budget), NO_PATH)


@dataclass(frozen=True)
class PathCase:
    host_us: tuple[tuple[str, float], ...]  # (path, host µs a step), PATHS' order
    steps_per_second: float
    share: float

    def args(self) -> tuple:
        return (dict(self.host_us), self.steps_per_second, self.share)

    def __str__(self) -> str:
        ladder = ", ".join(f"{path} {us:g} µs" for path, us in self.host_us)
        return _("{rate:g} steps a second, share {share:g}, host_us {ladder}").format(
            rate=self.steps_per_second, share=self.share, ladder=ladder
        )


def _path_mistakes(case: PathCase) -> list[tuple[str, str]]:
    """(answer, explanation) of the known-wrong rules, most specific first."""
    host_us, rate, share = case.args()

    def first_fitting(budget: float, order=PATHS) -> str:
        return next((path for path in order if host_us[path] <= budget), NO_PATH)

    budget = step_budget_us(rate, share)
    return [
        (
            first_fitting(share * 1e3 / rate),
            _(
                "the step's period was taken in milliseconds: a loop of S steps a second has "
                "1e6 / S µs a step, and the ladder is in µs"
            ),
        ),
        (
            first_fitting(1e6 / rate),
            _(
                "the whole step was given to the slot mapping: it may take only its share of "
                "the step (share x 1e6 / steps_per_second µs)"
            ),
        ),
        (
            first_fitting(share / 100 * 1e6 / rate),
            _("share is a fraction (0.05 is 5%), not a percentage"),
        ),
        (
            first_fitting(budget, tuple(reversed(PATHS))),
            _(
                "the cheapest path was taken even though a simpler one fits: a graph needs a "
                "captured graph per token bucket and padded batches, the mapper its buffers; "
                "take the simplest path that fits the budget"
            ),
        ),
        (
            "graph" if first_fitting(budget) == NO_PATH else first_fitting(budget),
            _(
                "no path fits this budget, not even a graph replay: the answer is 'none' (the "
                "loop must run fewer steps a second or give the mapping a larger share)"
            ),
        ),
    ]


SERVING_PATH_HINT = N_(
    "The budget is share x 1e6 / steps_per_second µs a step. Try the paths from the simplest "
    "('jit', then 'mapper', then 'graph') and take the first whose host µs fits; 'none' if "
    "none does."
)


def judge_path(candidate: Callable[..., str], case: PathCase) -> None:
    host_us, rate, share = case.args()
    call = f"serving_path(host_us, {case.steps_per_second:g}, {case.share:g})"
    got = candidate(dict(host_us), rate, share)
    if got not in (*PATHS, NO_PATH):
        raise Wrong(
            _(
                "{call} returned {got!r}: the answer is one of 'jit', 'mapper', 'graph' or 'none'"
            ).format(call=call, got=got),
            _("a path's name"),
            repr(got),
            SERVING_PATH_HINT,
        )
    expected = choose_path(host_us, rate, share)
    if got == expected:
        return
    why = next(
        (text for answer, text in _path_mistakes(case) if answer != expected and answer == got),
        "",
    )
    budget = step_budget_us(rate, share)
    raise Wrong(
        _(
            "{call} should be {expected!r}, got {got!r} (a budget of {budget:.4g} µs a step)"
        ).format(call=call, expected=expected, got=got, budget=budget)
        + (_(": {why}").format(why=why) if why else ""),
        repr(expected),
        repr(got),
        SERVING_PATH_HINT,
    )


def _path_case(rate: float, share: float, host_us: dict[str, float] | None = None) -> PathCase:
    ladder = host_us or ladder_paths()
    return PathCase(tuple((path, ladder[path]) for path in PATHS), rate, share)


def _path_cases() -> list[tuple[str, PathCase]]:
    return [
        (N_("50 steps a second, 5% of each step"), _path_case(50, 0.05)),
        (N_("1,000 steps a second, 5% of each step"), _path_case(1000, 0.05)),
        (N_("4,000 steps a second, 5% of each step"), _path_case(4000, 0.05)),
        (N_("10,000 steps a second, 5% of each step"), _path_case(10000, 0.05)),
        (N_("20,000 steps a second, 5% of each step"), _path_case(20000, 0.05)),
        (N_("2,000 steps a second, 2% of each step"), _path_case(2000, 0.02)),
    ]


@st.composite
def _path_strategy(draw: st.DrawFn) -> PathCase:
    graph = draw(st.floats(0.5, 10.0))
    mapper = graph + draw(st.floats(0.5, 20.0))
    jit = mapper + draw(st.floats(0.5, 60.0))
    rate = draw(st.sampled_from([100.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 40000.0]))
    share = draw(st.sampled_from([0.01, 0.02, 0.05, 0.1, 0.25]))
    return _path_case(rate, share, {"jit": jit, "mapper": mapper, "graph": graph})


register(
    Exercise(
        id="08.serving_path",
        title=N_("choose a serving loop's launch path from the host ladder"),
        cases=_path_cases,
        strategy=lambda: _path_strategy(),
        judge=judge_path,
        hint=SERVING_PATH_HINT,
        max_examples=60,
    )
)
