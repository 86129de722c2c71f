"""``slotmap workshop preflight --learners N``: what an instructor runs on the hub's machine before
the room arrives. It passes when the learners' environment passes ``slotmap doctor`` (run as a
learner's server would run it), the hub's own pieces are installed, and the machine has the
memory for N learners.

Memory: every Python process of the course takes about 0.4 GB. A learner holds their server
and a lesson's kernel (2 processes); lessons 05 and 07 also start up to 3 ranks from the
kernel (5 processes). It says OK when everyone fits at that peak, TIGHT when only the
2-process floor fits, and fails only below the floor. The cores get advice only (from an
extrapolation).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

GB_PER_PROCESS = 0.4
PROCESSES_FLOOR = 2  # the learner's server and one kernel
PROCESSES_PEAK = 5  # ... and lesson 05's or 07's three ranks
# The load measurement's extrapolation (benchmarks/results/workshop-load.md): widget redraws
# under 1 s at p95 with 2 busy learners a core, 8 learners a core when 1 in 4 is busy.
LEARNERS_PER_CORE = 8


def cpu_line(learners: int, cores: int) -> str:
    """Advice on the cores (an extrapolation, so it never fails the pre-flight)."""
    fits = LEARNERS_PER_CORE * cores
    verdict = "OK" if learners <= fits else "SLOW: expect widget redraws over 1 s at p95"
    return (
        f"cpu          {cores} cores hold about {fits} learners with widget redraws under 1 s "
        f"(an extrapolation: benchmarks/results/workshop-load.md): {verdict}"
    )


@dataclass
class Memory:
    """The memory verdict for ``learners`` on a machine with ``available_gb`` free."""

    learners: int
    available_gb: float

    @property
    def floor_gb(self) -> float:
        return self.learners * PROCESSES_FLOOR * GB_PER_PROCESS

    @property
    def peak_gb(self) -> float:
        return self.learners * PROCESSES_PEAK * GB_PER_PROCESS

    @property
    def ok(self) -> bool:
        return self.available_gb >= self.floor_gb

    def line(self) -> str:
        head = (
            f"memory       {self.available_gb:.1f} GB available; {self.learners} learners need "
            f"{self.floor_gb:.1f} GB (server + kernel, {GB_PER_PROCESS} GB a process) and "
            f"{self.peak_gb:.1f} GB when all run lesson 05 or 07 (+3 ranks each)"
        )
        if self.available_gb >= self.peak_gb:
            return head + ": OK"
        if self.ok:
            fits = int(self.available_gb // (PROCESSES_PEAK * GB_PER_PROCESS))
            return head + f": TIGHT, only {fits} can run lessons 05 and 07 at once"
        fits = int(self.available_gb // (PROCESSES_FLOOR * GB_PER_PROCESS))
        return head + f": NOT ENOUGH, room for {fits} learners"


def available_gb() -> float:
    """MemAvailable from /proc/meminfo, in GB (10**9 bytes)."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / 1e9
    raise OSError("no MemAvailable in /proc/meminfo")


def hub_pieces() -> list[str]:
    """What the hub needs that is missing (empty when nothing is)."""
    from slotmap.workshop.drive import proxy_command

    missing = []
    for module in ("jupyterhub", "jupyterhub_idle_culler"):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"{module} (pip install -e '.[workshop]')")
    if proxy_command() is None:
        missing.append("configurable-http-proxy (make hub)")
    if os.geteuid() != 0 and not os.environ.get("SLOTMAP_HUB_HOMES"):
        missing.append("root: the hub creates each learner's system user (run it as root)")
    return missing


def preflight(learners: int) -> int:
    """Print the checks; 0 when all pass."""
    print(f"learners     {learners}")
    doctor = subprocess.run(
        [sys.executable, "-m", "slotmap", "doctor"], capture_output=True, text=True, timeout=600
    )
    last = (doctor.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"doctor       {'PASS' if doctor.returncode == 0 else 'FAIL'}: {last}")
    if doctor.returncode:
        print(doctor.stdout[-3000:] + doctor.stderr[-2000:])
    missing = hub_pieces()
    print("hub          " + ("; ".join(f"MISSING {m}" for m in missing) or "installed"))
    memory = Memory(learners, available_gb())
    print(memory.line())
    print(cpu_line(learners, os.cpu_count() or 1))
    ok = doctor.returncode == 0 and not missing and memory.ok
    print(f"preflight: {'ready' if ok else 'NOT ready'}")
    return 0 if ok else 1
