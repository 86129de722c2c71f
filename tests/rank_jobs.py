"""Rank functions for tests/test_distributed.py: a spawned rank imports them by name."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from slotmap.distributed import RankContext


def sum_of_ranks(ctx: RankContext, scale: int) -> dict:
    value = torch.tensor([ctx.rank * scale], device=ctx.device)
    dist.all_reduce(value)
    return {
        "rank": ctx.rank,
        "world": ctx.world_size,
        "sum": int(value.item()),
        "pid": os.getpid(),
        "nvls": os.environ.get("NCCL_NVLS_ENABLE"),
    }


def fail_on_rank_one(ctx: RankContext) -> int:
    if ctx.rank == 1:
        raise ValueError("rank one refuses")
    time.sleep(60)  # the others would wait: run_ranks must stop them
    return ctx.rank


def start_a_child(ctx: RankContext, folder: str) -> int:
    """Start a process that would outlive this rank and write its pid to ``folder/<rank>``."""
    child = subprocess.Popen(["sleep", "600"])
    Path(folder, f"{ctx.rank}.tmp").write_text(str(child.pid))
    Path(folder, f"{ctx.rank}.tmp").rename(Path(folder, str(ctx.rank)))  # whole or absent
    return child.pid


ESCAPES = ("new-session", "new-process-group", "double-fork")
# The grandchild holds none of the middle process's pipes: the rank reads its pid to the end.
DOUBLE_FORK = (
    "import subprocess; "
    "child = subprocess.Popen(['sleep', '600'], start_new_session=True, "
    "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
    "print(child.pid)"
)


def start_escapes(ctx: RankContext, folder: str, then: str = "return") -> int:
    """Start three processes that leave this rank's session, one by each route: a new
    session, a new process group, a double fork (its parent exits at once, so it is an
    orphan in a session of its own). Their pids go to ``folder/<rank>-<route>``. ``then``:
    "return", "raise" (rank 1 raises, rank 0 sleeps until stopped) or "die" (rank 1 is
    killed by SIGKILL, as the OOM killer would)."""
    started = {
        "new-session": subprocess.Popen(["sleep", "600"], start_new_session=True).pid,
        # preexec_fn, not process_group=0: that one needs Python 3.11.
        "new-process-group": subprocess.Popen(["sleep", "600"], preexec_fn=os.setpgrp).pid,
        "double-fork": int(
            subprocess.run(
                [sys.executable, "-c", DOUBLE_FORK], capture_output=True, text=True, check=True
            ).stdout
        ),
    }
    for route, pid in started.items():
        Path(folder, f"{ctx.rank}-{route}.tmp").write_text(str(pid))
        Path(folder, f"{ctx.rank}-{route}.tmp").rename(Path(folder, f"{ctx.rank}-{route}"))
    if then != "return" and ctx.rank == 1:
        if then == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("rank 1 fails after starting its escapes")
    if then != "return":
        time.sleep(600)
    return ctx.rank


def child_then_sleep_forever(ctx: RankContext, folder: str) -> int:
    start_a_child(ctx, folder)
    time.sleep(3600)
    return ctx.rank


def stuck_outside_a_collective(ctx: RankContext, folder: str) -> int:
    """Every rank starts a child; rank 1 then never joins the all_reduce the others wait in.
    Rank 1 is the cause; the others' collective timeouts are the knock-on effect."""
    start_a_child(ctx, folder)
    if ctx.rank == 1:
        time.sleep(3600)
    value = torch.ones(1, device=ctx.device)
    dist.all_reduce(value)
    return ctx.rank


def exit_on_rank_zero(ctx: RankContext, code: int) -> int:
    """Rank 0 leaves with ``code`` and no report (3: it died; 0: it exited quietly)."""
    if ctx.rank == 0:
        os._exit(code)
    time.sleep(60)
    return ctx.rank


def quiet_exit_then_knock_on(ctx: RankContext) -> int:
    """Rank 0 leaves quietly; rank 1 then fails as a rank does whose peer went away (CI saw
    this race: the knock-on error arrived before rank 0 could be named)."""
    # Both ranks past the rendezvous first: a rank 0 gone during rank 1's connection setup
    # fails rank 1 there, with gloo's own words instead of this job's.
    dist.barrier()
    if ctx.rank == 0:
        os._exit(0)
    time.sleep(0.3)
    raise ConnectionError("Connection reset by peer (rank 0 went away)")


def fail_during_a_collective(ctx: RankContext) -> int:
    """Rank 1 raises while rank 0 waits in an all_reduce: the report must name rank 1's
    error, not rank 0's broken connection."""
    if ctx.rank == 1:
        raise RuntimeError("boom on rank 1")
    value = torch.ones(1, device=ctx.device)
    dist.all_reduce(value)
    return ctx.rank


def interrupted_run(folder: str) -> None:
    """The Ctrl+C test's own process: ``run_ranks`` of ``child_then_sleep_forever`` in its main
    thread until a SIGINT arrives, then one JSON line: what ``run_ranks`` raised and the ranks
    still alive after it returned (a pytest-xdist worker's main thread is not the test's, so
    the test cannot interrupt itself)."""
    from slotmap.distributed import run_ranks

    # As in a terminal's foreground job. A suite started in the background (`make test &`, a CI
    # runner) has SIGINT ignored, which its processes inherit: Python then leaves it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run_ranks(child_then_sleep_forever, 2, folder, timeout_s=90)
        raised = None
    except KeyboardInterrupt:
        raised = "KeyboardInterrupt"
    left = [p.name for p in multiprocessing.active_children() if p.name.startswith("slotmap-rank")]
    print(json.dumps({"raised": raised, "ranks_left": left}))


def where_i_started(ctx: RankContext, name: str) -> dict:
    """This rank's parent and its view of the environment variable ``name``."""
    return {"parent": os.getppid(), "value": os.environ.get(name)}


def who_serves_the_rendezvous(ctx: RankContext) -> dict:
    """The port of this run's rendezvous store, the address it listens on and who listens."""
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    dist.barrier()  # every rank has joined before anyone looks
    listeners = {}  # socket inode -> local address, from the kernel's tables (hex)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].split(":")
            if int(port, 16) == store.port and fields[3] == "0A":  # 0A: listening
                listeners[fields[9]] = address
    servers = set()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            if os.readlink(fd).removeprefix("socket:[").removesuffix("]") in listeners:
                servers.add(int(fd.parts[2]))
    addresses = sorted(set(listeners.values()))
    return {"port": store.port, "servers": sorted(servers), "address": ",".join(addresses)}
