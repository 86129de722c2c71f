"""How long each lesson (and the capstone's solution) takes to run top to bottom on the CPU.

Each notebook runs on a fresh kernel with ``SLOTMAP_BACKEND=cpu`` and without
``TRITON_INTERPRET``, as a learner's does; the wall time includes the kernel's start. The
faster of ``--runs`` runs is what a header states ("runs top to bottom in about N s"), and a
test holds every header, English and Chinese, to the file this writes.

    python benchmarks/lesson_times.py [--runs 2] [--out benchmarks/results/lesson-times.json]

Run it on an otherwise idle machine: a busy one measures the other work too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "lesson-times.json"


def notebooks() -> list[Path]:
    """The English lessons, then the capstone's solution (the capstone has no lesson)."""
    return [
        *sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")),
        ROOT / "solutions" / "09_capstone.ipynb",
    ]


def machine() -> str:
    from fresh_vm_walkthrough import machine as described  # a script beside this one

    found = described()
    return f"{found['cores']} cores, {found['cpu']}"


def versions() -> dict[str, str | None]:
    from slotmap.cli import versions as installed

    found = installed()
    return {name: found[name] for name in ("python", "torch", "triton")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    os.environ["SLOTMAP_BACKEND"] = "cpu"
    from slotmap.exercises.grade import check_records, execute_notebook, skipped_checks

    # Importing slotmap set it for this process; a learner's kernel starts without it.
    os.environ.pop("TRITON_INTERPRET", None)
    timings = {}
    for path in notebooks():
        runs = []
        for _ in range(args.runs):
            start = time.perf_counter()
            notebook = execute_notebook(path, timeout=120)
            runs.append(round(time.perf_counter() - start, 1))
            failed = [
                name
                for name, passed in check_records(notebook).items()
                if not passed and name not in skipped_checks(notebook)
            ]
            if failed:
                raise SystemExit(f"{path.name}: checks failed: {failed}")
        timings[path.stem] = {"runs_s": runs, "seconds": round(min(runs))}
        print(
            f"{path.stem:28} {min(runs):6.1f} s  (runs: {', '.join(map(str, runs))})", flush=True
        )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    record = {
        "what": "wall seconds to run each notebook top to bottom on a fresh CPU kernel, "
        "kernel start included; 'seconds' is the faster run, rounded",
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "machine": machine(),
        "versions": versions(),
        "notebooks": timings,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
