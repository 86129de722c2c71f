"""How many learners one machine holds: N learners on a real workshop hub (a script, not a test).

    .venv/bin/python benchmarks/workshop_load.py               # N = 1, 2, 4, 8
    .venv/bin/python benchmarks/workshop_load.py --rounds 1 2  # a quick look

For each N, a fresh hub (workshop/jupyterhub_config.py on 127.0.0.1, homes in a temporary
folder) and N new learners who log in at the same moment. Each starts their server, runs
every cell of lesson 01, runs lesson 03 up to its window widget and moves its "first
position" slider ``--moves`` times, each move a comm update that the kernel answers by
re-running the kernel and redrawing the figure (slotmap.workshop.drive). Measured: spawn time
(login to a ready server), every cell's latency (request to the kernel idle again), every
redraw's latency (slider update to the kernel idle again: the figure is drawn and sent; the
browser's decoding is not included), and each learner's memory (PSS of their server and its
two kernels, with both kernels alive). N = 1 is the learner alone.

Writes benchmarks/results/workshop-load.md and workshop-load.png (latency against learners).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from slotmap.workshop import drive

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PASSWORD = "load-" + os.urandom(6).hex()
ADMIN_PASSWORD = "instructor-" + os.urandom(16).hex()
WIDGET_CELL = "window_viz.window_widget()"
SLIDER = "first position"


def pss_mib(pids: list[int]) -> float:
    """Proportional set size of these processes together, in MiB (shared pages split)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def learner(
    hub: drive.LocalHub,
    name: str,
    moves: int,
    start: threading.Barrier,
    measured: threading.Event,
    out: dict,
) -> None:
    """One learner's session; fills out[name] (or out[name]['error'])."""
    record: dict = {"cells": [], "redraws": []}
    out[name] = record
    kernels = []
    try:
        session = drive.login(hub.url, name, PASSWORD)
        token = drive.api_token(hub.url, session, name)
        start.wait()
        record["spawn"] = drive.start_server(hub.url, token, name, timeout=900)
        server = f"{hub.url}/user/{name}"
        lesson = "notebooks/01_paged_kv_cache.ipynb"
        kernel = drive.Kernel(server, token, lesson, timeout=300)
        kernels.append(kernel)
        for code in drive.code_cells(drive.get_notebook(server, token, lesson)):
            run = kernel.execute(code, timeout=600)
            if run.error:
                raise drive.HubError(f"lesson 01: {run.error}")
            record["cells"].append(run.seconds)
        lesson = "notebooks/03_window_gather.ipynb"
        kernel = drive.Kernel(server, token, lesson, timeout=300)
        kernels.append(kernel)
        for code in drive.code_cells(drive.get_notebook(server, token, lesson)):
            run = kernel.execute(code, timeout=600)
            if run.error:
                raise drive.HubError(f"lesson 03: {run.error}")
            record["cells"].append(run.seconds)
            if code.strip() == WIDGET_CELL:
                break
        slider = kernel.slider(SLIDER)
        for move in range(moves):
            run = kernel.set_widget(slider, value=1 + move % 20, timeout=600)
            if run.error:
                raise drive.HubError(f"widget: {run.error}")
            # A redraw is a new figure sent from the kernel (into the widget's Output).
            if not any("image/png" in output.get("data", {}) for output in run.outputs):
                raise drive.HubError(f"slider move {move}: no figure came back")
            record["redraws"].append(run.seconds)
    except BaseException as error:  # noqa: BLE001 - reported in the results
        record["error"] = f"{type(error).__name__}: {error}"
    finally:
        measured.wait(timeout=900)  # memory is read with every kernel alive
        for kernel in kernels:
            try:
                kernel.close()
            except Exception:  # noqa: BLE001 - the hub's stop cleans up
                pass


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def one_round(learners: int, moves: int, work: Path) -> dict:
    load_before = os.getloadavg()[0]  # the machine's load from others, just before
    hub = drive.LocalHub(work / f"hub-{learners}", PASSWORD, ADMIN_PASSWORD)
    hub.base.mkdir(parents=True)
    out: dict = {}
    try:
        hub.start(ROOT / "workshop" / "jupyterhub_config.py")
        start = threading.Barrier(learners)
        measured = threading.Event()
        names = [f"learner{learners}x{i}" for i in range(learners)]
        threads = [
            threading.Thread(target=learner, args=(hub, n, moves, start, measured, out))
            for n in names
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()

        # Memory once every learner has finished its widget moves (or failed).
        def busy(name: str) -> bool:
            record = out.get(name, {})
            return "error" not in record and len(record.get("redraws", [])) < moves

        while any(busy(n) for n in names) and time.monotonic() - started < 1800:
            time.sleep(1)
        memory = {n: pss_mib(hub.processes_of(n)) for n in names}
        measured.set()
        for thread in threads:
            thread.join(timeout=300)
        wall = time.monotonic() - started
    finally:
        hub.stop()
        hub.remove_learners()  # as root, the learners were system users the hub created
    cells = [s for n in names for s in out[n]["cells"]]
    redraws = [s for n in names for s in out[n]["redraws"]]
    spawns = [out[n]["spawn"] for n in names if "spawn" in out[n]]
    return {
        "learners": learners,
        "errors": {n: out[n]["error"] for n in names if "error" in out[n]},
        "cell_p50": percentile(cells, 0.5),
        "cell_p95": percentile(cells, 0.95),
        "cells": len(cells),
        "redraw_p50": percentile(redraws, 0.5),
        "redraw_p95": percentile(redraws, 0.95),
        "redraws": len(redraws),
        "spawn_median": statistics.median(spawns) if spawns else float("nan"),
        "spawn_max": max(spawns, default=float("nan")),
        "memory_mib_per_learner": statistics.mean(memory.values()),
        "memory_mib_max": max(memory.values()),
        "wall_seconds": wall,
        "load_average_before": load_before,
        "leftovers": hub.leftovers(),
    }


def plot(rows: list[dict], path: Path) -> None:
    """Widget redraws and cells, p50 and p95, against the number of learners."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [row["learners"] for row in rows]
    figure, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for axis, kind, title in (
        (axes[0], "redraw", "widget redraw (lesson 03's slider)"),
        (axes[1], "cell", "notebook cell (lessons 01 and 03)"),
    ):
        axis.plot(n, [row[f"{kind}_p95"] for row in rows], "o-", label="p95")
        axis.plot(n, [row[f"{kind}_p50"] for row in rows], "s--", label="p50")
        axis.axhline(1.0, color="grey", linewidth=0.8, linestyle=":", label="1 s")
        axis.set_xscale("log", base=2)
        axis.set_xticks(n, [str(v) for v in n])
        axis.set_xlabel("learners, all busy at once (2 CPU cores)")
        axis.set_ylabel("seconds")
        axis.set_ylim(bottom=0)
        axis.set_title(title)
        axis.legend()
        axis.grid(alpha=0.3)
    figure.suptitle("Workshop load: latency against learners on one hub")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--moves", type=int, default=15, help="slider moves per learner")
    parser.add_argument("--out", default=str(RESULTS), help="folder for the .md and .png")
    parser.add_argument("--note", default="", help="a line for the report (e.g. shared CPU)")
    args = parser.parse_args()
    os.environ.setdefault("SLOTMAP_BACKEND", "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count()
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    machine = f"{cores} CPU cores, {memory_gib:.0f} GiB, {platform.platform()}, "
    machine += f"Python {sys.version.split()[0]}"
    rows = []
    with tempfile.TemporaryDirectory(prefix="workshop-load-") as work:
        for learners in args.rounds:
            print(f"{learners} learner(s) ...", flush=True)
            row = one_round(learners, args.moves, Path(work))
            print(json.dumps(row), flush=True)
            rows.append(row)
            # Written after every round: a later round that runs long loses nothing.
            plot(rows, out / "workshop-load.png")
            (out / "workshop-load.md").write_text(report(rows, args, machine))
    print(f"wrote {out / 'workshop-load.md'} and {out / 'workshop-load.png'}")
    return 0


def report(rows: list[dict], args: argparse.Namespace, machine: str) -> str:
    """The measurements as markdown (the capacity extrapolation is written by hand below)."""
    lines = [
        "# Workshop load: learners on one machine",
        "",
        f"Measured by `benchmarks/workshop_load.py --rounds {' '.join(map(str, args.rounds))} "
        f"--moves {args.moves}` on {machine}, CPU backend (Triton's interpreter).",
    ]
    if args.note:
        lines += ["", args.note]
    lines += [
        "",
        "| learners | spawn median / max (s) | cell p50 / p95 (s) | redraw p50 / p95 (s) "
        "| memory per learner (MiB PSS) | cells, redraws | errors | load before |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row['learners']} | {row['spawn_median']:.1f} / {row['spawn_max']:.1f} "
            f"| {row['cell_p50']:.2f} / {row['cell_p95']:.2f} "
            f"| {row['redraw_p50']:.2f} / {row['redraw_p95']:.2f} "
            f"| {row['memory_mib_per_learner']:.0f} (max {row['memory_mib_max']:.0f}) "
            f"| {row['cells']}, {row['redraws']} | {len(row['errors']) or 'none'} "
            f"| {row['load_average_before']:.1f} |"
        )
    lines += ["", "![latency against learners](workshop-load.png)", "", "Raw rows:", "", "```"]
    lines += [json.dumps(row) for row in rows]
    lines += ["```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
