"""The learners' resource limits on the one-machine hub, set the way the Littlest JupyterHub
sets them: each learner's server is a transient systemd unit ``jupyter-<name>``
(jupyterhub-systemdspawner) with ``MemoryMax`` and ``CPUQuota``. It needs systemd as the
machine's init; without it (a container, WSL, a test machine), with ``$SLOTMAP_HUB_HOMES`` or
with ``$SLOTMAP_HUB_SPAWNER=local``, the servers stay plain processes (LocalProcessSpawner)
and nothing limits them: the hub's log and ``slotmap workshop preflight`` say so and why.

- ``$SLOTMAP_HUB_MEM_LIMIT``: a learner's ``MemoryMax``, a size with systemd's suffixes K, M,
  G, T (powers of 1024). The default, ``DEFAULT_MEMORY``, is a learner's measured peak when
  no idle kernel is ever shut down, rounded up: a learner who keeps every kernel busy fits.
- ``$SLOTMAP_HUB_CPU_LIMIT``: a learner's cores (``CPUQuota`` = cores x 100 %), 2 by default.

The measured size of a learner (benchmarks/results/workshop-track-memory*.md: one learner
over the whole 3-hour track on a real hub, ``benchmarks/workshop_track_memory.py``):
``LEARNER_FLOOR_GB`` after lessons 00 and 01 (the server and two kernels),
``LEARNER_PEAK_GB`` at the track's peak with the hub's idle kernels culled, and
``LEARNER_UNCULLED_GB`` at its peak with none culled. A test holds each to its file.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from slotmap.i18n import _

# GB (10**9 bytes), each a measurement rounded up to 0.1 GB.
LEARNER_FLOOR_GB = 0.6
LEARNER_PEAK_GB = 1.2
LEARNER_UNCULLED_GB = 2.4
# The limit should stop a runaway, not a learner whose kernels are never idle long enough.
DEFAULT_MEMORY = f"{math.ceil(LEARNER_UNCULLED_GB)}G"
DEFAULT_CPU = 2.0
# sd_booted(3): this folder exists only when systemd is the running init.
SYSTEMD = Path("/run/systemd/system")
UNIT = "jupyter-{USERNAME}"  # TLJH's name: `systemctl status jupyter-<name>`
MEMORY_VARIABLE = "SLOTMAP_HUB_MEM_LIMIT"
CPU_VARIABLE = "SLOTMAP_HUB_CPU_LIMIT"
SPAWNER_VARIABLE = "SLOTMAP_HUB_SPAWNER"
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGT])")
_POWERS = {"K": 1, "M": 2, "G": 3, "T": 4}


@dataclass(frozen=True)
class Limits:
    """What each learner's server may use, or why nothing limits it (``off``)."""

    memory: str  # systemd's MemoryMax, "3G"
    cpu: float  # cores
    off: str = ""  # why the limits are not enforced; "" when systemd enforces them

    @property
    def memory_bytes(self) -> int:
        number, suffix = _SIZE.fullmatch(self.memory).groups()
        return int(float(number) * 1024 ** _POWERS[suffix])

    @property
    def cpu_quota(self) -> str:
        return f"{int(self.cpu * 100)}%"

    def line(self) -> str:
        """The pre-flight's line."""
        if self.off:
            return _(
                "limits       OFF: {why}; learners share the machine's memory and cores"
            ).format(why=self.off)
        return _(
            "limits       OK: each learner's server is the systemd unit jupyter-<name> with "
            "MemoryMax={memory} and CPUQuota={cpu}"
        ).format(memory=self.memory, cpu=self.cpu_quota)


def _memory(text: str) -> str:
    match = _SIZE.fullmatch(text.strip().upper())
    if not match:
        raise ValueError(
            _("{setting}: not a size like 3G or 2500M").format(
                setting=f"{MEMORY_VARIABLE}={text!r}"
            )
        )
    memory = match.group(1) + match.group(2)
    if Limits(memory, DEFAULT_CPU).memory_bytes < LEARNER_FLOOR_GB * 1e9:
        raise ValueError(
            _(
                "{setting}: below {floor} GB, what a learner's server and their first "
                "lessons' kernels take"
            ).format(setting=f"{MEMORY_VARIABLE}={text!r}", floor=f"{LEARNER_FLOOR_GB:.1f}")
        )
    return memory


def _cpu(text: str) -> float:
    try:
        cores = float(text)
    except ValueError:
        cores = math.nan
    if not math.isfinite(cores) or cores < 0.01:
        raise ValueError(
            _("{setting}: not a number of cores like 2 or 0.5").format(
                setting=f"{CPU_VARIABLE}={text!r}"
            )
        )
    return cores


def read(environ: Mapping[str, str], systemd: Path = SYSTEMD) -> Limits:
    """The limits the environment asks for on this machine (``systemd``: the folder that
    exists when systemd is the init); ``ValueError`` with a one-line reason for a bad value."""
    memory = _memory(environ.get(MEMORY_VARIABLE) or DEFAULT_MEMORY)
    cpu = _cpu(environ.get(CPU_VARIABLE) or str(DEFAULT_CPU))
    spawner = environ.get(SPAWNER_VARIABLE, "")
    if spawner not in ("", "local", "systemd"):
        raise ValueError(
            _("{setting}: not systemd, local or unset").format(
                setting=f"{SPAWNER_VARIABLE}={spawner!r}"
            )
        )
    off = ""
    if spawner == "local":
        off = f"{SPAWNER_VARIABLE}=local"
    elif environ.get("SLOTMAP_HUB_HOMES"):
        off = _("$SLOTMAP_HUB_HOMES runs every learner as the hub's own user")
    elif not systemd.is_dir():
        off = _("systemd is not this machine's init ({path} is missing)").format(path=systemd)
    elif find_spec("systemdspawner") is None:
        raise ValueError(
            _(
                "systemd is this machine's init but jupyterhub-systemdspawner is not installed: "
                "pip install -e '.[workshop]', or {setting} to run without limits"
            ).format(setting=f"{SPAWNER_VARIABLE}=local")
        )
    if off and spawner == "systemd":
        raise ValueError(
            _("{setting}, but {why}").format(setting=f"{SPAWNER_VARIABLE}=systemd", why=off)
        )
    return Limits(memory, cpu, off)


def configure(c: Any, environ: Mapping[str, str], systemd: Path = SYSTEMD) -> Limits:
    """Put the learners' servers under systemd with their limits, keeping what ``c.Spawner``
    already says (the command, its environment, the pre-spawn hook that makes the learner's
    account); or leave the spawner as it is and log why nothing is limited."""
    limits = read(environ, systemd)
    log = logging.getLogger("JupyterHub")
    if limits.off:
        log.warning(_("Per-learner memory and CPU limits are OFF: {why}").format(why=limits.off))
        return limits
    c.JupyterHub.spawner_class = "systemd"
    # Set on the systemd spawner only: a local one would advertise limits it does not hold.
    c.SystemdSpawner.mem_limit = limits.memory
    c.SystemdSpawner.cpu_limit = limits.cpu
    c.SystemdSpawner.unit_name_template = UNIT
    c.SystemdSpawner.username_template = "{USERNAME}"  # the learner's own system user
    c.SystemdSpawner.dynamic_users = False
    c.SystemdSpawner.isolate_tmp = True  # no learner reads another's /tmp
    c.SystemdSpawner.disable_user_sudo = True  # NoNewPrivileges: no sudo, no setuid
    c.SystemdSpawner.default_shell = "/bin/bash"  # the shell the learner's account has
    log.info(
        _(
            "Per-learner limits: systemd units {unit} with MemoryMax={memory}, CPUQuota={cpu}"
        ).format(unit=UNIT, memory=limits.memory, cpu=limits.cpu_quota)
    )
    return limits
