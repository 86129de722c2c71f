"""``slotmap workshop preflight --learners N``: what an instructor runs on the hub's machine before
the room arrives. It passes when the learners' environment passes ``slotmap doctor`` (run as a
learner's server would run it), every learner can run its interpreter, the hub's own pieces
are installed, the machine has the memory for N learners, and a real test learner gets
through the hub end to end (``trial_learner``: log in, spawn, run lesson 01's first cell and
exercise 01's checks, seen on the dashboard, stopped, the account removed).

Memory follows one learner measured over the whole 3-hour track (``slotmap.workshop.limits``):
it says OK when every learner fits at the track's peak with idle kernels culled, TIGHT when
only the floor (the server and the first lessons' kernels) fits, and fails below the floor.
The cores get advice only (from an extrapolation). The learners' memory and CPU limits
(``slotmap.workshop.limits``) are reported, on or off and why; only a bad value of their
variables fails it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slotmap.workshop import limits
from slotmap.workshop.limits import LEARNER_FLOOR_GB, LEARNER_PEAK_GB

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
        return self.learners * LEARNER_FLOOR_GB

    @property
    def peak_gb(self) -> float:
        return self.learners * LEARNER_PEAK_GB

    @property
    def ok(self) -> bool:
        return self.available_gb >= self.floor_gb

    def line(self) -> str:
        head = (
            f"memory       {self.available_gb:.1f} GB available; {self.learners} learners need "
            f"{self.floor_gb:.1f} GB at first ({LEARNER_FLOOR_GB} GB a learner) and "
            f"{self.peak_gb:.1f} GB at the track's peak ({LEARNER_PEAK_GB} GB a learner, "
            "idle kernels culled; measured: benchmarks/results/workshop-track-memory.md)"
        )
        if self.available_gb >= self.peak_gb:
            return head + ": OK"
        if self.ok:
            fits = int(self.available_gb // LEARNER_PEAK_GB)
            return head + f": TIGHT, only {fits} fit at the peak"
        fits = int(self.available_gb // LEARNER_FLOOR_GB)
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
    from slotmap.workshop.proxy import proxy_executable

    missing = []
    for module in ("jupyterhub", "jupyterhub_idle_culler"):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"{module} (pip install -e '.[workshop]')")
    if proxy_executable() is None:
        missing.append("configurable-http-proxy (make hub)")
    if os.geteuid() != 0 and not os.environ.get("SLOTMAP_HUB_HOMES"):
        missing.append("root: the hub creates each learner's system user (run it as root)")
    return missing


def closed_to_others(executable: str | Path) -> str:
    """Why other users cannot run the interpreter ``executable`` (the first folder or file on
    the way to it, or to its standard library, without o+x: pyenv or conda under a 0700
    /root), or "" when every user can."""
    real = Path(os.path.realpath(executable))
    places = [real]
    if Path(executable) == Path(sys.executable):
        places.append(Path(sys.base_prefix).resolve())
    for place in places:
        for path in (place, *place.parents):
            mode = path.stat().st_mode
            if not mode & 0o001:
                return f"{real}: {path} (mode {mode & 0o777:o}) is closed to other users"
    return ""


def python_line() -> tuple[bool, str]:
    """Whether every learner can run this environment's Python, as a line."""
    closed = closed_to_others(sys.executable)
    if not closed:
        return True, f"python       OK: every user can run {os.path.realpath(sys.executable)}"
    return False, (
        f"python       FAIL: learners cannot run it ({closed}); rebuild the environment on "
        "a Python they can: rm -rf .venv && make hub PYTHON=/usr/bin/python3.11"
    )


def limits_line(environ: Mapping[str, str] = os.environ, systemd: Path = limits.SYSTEMD):
    """Whether the learners' limits are set right (on, or off for a reason), as a line."""
    try:
        return True, limits.read(environ, systemd).line()
    except ValueError as error:
        return False, f"limits       FAIL: {error}"


def trial_learner(timeout: float = 400) -> str:
    """A real test learner on a hub of its own (the workshop's config on loopback, free
    ports, a private temporary state, as root a real system user): log in, spawn, run lesson
    01's first code cell and exercise 01 with the solution's code, see its pass on the
    dashboard as an instructor, stop the server, remove the account. "" when all of it
    worked, else what failed."""
    import tempfile

    import requests

    from slotmap.lab import CHECKOUT
    from slotmap.workshop import drive

    name = "preflight" + os.urandom(2).hex()
    password, admin_password = os.urandom(8).hex(), os.urandom(24).hex()
    with tempfile.TemporaryDirectory(prefix="slotmap-preflight-") as base:
        hub = drive.LocalHub(base, password, admin_password)
        step = "start the hub"
        try:
            hub.start(CHECKOUT / "workshop" / "jupyterhub_config.py")
            step = f"log in as the test learner {name}"
            token = drive.api_token(hub.url, drive.login(hub.url, name, password), name)
            step = "start the test learner's server"
            drive.start_server(hub.url, token, name, timeout=timeout)
            server = f"{hub.url}/user/{name}"
            step = "run lesson 01's first code cell"
            lesson = "notebooks/01_paged_kv_cache.ipynb"
            kernel = drive.Kernel(server, token, lesson)
            try:
                first = drive.code_cells(drive.get_notebook(server, token, lesson))[0]
                if error := kernel.execute(first).error:
                    return f"{step}: {error}"
            finally:
                kernel.close()
            step = "run exercise 01's checks"
            checks, error = drive.run_exercise(server, token, drive.solved_cells(CHECKOUT))
            if error:
                return f"{step}: {error}"
            if not checks or not all(checks.values()):
                return f"{step}: {checks or 'no check ran'}"
            step = "see the pass on the dashboard"
            session = drive.login(hub.url, "instructor", admin_password)
            instructor = drive.api_token(hub.url, session, "instructor")
            table = requests.get(
                f"{hub.url}/services/workshop-dashboard/api/progress",
                headers={"Authorization": f"token {instructor}"},
                timeout=60,
            ).json()
            rows = {row["learner"]: row["cells"] for row in table["learners"]}
            seen = {e: c["state"] for e, c in rows.get(name, {}).items() if c["state"] != "none"}
            if seen != {exercise: "pass" for exercise in checks}:
                return f"{step}: the dashboard shows {seen or 'nothing'} for {name}"
            step = "stop the test learner's server"
            drive.hub_api(hub.url, token, "DELETE", f"/users/{name}/server")
            drive.wait_stopped(hub.url, token, name)
        except Exception as error:  # noqa: BLE001 - the pre-flight reports what failed
            return f"{step}: {error}\n{hub.log_tail(2000)}"
        finally:
            hub.stop()
            hub.remove_learners()
            left = hub.leftovers()
        if left:
            return f"processes left after the hub stopped: {left}"
        return ""


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
    python_ok, line = python_line()
    print(line)
    missing = hub_pieces()
    print("hub          " + ("; ".join(f"MISSING {m}" for m in missing) or "installed"))
    memory = Memory(learners, available_gb())
    print(memory.line())
    print(cpu_line(learners, os.cpu_count() or 1))
    limits_ok, line = limits_line()
    print(line)
    trial = "not run: fix the lines above first"
    if python_ok and not missing:
        print("test learner (log in, spawn, lesson 01, a check, the dashboard, remove) ...")
        trial = trial_learner()
    print(f"test learner {'PASS' if not trial else 'FAIL: ' + trial}")
    ok = doctor.returncode == 0 and python_ok and not missing and memory.ok and not trial
    ok = ok and limits_ok
    print(f"preflight: {'ready' if ok else 'NOT ready'}")
    return 0 if ok else 1
