"""Run one function on several processes joined by torch.distributed: one process per rank.

Context parallelism splits a request's KV cache across ranks, and the course shows that with
real processes, not a loop that pretends. ``run_ranks(fn, world_size, *args)`` starts
``world_size`` processes that have run none of the caller's code and pick the same backend
as the caller (on the CPU they fork from the standard library's fork server, which imported
torch and Triton once and stays while the caller lives; on GPUs and NPUs they are spawned,
each importing torch itself), joins them in a process group (gloo on the CPU, nccl on
NVIDIA GPUs with one GPU per rank, hccl on Ascend NPUs), calls ``fn(ctx, *args)`` on every
rank and returns the ranks' results in rank order.

``fn`` must be importable by name (defined in a module, not in a notebook cell): a rank
cannot see a notebook's globals. Results travel back through ``torch.save``, so tensors
come back on the CPU whatever device they were computed on.

Bounded and clean: every run has a deadline, the first rank that fails stops the others, and
no process outlives ``run_ranks``, also on Ctrl+C. Each rank leads its own session, which is
terminated, then killed, on every exit; and since a process can leave its session (a new
session, a new process group, a double fork), what a rank started is also held by a mechanism
it cannot leave (``_Jail``): a cgroup v2 of the run's own where one can be made (Linux, a
writable cgroup2 hierarchy: root, or a delegated subtree), killed whole with ``cgroup.kill``;
and everywhere on Linux each rank is a child subreaper, so an orphan of a double fork becomes
the rank's child, and every descendant is killed before the rank is. Without a cgroup, what a
rank started survives only if the rank itself is killed from outside before ``run_ranks``
reaches it.
A collective times out before the deadline, so a rank that never joins one is named as the
one stuck while the others' timeouts are reported as the knock-on effect they are.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import io
import math
import multiprocessing as mp
import multiprocessing.forkserver as forkserver_module
import os
import queue as queue_module
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slotmap.backend import BACKEND, ENV_VAR, QUIET_VAR
from slotmap.i18n import _

# What the fork server the CPU's ranks start from imports once (``_rank_context``).
RANK_PRELOAD = ["torch", "triton"]
_server: tuple[int | None, dict[str, str]] | None = None  # the server's pid and environment

# Process-group backend for each slotmap backend.
COMMUNICATION = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}

# NVLink multicast (NVLS) can take a shared host's GPUs out of service: keep it off in NCCL,
# PyTorch's symmetric memory and NVSHMEM for every rank we start.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@dataclass(frozen=True)
class RankContext:
    """What a rank knows about itself: passed as ``fn``'s first argument."""

    rank: int
    world_size: int
    device: torch.device  # this rank's device: its own GPU/NPU, or the CPU
    backend: str  # slotmap backend: "cpu", "cuda" or "npu"
    communication: str  # torch.distributed backend: "gloo", "nccl" or "hccl"


class RankFailed(RuntimeError):
    """A rank raised, died or missed the deadline; the message carries its traceback."""


class UnimportableRankFunction(ValueError):
    """``fn`` is defined where a spawned rank cannot import it (a notebook, a function): told
    apart by its class, since its message is in the course's language."""


def _unimportable(fn: Callable[..., Any]) -> bool:
    """A function a spawned process cannot find by name: one nested in another function, or
    one defined in an interactive ``__main__`` (a notebook). A script's ``__main__`` is fine:
    a spawned process runs the script's file again, as ``__mp_main__``."""
    if "<locals>" in getattr(fn, "__qualname__", "<locals>"):
        return True
    module = getattr(fn, "__module__", "__main__")
    main = sys.modules.get("__main__")
    return module == "__main__" and not getattr(main, "__file__", None)


def _rendezvous_store(timeout_s: float) -> Any:
    """The run's rendezvous store, served by the caller on a loopback port it holds from the
    moment the kernel picks it. A port only found free, for rank 0 to bind later, could be
    taken in between by another run's store, whose ranks would then pair with this run's; and
    a store left to bind its own port listens on every interface."""
    import torch.distributed as dist

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        return dist.TCPStore(
            "127.0.0.1",
            port,
            is_master=True,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=os.dup(sock.fileno()),  # the store closes its copy
        )


def rank_device(rank: int, backend: str) -> torch.device:
    """One accelerator per rank, round robin over the visible ones; the CPU for every rank."""
    if backend == "cuda":
        return torch.device("cuda", rank % torch.cuda.device_count())
    if backend == "npu":
        return torch.device("npu", rank % torch.npu.device_count())  # type: ignore[attr-defined]
    return torch.device("cpu")


def _dumps(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


PR_SET_CHILD_SUBREAPER = 36


def _set_subreaper() -> bool:
    """Make this process a child subreaper (Linux): orphans of its descendants (a double
    fork) become its children instead of init's. True if it worked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children(pid: int) -> list[int]:
    """``pid``'s child processes, from /proc (Linux; none elsewhere or once it is gone)."""
    found = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                found += [
                    int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                ]
    return found


def kill_descendants(pid: int, rounds: int = 200) -> None:
    """SIGKILL every process under ``pid`` until none is left (a fork refills the tree while it
    is killed). ``pid`` must be a subreaper for the orphans of killed processes to stay in the
    tree. Children of this process are reaped."""
    for _round in range(rounds):
        todo, found = _children(pid), []
        while todo:
            child = todo.pop()
            found.append(child)
            todo += _children(child)
        if not found:
            return
        for child in found:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
        for child in found:
            with contextlib.suppress(OSError):
                os.waitpid(child, os.WNOHANG)  # our own children only; others raise
        time.sleep(0.01)


class _Jail:
    """A cgroup v2 for one run's processes, where this process may make one: membership passes
    to every descendant and no process can leave it by itself (setsid, setpgid and double
    forks do not), and ``cgroup.kill`` ends them all at once. ``path`` is None where no cgroup
    can be made (no cgroup2 hierarchy, or not writable): then the ranks' subreapers hold."""

    def __init__(self) -> None:
        self.path: Path | None = None
        base = _own_cgroup()
        if base is None:
            return
        with contextlib.suppress(OSError):
            for stale in base.glob("slotmap-ranks-*"):  # of a run whose process was killed
                if not Path(f"/proc/{stale.name.split('-')[2]}").exists():
                    with contextlib.suppress(OSError):
                        stale.rmdir()  # refused while it holds processes
        for attempt in range(100):
            path = base / f"slotmap-ranks-{os.getpid()}-{attempt}"
            try:
                path.mkdir()
            except FileExistsError:
                continue
            except OSError:
                return
            self.path = path
            return

    def kill(self) -> None:
        """Kill every process in the cgroup, wait until it is empty, and remove it."""
        if self.path is None:
            return
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:  # a kernel before 5.14: kill the members one by one, frozen
            with contextlib.suppress(OSError):
                (self.path / "cgroup.freeze").write_text("1")
            for _ in range(200):
                members = _members(self.path)
                if not members:
                    break
                for pid in members:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.01)
        deadline = time.monotonic() + 10.0
        while _members(self.path) and time.monotonic() < deadline:
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            self.path.rmdir()
        self.path = None


def _members(path: Path) -> list[int]:
    try:
        return [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _own_cgroup() -> Path | None:
    """This process's cgroup v2 directory (Linux with a cgroup2 mount), or None."""
    try:
        entry = next(
            line[3:]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.startswith("0::")
        )
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields, _, tail = line.partition(" - ")
            if tail.split()[:1] == ["cgroup2"]:
                root, mount = fields.split()[3:5]
                relative = os.path.relpath(entry, root) if entry.startswith(root) else None
                if relative is not None and not relative.startswith(".."):
                    return Path(mount) / relative
    except (OSError, StopIteration, IndexError):
        pass
    return None


def _enter_jail(cgroup: str | None) -> None:
    """A rank's first act: into the run's cgroup (when there is one), and a subreaper."""
    if cgroup is not None:
        with contextlib.suppress(OSError):
            Path(cgroup, "cgroup.procs").write_text("0")  # "0": the writing process
    _set_subreaper()


def _rank_main(cgroup: str | None, *job: Any) -> None:
    """Body of each spawned process: into the run's jail, then ``_rank_body(*job)``, then kill
    what ``fn`` left running (a subreaper: orphans of a double fork are the rank's)."""
    _enter_jail(cgroup)
    try:
        _rank_body(*job)
    finally:
        kill_descendants(os.getpid())


def _rank_body(
    rank: int,
    world_size: int,
    port: int,
    collective_timeout_s: float,
    fn: Callable[..., Any],
    args: tuple,
    results: Any,
) -> None:
    """Join the group, run ``fn``, report, leave the group.

    The report goes out before the group is torn down: tearing it down closes this rank's
    connections, and the other ranks' collectives then fail with errors of their own that
    must not arrive in place of this rank's."""
    import torch.distributed as dist

    # Its own session: run_ranks stops the rank and every process it started in one signal.
    with contextlib.suppress(OSError):
        os.setsid()
    try:
        backend = BACKEND.name
        device = rank_device(rank, backend)
        if backend == "cuda":
            torch.cuda.set_device(device)
        elif backend == "npu":
            torch.npu.set_device(device)  # type: ignore[attr-defined]
        communication = COMMUNICATION[backend]
        timeout = datetime.timedelta(seconds=collective_timeout_s)
        dist.init_process_group(
            communication,
            store=dist.TCPStore("127.0.0.1", port, timeout=timeout),
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            **({"device_id": device} if backend != "cpu" else {}),
        )
    except BaseException:  # noqa: BLE001 - the parent must hear about every failure
        results.put((rank, False, f"rank {rank}:\n{traceback.format_exc()}"))
        return
    try:
        ctx = RankContext(rank, world_size, device, backend, communication)
        report = (rank, True, _dumps(fn(ctx, *args)))
    except BaseException:  # noqa: BLE001
        report = (rank, False, f"rank {rank}:\n{traceback.format_exc()}")
    results.put(report)
    results.close()
    results.join_thread()  # the report is in the pipe before the connections close
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the run's outcome is already reported
        pass


# Words in a rank's traceback that say it failed because another rank went away or never came
# (a collective or the rendezvous timed out waiting for it).
# A rank that exited with status 0 but sent nothing is named after this long (its report
# may still be on its way). After a first failure the others get SETTLE_S to report: longer
# than the grace, so that a rank that left quietly (often the cause) is still named.
QUIET_GRACE_S = 2.0
SETTLE_S = QUIET_GRACE_S + 1.0
KNOCK_ON = (
    "Connection closed",
    "Connection reset",
    "Read error",
    "DistBackendError",
    "NCCL communicator",
    "Broken pipe",
    "connection",
    "Timed out",
    "timed out",
)


def _stuck_message(rank: int) -> str:
    return _(
        "rank {rank} did not finish: still running after the others failed (if they timed "
        "out in a collective, this rank never joined it)"
    ).format(rank=rank)


def _failure_message(failures: dict[int, str], stuck: Sequence[int] = ()) -> str:
    """Every failed rank's traceback, the ones that look like a cause first, then the ranks
    still running (``stuck``), then the ranks whose collective broke or timed out because
    another rank went away or never came."""
    reports = {**failures, **{rank: _stuck_message(rank) for rank in stuck}}

    def tier(rank: int) -> int:
        if rank in stuck:
            return 1
        return 2 if any(word in failures[rank] for word in KNOCK_ON) else 0

    return "\n".join(reports[rank] for rank in sorted(reports, key=lambda r: (tier(r), r)))


@contextlib.contextmanager
def _main_file_not_borrowed() -> Iterator[None]:
    """While ranks are spawned, hide a ``__main__.__file__`` that Triton's interpreter put
    there: it copies its own module globals into a kernel's, and a kernel defined in a
    notebook has ``__main__``'s, so each rank would run the interpreter as its main script."""
    interpreter = sys.modules.get("triton.runtime.interpreter")
    main = sys.modules.get("__main__")
    borrowed = interpreter is not None and getattr(main, "__file__", None) == getattr(
        interpreter, "__file__", ""
    )
    if borrowed:
        del main.__file__
    try:
        yield
    finally:
        if borrowed:
            main.__file__ = interpreter.__file__


def _rank_context() -> Any:
    """How ranks start. On the CPU they fork from the standard library's fork server, which
    imported torch and Triton once (``RANK_PRELOAD``), instead of each importing them. Its
    ranks inherit its environment, not the caller's, so a server started by another
    environment (or by someone else) is stopped and started again in this one. GPUs and NPUs
    keep ``spawn``: a forked rank must not share a device runtime the server's torch loaded."""
    global _server
    if BACKEND.name != "cpu":
        return mp.get_context("spawn")
    server = forkserver_module._forkserver
    environment = dict(os.environ)
    if server._forkserver_pid is not None and _server != (server._forkserver_pid, environment):
        server._stop()
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(RANK_PRELOAD)
    server.ensure_running()
    _server = (server._forkserver_pid, environment)
    return context


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables while children are spawned (they copy it), then restore."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def _signal_session(process: Any, signum: int) -> None:
    """Send ``signum`` to a rank's session (the rank leads it once it has started), then to
    the rank itself if it is not reaped yet (a reaped rank's pid may belong to another)."""
    with contextlib.suppress(OSError):  # empty, or the rank has not made it yet
        os.killpg(process.pid, signum)
    with contextlib.suppress(OSError):
        if process.exitcode is not None:  # reaped: by the fork server as soon as it exits
            return
        if signum == signal.SIGKILL:
            process.kill()
        else:
            process.terminate()


def _stop(processes: list, jail: _Jail) -> None:
    """Terminate every rank and what it started, then kill what is left, also when a second
    Ctrl+C cuts the wait short. What a rank started dies first, while the rank (a subreaper)
    still collects the orphans; the session is killed after the rank is dead: a rank stopped
    before it led its session could not add to it any more; and last the run's cgroup, which
    holds whatever left both."""
    started = [process for process in processes if process.pid is not None]
    try:
        for process in started:
            if process.is_alive():
                kill_descendants(process.pid)
        for process in started:
            _signal_session(process, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for process in started:
            process.join(max(0.0, deadline - time.monotonic()))
    finally:
        for process in started:
            _signal_session(process, signal.SIGKILL)
        for process in started:
            process.join(5.0)
        jail.kill()


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 120.0,
    collective_timeout_s: float | None = None,
) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``world_size`` processes; return their results in rank order.

    Raises ``RankFailed`` with the failing rank's traceback if any rank raises, dies or does
    not finish within ``timeout_s`` seconds; every process, and every process a rank started,
    is stopped before it returns. A collective (and joining the group) gives up after
    ``collective_timeout_s`` (half of ``timeout_s`` unless given; it must be shorter), so a
    rank that never joins a collective is named while the others' timeouts come last.
    """
    if world_size < 1:
        raise ValueError(
            _("world_size must be >= 1, got {world_size}").format(world_size=world_size)
        )
    if collective_timeout_s is None:
        collective_timeout_s = timeout_s / 2
    if not 0 < collective_timeout_s < timeout_s:
        raise ValueError(
            _(
                "collective_timeout_s={collective} must be in (0, timeout_s={timeout}): "
                "a collective that outlasts the deadline cannot say which rank it waited for"
            ).format(collective=collective_timeout_s, timeout=timeout_s)
        )
    if BACKEND.name != "cpu":
        available = (
            torch.cuda.device_count() if BACKEND.name == "cuda" else torch.npu.device_count()  # type: ignore[attr-defined]
        )
        if available < world_size:
            # Two ranks on one GPU would deadlock NCCL: say so instead of hanging.
            raise ValueError(
                _(
                    "world_size={world_size} needs {world_size} {backend} devices, "
                    "{available} visible; run on the CPU (SLOTMAP_BACKEND=cpu) to use gloo"
                ).format(world_size=world_size, backend=BACKEND.name, available=available)
            )
    if _unimportable(fn):
        raise UnimportableRankFunction(
            _(
                "{name} is defined in a notebook or inside a function: "
                "a spawned rank cannot import it. Put it in a module."
            ).format(name=repr(getattr(fn, "__qualname__", fn)))
        )
    # Not torch.distributed.elastic's start_processes: a function entrypoint shares the
    # caller's process group and is signalled alone (its children are orphaned), and a binary
    # entrypoint takes only strings (no fn, no tensors back).
    results = None
    processes = []
    store = _rendezvous_store(timeout_s)
    port = store.port
    jail = _Jail()
    cgroup = None if jail.path is None else str(jail.path)
    # The ranks use the caller's backend and do not each announce it.
    environment = {ENV_VAR: BACKEND.name, QUIET_VAR: "1", **MULTICAST_OFF}
    try:
        with _environment(environment), _main_file_not_borrowed():
            context = _rank_context()
            results = context.Queue()
            for rank in range(world_size):
                process = context.Process(
                    target=_rank_main,
                    args=(cgroup, rank, world_size, port, collective_timeout_s, fn, args, results),
                    name=f"slotmap-rank-{rank}",
                    daemon=True,
                )
                process.start()
                processes.append(process)
        deadline = time.monotonic() + timeout_s
        values: dict[int, Any] = {}
        failures: dict[int, str] = {}
        quiet_since: dict[int, float] = {}  # exited cleanly, no report yet: since when
        settle = math.inf  # after a failure, how long to wait for the other ranks' reports
        while len(values) + len(failures) < world_size:
            if failures and time.monotonic() > settle:
                stuck = [
                    rank
                    for rank, process in enumerate(processes)
                    if rank not in values and rank not in failures and process.is_alive()
                ]
                raise RankFailed(_failure_message(failures, stuck))
            try:
                rank, ok, payload = results.get(timeout=0.2)
            except queue_module.Empty:
                now = time.monotonic()
                for rank, process in enumerate(processes):
                    if rank in values or rank in failures:
                        continue
                    if process.exitcode not in (None, 0):
                        failures[rank] = _("rank {rank} died with exit code {code}").format(
                            rank=rank, code=process.exitcode
                        )
                    elif (
                        process.exitcode == 0
                        and now - quiet_since.setdefault(rank, now) > QUIET_GRACE_S
                    ):
                        failures[rank] = _("rank {rank} exited without reporting a result").format(
                            rank=rank
                        )
                if failures:
                    settle = min(settle, now + SETTLE_S)
                if now > deadline and not failures:
                    missing = sorted(set(range(world_size)) - set(values))
                    raise RankFailed(
                        _("ranks {missing} did not finish within {seconds:.0f} s").format(
                            missing=missing, seconds=timeout_s
                        )
                    ) from None
                continue
            if ok:
                values[rank] = _loads(payload)
            else:
                failures[rank] = payload
                # Give the other ranks a moment to report: the cause may be among them.
                settle = min(settle, time.monotonic() + SETTLE_S)
        if failures:
            raise RankFailed(_failure_message(failures))
        for process in processes:
            process.join(max(0.1, deadline - time.monotonic()))
        return [values[rank] for rank in range(world_size)]
    finally:
        _stop(processes, jail)
        del store  # the store's server stops with it
        if results is not None:
            results.close()
