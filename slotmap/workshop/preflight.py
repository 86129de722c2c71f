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

from slotmap.i18n import _
from slotmap.workshop import limits
from slotmap.workshop.limits import LEARNER_FLOOR_GB, LEARNER_PEAK_GB

# The load measurement's extrapolation (benchmarks/results/workshop-load.md): widget redraws
# under 1 s at p95 with 2 busy learners a core, 8 learners a core when 1 in 4 is busy.
LEARNERS_PER_CORE = 8


def cpu_line(learners: int, cores: int) -> str:
    """Advice on the cores (an extrapolation, so it never fails the pre-flight)."""
    fits = LEARNERS_PER_CORE * cores
    verdict = _("OK") if learners <= fits else _("SLOW: expect widget redraws over 1 s at p95")
    return _(
        "cpu          {cores} cores hold about {fits} learners with widget redraws under 1 s "
        "(an extrapolation: benchmarks/results/workshop-load.md): {verdict}"
    ).format(cores=cores, fits=fits, verdict=verdict)


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
        head = _(
            "memory       {available} GB available; {learners} learners need "
            "{floor} GB at first ({floor_each} GB a learner) and "
            "{peak} GB at the track's peak ({peak_each} GB a learner, "
            "idle kernels culled; measured: benchmarks/results/workshop-track-memory.md)"
        ).format(
            available=f"{self.available_gb:.1f}",
            learners=self.learners,
            floor=f"{self.floor_gb:.1f}",
            floor_each=LEARNER_FLOOR_GB,
            peak=f"{self.peak_gb:.1f}",
            peak_each=LEARNER_PEAK_GB,
        )
        if self.available_gb >= self.peak_gb:
            return head + _(": OK")
        if self.ok:
            fits = int(self.available_gb // LEARNER_PEAK_GB)
            return head + _(": TIGHT, only {fits} fit at the peak").format(fits=fits)
        fits = int(self.available_gb // LEARNER_FLOOR_GB)
        return head + _(": NOT ENOUGH, room for {fits} learners").format(fits=fits)


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
        missing.append(_("root: the hub creates each learner's system user (run it as root)"))
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
                return _("{real}: {path} (mode {mode}) is closed to other users").format(
                    real=real, path=path, mode=f"{mode & 0o777:o}"
                )
    return ""


def python_line() -> tuple[bool, str]:
    """Whether every learner can run this environment's Python, as a line."""
    closed = closed_to_others(sys.executable)
    if not closed:
        return True, _("python       OK: every user can run {python}").format(
            python=os.path.realpath(sys.executable)
        )
    return False, _(
        "python       FAIL: learners cannot run it ({why}); rebuild the environment on "
        "a Python they can: rm -rf .venv && make hub PYTHON=/usr/bin/python3.11"
    ).format(why=closed)


def limits_line(environ: Mapping[str, str] = os.environ, systemd: Path = limits.SYSTEMD):
    """Whether the learners' limits are set right (on, or off for a reason), as a line."""
    try:
        return True, limits.read(environ, systemd).line()
    except ValueError as error:
        return False, _("limits       FAIL: {error}").format(error=error)


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
        step = _("start the hub")
        try:
            hub.start(CHECKOUT / "workshop" / "jupyterhub_config.py")
            step = _("log in as the test learner {name}").format(name=name)
            token = drive.api_token(hub.url, drive.login(hub.url, name, password), name)
            step = _("start the test learner's server")
            drive.start_server(hub.url, token, name, timeout=timeout)
            server = f"{hub.url}/user/{name}"
            step = _("run lesson 01's first code cell")
            lesson = "notebooks/01_paged_kv_cache.ipynb"
            kernel = drive.Kernel(server, token, lesson)
            try:
                first = drive.code_cells(drive.get_notebook(server, token, lesson))[0]
                if error := kernel.execute(first).error:
                    return f"{step}: {error}"
            finally:
                kernel.close()
            step = _("run exercise 01's checks")
            checks, error = drive.run_exercise(server, token, drive.solved_cells(CHECKOUT))
            if error:
                return f"{step}: {error}"
            if not checks or not all(checks.values()):
                return _("{step}: {checks}").format(step=step, checks=checks or _("no check ran"))
            step = _("see the pass on the dashboard")
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
                return _("{step}: the dashboard shows {seen} for {name}").format(
                    step=step, seen=seen or _("nothing"), name=name
                )
            step = _("stop the test learner's server")
            drive.hub_api(hub.url, token, "DELETE", f"/users/{name}/server")
            drive.wait_stopped(hub.url, token, name)
        except Exception as error:  # noqa: BLE001 - the pre-flight reports what failed
            return f"{step}: {error}\n{hub.log_tail(2000)}"
        finally:
            hub.stop()
            hub.remove_learners()
            left = hub.leftovers()
        if left:
            return _("processes left after the hub stopped: {left}").format(left=left)
        return ""


def preflight(learners: int) -> int:
    """Print the checks; 0 when all pass."""
    print(_("learners     {learners}").format(learners=learners))
    doctor = subprocess.run(
        [sys.executable, "-m", "slotmap", "doctor"], capture_output=True, text=True, timeout=600
    )
    last = (doctor.stdout.strip().splitlines() or [_("(no output)")])[-1]
    verdict = _("PASS") if doctor.returncode == 0 else _("FAIL")
    print(_("doctor       {verdict}: {last}").format(verdict=verdict, last=last))
    if doctor.returncode:
        print(doctor.stdout[-3000:] + doctor.stderr[-2000:])
    python_ok, line = python_line()
    print(line)
    missing = hub_pieces()
    pieces = _("; ").join(_("MISSING {piece}").format(piece=m) for m in missing)
    print(_("hub          {pieces}").format(pieces=pieces or _("installed")))
    memory = Memory(learners, available_gb())
    print(memory.line())
    print(cpu_line(learners, os.cpu_count() or 1))
    limits_ok, line = limits_line()
    print(line)
    trial = _("not run: fix the lines above first")
    if python_ok and not missing:
        print(_("test learner (log in, spawn, lesson 01, a check, the dashboard, remove) ..."))
        trial = trial_learner()
    verdict = _("FAIL: {why}").format(why=trial) if trial else _("PASS")
    print(_("test learner {verdict}").format(verdict=verdict))
    ok = doctor.returncode == 0 and python_ok and not missing and memory.ok and not trial
    ok = ok and limits_ok
    print(_("preflight: ready") if ok else _("preflight: NOT ready"))
    return 0 if ok else 1
