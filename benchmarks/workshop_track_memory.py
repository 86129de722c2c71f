"""One learner's memory over a whole track on a real workshop hub (a script, not a test).

    .venv/bin/python benchmarks/workshop_track_memory.py                 # the 3-hour track
    .venv/bin/python benchmarks/workshop_track_memory.py --no-culling    # kernels never shut

One learner logs in to a fresh hub (workshop/jupyterhub_config.py on 127.0.0.1) and works
through the track in order, as a browser leaves things: every lesson the track teaches, each
in a kernel of its own left open, and right after each lesson taught in depth their own copy
of its exercises, filled in with the solution's code and run (a kernel left open too). The
track's clock (slotmap.workshop.track: login, each lesson's minutes in the room, then breaks
and questions) runs compressed, ``--minute-seconds`` seconds a room minute, and the hub's
idle-kernel culling ($SLOTMAP_HUB_KERNEL_IDLE, 30 room minutes by default) is compressed the
same way; the Jupyter server checks for idle kernels every 60 s of real time (the config's
``cull_interval``), so a kernel is shut 30 room minutes after its last cell or up to
``60 / minute-seconds`` room minutes later. Measured every 2 s: the PSS of the learner's
server and kernels, and how many kernels are alive.

Writes benchmarks/results/workshop-track-memory[-no-culling].md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

from workshop_load import ADMIN_PASSWORD, PASSWORD, pss_mib

from slotmap.workshop import drive, track

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LEARNER = "tracker"


def steps(chosen: track.Track) -> list[tuple[str, str, float]]:
    """(what, notebook, room minutes) in the track's order: each lesson taught, and after a
    lesson taught in depth its exercises (the learner's copy in my_work/)."""
    course = {item.number: item for item in track.lessons(ROOT / "notebooks")}
    found = []
    for number, how in chosen.taught.items():
        item = course[number]
        name = next((ROOT / "notebooks").glob(f"{number}_*.ipynb")).name
        if how == "depth":
            lesson_minutes = item.reading_minutes + item.run_seconds / 60
            found.append((f"lesson {number}", f"notebooks/{name}", lesson_minutes))
            found.append((f"exercise {number}", f"my_work/{name}", item.exercise_minutes))
        else:
            found.append(
                (f"lesson {number}", f"notebooks/{name}", track.minutes_in_room(item, how))
            )
    return found


def kernels_alive(server: str, token: str) -> int:
    import requests

    answer = requests.get(
        f"{server}/api/kernels", headers={"Authorization": f"token {token}"}, timeout=30
    )
    return len(answer.json()) if answer.ok else -1


def run_step(server: str, token: str, notebook: str) -> tuple[drive.Kernel, int, str]:
    """Open ``notebook`` in a kernel and run its code cells (an exercise filled in with its
    solution's code); the kernel is left open. Returns it, the cells run and the first error."""
    content = drive.get_notebook(server, token, notebook)
    if notebook.startswith("my_work/"):
        for index, answer in drive.solved_cells(ROOT, Path(notebook).name).items():
            content["cells"][index]["source"] = answer
    kernel = drive.Kernel(server, token, notebook, timeout=300)
    cells = drive.code_cells(content)
    for done, code in enumerate(cells):
        run = kernel.execute(code, timeout=900)
        if run.error:
            return kernel, done, run.error
    return kernel, len(cells), ""


def measure(chosen: track.Track, minute_seconds: float, culling: bool, work: Path) -> dict:
    idle_room_minutes = 30
    os.environ["SLOTMAP_HUB_KERNEL_IDLE"] = str(
        round(idle_room_minutes * minute_seconds) if culling else 10**7
    )
    hub = drive.LocalHub(work / "hub", PASSWORD, ADMIN_PASSWORD)
    hub.base.mkdir(parents=True)
    samples: list[tuple[float, float, int]] = []  # (room minute, MiB, kernels)
    rows: list[dict] = []
    kernels: list[drive.Kernel] = []
    stop = threading.Event()
    try:
        hub.start(ROOT / "workshop" / "jupyterhub_config.py")
        token = drive.api_token(hub.url, drive.login(hub.url, LEARNER, PASSWORD), LEARNER)
        began = time.monotonic()
        drive.start_server(hub.url, token, LEARNER, timeout=600)
        server = f"{hub.url}/user/{LEARNER}"

        def room_minute() -> float:
            return (time.monotonic() - began) / minute_seconds

        def sample() -> None:
            while not stop.wait(2):
                samples.append(
                    (
                        room_minute(),
                        pss_mib(hub.processes_of(LEARNER)),
                        kernels_alive(server, token),
                    )
                )

        sampler = threading.Thread(target=sample)
        sampler.start()
        clock = float(track.LOGIN_MINUTES)
        for what, notebook, minutes in steps(chosen):
            time.sleep(max(0.0, clock * minute_seconds - (time.monotonic() - began)))
            started = room_minute()
            kernel, cells, error = run_step(server, token, notebook)
            kernels.append(kernel)
            rows.append(
                {
                    "step": what,
                    "notebook": notebook,
                    "room_minute_start": round(started, 1),
                    "room_minute_end": round(room_minute(), 1),
                    "cells": cells,
                    "error": error,
                    "mib_after": round(pss_mib(hub.processes_of(LEARNER))),
                    "kernels_after": kernels_alive(server, token),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            clock += minutes
        clock += chosen.breaks_minutes + chosen.questions_minutes  # the end of the slot
        time.sleep(max(0.0, clock * minute_seconds - (time.monotonic() - began)))
        stop.set()
        sampler.join()
        final = {
            "mib": round(pss_mib(hub.processes_of(LEARNER))),
            "kernels": kernels_alive(server, token),
        }
    finally:
        stop.set()
        for kernel in kernels:
            try:
                kernel.socket.close()
            except Exception:  # noqa: BLE001 - the hub's stop cleans up
                pass
        hub.stop()
        hub.remove_learners()
    peak = max(samples, key=lambda s: s[1], default=(0.0, 0.0, 0))
    return {
        "track": chosen.name,
        "culling": culling,
        "kernel_idle_seconds": int(os.environ["SLOTMAP_HUB_KERNEL_IDLE"]),
        "minute_seconds": minute_seconds,
        "steps": rows,
        "peak_mib": round(peak[1]),
        "peak_room_minute": round(peak[0], 1),
        "peak_kernels": max((s[2] for s in samples), default=0),
        "final": final,
        "samples": [(round(m, 1), round(mib), k) for m, mib, k in samples],
        "leftovers": hub.leftovers(),
    }


def report(result: dict, machine: str, command: str) -> str:
    culling = (
        f"idle kernels shut after 30 room minutes, {result['kernel_idle_seconds']} s real"
        if result["culling"]
        else "idle-kernel culling off"
    )
    lines = [
        f"# One learner's memory over the {result['track']} track: {culling}",
        "",
        f"Measured by `{command}` on {machine}, CPU backend (Triton's interpreter); one room "
        f"minute is {result['minute_seconds']} s of real time (benchmarks/"
        "workshop_track_memory.py says how the track is compressed).",
        "",
        "| step | notebook | room minutes | cells | memory after (MiB PSS) | kernels alive "
        "| error |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["steps"]:
        lines.append(
            f"| {row['step']} | {row['notebook']} | {row['room_minute_start']} to "
            f"{row['room_minute_end']} | {row['cells']} | {row['mib_after']} "
            f"| {row['kernels_after']} | {row['error'] or 'none'} |"
        )
    lines += [
        "",
        f"Peak: {result['peak_mib']} MiB at room minute {result['peak_room_minute']} "
        f"(at most {result['peak_kernels']} kernels alive). At the end of the slot: "
        f"{result['final']['mib']} MiB, {result['final']['kernels']} kernel(s) alive.",
        "",
        "Samples (room minute, MiB PSS, kernels alive):",
        "",
        "```",
        json.dumps(result["samples"]),
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--track", default="3h")
    parser.add_argument("--minute-seconds", type=float, default=4.0)
    parser.add_argument("--no-culling", action="store_true")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    os.environ.setdefault("SLOTMAP_BACKEND", "cpu")
    cores = os.cpu_count()
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    machine = f"{cores} CPU cores, {memory_gib:.0f} GiB, {platform.platform()}, "
    machine += f"Python {sys.version.split()[0]}"
    with tempfile.TemporaryDirectory(prefix="workshop-track-") as work:
        result = measure(
            track.track(args.track), args.minute_seconds, not args.no_culling, Path(work)
        )
    command = "python benchmarks/workshop_track_memory.py " + " ".join(sys.argv[1:])
    name = "workshop-track-memory" + ("-no-culling" if args.no_culling else "") + ".md"
    Path(args.out, name).write_text(report(result, machine, command.strip()))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
