"""Where a submission runs while ``slotmap grade`` grades it, and how nothing of it survives.

* The checking code the kernel imports is a private snapshot of the ``slotmap`` package, made
  read-only (``snapshot_package``), first on the kernel's ``PYTHONPATH``.
* Run as root (CI), each kernel runs as a user id of its own that owns nothing but the
  notebook's private folder (``kernel_argv``): file modes hold for it, it cannot signal the
  grader, and its processes are found and killed by that id (``kill_uid``), daemons included.
  Where the interpreter sits in a folder that user cannot enter (a ``/root/.pyenv`` Python),
  the kernel keeps one capability, reading files (``CAP_DAC_READ_SEARCH``): it can read what
  root can, and still write only its own folder.
* Otherwise the kernel runs as the grader's user: the snapshot is read-only only by its mode
  (which that user may change back), and what is left of a notebook is found by parentage
  (the worker is a child subreaper, ``set_subreaper``, so a daemon that leaves its session is
  still its descendant: ``kill_descendants``) and, should the worker die first, by a marker in
  the environment (``kill_marked``).

Linux only for the parts that read ``/proc``; elsewhere they do nothing.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
# Above any real account: a kernel's user id is its own, so "its processes" is exact.
UID_BASE = 1_000_000_000


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_subreaper(on: bool = True) -> bool:
    """Make orphaned descendants of this process its children (Linux); True if it worked."""
    return _prctl(PR_SET_CHILD_SUBREAPER, int(on))


def undumpable() -> bool:
    """No process of this user may trace this one or read its memory (``/proc/PID/mem``)."""
    return _prctl(PR_SET_DUMPABLE, 0)


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when ``parent`` (its parent) dies, ``kill -9`` included; exit now
    if it is already gone."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


# Data beside the package that checks read (lesson 08 grades against the committed timings).
SNAPSHOT_DATA = ("benchmarks/results",)


def snapshot_package(package: Path, into: Path, data: tuple[str, ...] = SNAPSHOT_DATA) -> Path:
    """Copy the ``slotmap`` package into ``into/slotmap`` and the ``data`` folders beside it
    (relative to the package's parent, where present), read-only; returns ``into`` (the folder
    to put on ``PYTHONPATH``)."""
    shutil.copytree(package, into / "slotmap")
    for folder in data:
        if (package.parent / folder).is_dir():
            shutil.copytree(package.parent / folder, into / folder)
    for folder, _, files in os.walk(into):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
    for folder, _, _ in os.walk(into, topdown=False):
        os.chmod(folder, 0o555)
    os.chmod(into, 0o755)
    return into


def remove_tree(path: Path) -> None:
    """Delete a folder the grader made, read-only parts included."""
    if not path.exists():
        return
    for folder, _, _ in os.walk(path):
        os.chmod(folder, 0o755)
    shutil.rmtree(path, ignore_errors=True)


def sandbox_uid(slot: int) -> int:
    """The user id of the kernel in ``slot`` of this grader (distinct across graders)."""
    return UID_BASE + (os.getpid() % 4_000_000) * 64 + slot % 64


def _setpriv(uid: int, read_anything: bool) -> list[str]:
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]
    argv += ["--pdeathsig=KILL"]  # the kernel dies with its worker, kill -9 included
    if read_anything:
        caps = "+dac_read_search"
        argv += [
            f"--inh-caps=-all,{caps}",
            f"--ambient-caps={caps}",
            f"--bounding-set=-all,{caps}",
        ]
    else:
        argv += ["--inh-caps=-all", "--bounding-set=-all"]
    return [*argv, "--"]


def kernel_argv(uid: int | None, python: str = sys.executable) -> list[str]:
    """The kernel's command: as ``uid`` when given (the grader is root), else as this user."""
    argv = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    if uid is None:  # the kernel dies with its worker, kill -9 included
        return ["setpriv", "--pdeathsig=KILL", "--", *argv] if shutil.which("setpriv") else argv
    # The kernel must start its interpreter again (run_ranks, multiprocessing): setpriv's own
    # exec still holds root's capabilities, so only a second exec shows a folder it cannot enter.
    again = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True)"
    probe = subprocess.run(
        [*_setpriv(uid, False), python, "-c", again], capture_output=True, timeout=60
    )
    return [*_setpriv(uid, probe.returncode != 0), *argv]


def write_kernelspec(folder: Path, name: str, argv: list[str]) -> Path:
    """A kernelspec ``name`` under ``folder/kernels``; ``folder`` goes on ``JUPYTER_PATH``."""
    spec = folder / "kernels" / name
    spec.mkdir(parents=True, exist_ok=True)
    spec_json = {"argv": argv, "display_name": name, "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(spec_json))
    return folder


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, real user id), from /proc."""
    table = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            table[int(entry)] = (int(fields["PPid"]), int(fields["Uid"].split()[0]))
        except (OSError, KeyError, ValueError):
            continue  # exited meanwhile
    return table


def _kill_until_gone(select, rounds: int = 200) -> None:  # noqa: ANN001
    """SIGKILL what ``select(table)`` names, again until nothing is left (a fork bomb refills)."""
    for _ in range(rounds):
        pids = select(_proc_table())
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
        _reap(pids)


def _reap(pids: list[int]) -> None:
    """Collect those of ``pids`` that are this process's children (re-parented orphans too),
    and no other child: a caller's ``Popen`` keeps its own."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def kill_uid(uid: int) -> None:
    """Kill every process of user ``uid``; it cannot change its id, so none escapes."""
    _kill_until_gone(lambda table: [p for p, (_, u) in table.items() if u == uid])


def descendants(pid: int, table: dict[int, tuple[int, int]], keep: set[int]) -> list[int]:
    """Processes under ``pid`` (not ``pid``), leaving out those under the pids in ``keep``."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [c for c in children.get(pid, []) if c not in keep]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += [c for c in children.get(current, []) if c not in keep]
    return found


def kill_descendants(pid: int, keep: set[int] | None = None) -> None:
    """Kill every process under ``pid`` except the subtrees of ``keep`` (live workers)."""
    keep = keep or set()
    _kill_until_gone(lambda table: descendants(pid, table, keep))


def _marked(marker: str, table: dict[int, tuple[int, int]], prefix: bool = False) -> list[int]:
    """Processes whose environment holds ``marker`` (``NAME=value``; with ``prefix``, a value
    that starts with it)."""
    needle = marker.encode()
    found = []
    for pid in table:
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                values = environ.read().split(b"\0")
        except OSError:
            continue  # exited, or another user's
        if any(v.startswith(needle) if prefix else v == needle for v in values):
            found.append(pid)
    return found


def kill_marked(marker: str) -> None:
    """Kill every process whose environment holds ``marker`` (``NAME=value``): what is left of a
    kernel whose worker died, daemons included unless they dropped their environment."""
    _kill_until_gone(lambda table: _marked(marker, table))


SHARED_TEMP = ("/tmp", "/var/tmp", "/dev/shm")


def remove_owned(uid: int, folders: tuple[str, ...] = SHARED_TEMP) -> None:
    """Delete what user ``uid`` left at the top of the shared temporary folders (a kernel's
    user owns nothing else, so all of it is that kernel's)."""
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    remove_tree(Path(entry.path))
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(folder: Path, prefix: str, marker: str) -> list[Path]:
    """What graders killed with ``kill -9`` left: for each ``folder/<prefix><pid>-*`` whose
    grader ``pid`` is dead, its kernels' processes (by user id and by ``marker``), the
    kernel users' files in the shared temporary folders, and the folder. Returns those
    removed."""
    removed = []
    for path in folder.glob(f"{prefix}*"):
        pid_text = path.name[len(prefix) :].split("-", 1)[0]
        if not pid_text.isdigit() or _alive(int(pid_text)) or not path.is_dir():
            continue
        pid = int(pid_text)
        uids = {UID_BASE + (pid % 4_000_000) * 64 + slot for slot in range(64)}
        if is_root():
            _kill_until_gone(
                lambda table, ids=uids: [p for p, (_, u) in table.items() if u in ids]
            )
            for uid in uids:
                remove_owned(uid)
        needle = f"{marker}={pid}-"
        _kill_until_gone(lambda table, n=needle: _marked(n, table, prefix=True))
        remove_tree(path)
        removed.append(path)
    return removed


def count_tasks(uid: int) -> int:
    """Threads of user ``uid`` now (RLIMIT_NPROC counts threads)."""
    total = 0
    for pid, (_, owner) in _proc_table().items():
        if owner == uid:
            try:
                total += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                pass
    return total


def give(path: Path, uid: int | None, mode: int = 0o700) -> None:
    """``path`` for the kernel's user alone (``uid`` None: this user)."""
    if uid is not None:
        os.chown(path, uid, uid)
    os.chmod(path, mode)
