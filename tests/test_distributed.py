"""slotmap.distributed.run_ranks: real processes, real collectives, bounded and cleaned up."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rank_jobs

from slotmap.backend import BACKEND
from slotmap.cp import max_ranks
from slotmap.distributed import RankFailed, run_ranks
from slotmap.workshop.drive import descendants

# One rank per device on an accelerator: these tests need two of them there.
pytestmark = pytest.mark.skipif(max_ranks() < 2, reason="two ranks need two devices")
WORLD = min(3, max_ranks())


def alive(pid: int) -> bool:
    """Running or sleeping: neither gone nor a zombie (an exited process nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def pids_in(folder: Path) -> list[int]:
    return [int(path.read_text()) for path in folder.iterdir() if path.name.isdigit()]


def survivors(folder: Path, world: int) -> list[int]:
    """The children the ranks started (their pids in ``folder``) that are still alive: after
    run_ranks returns, each is dead or has a SIGKILL on its way (10 s is ample to land)."""
    pids = pids_in(folder)
    assert len(pids) == world, pids
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


@pytest.fixture
def children(tmp_path):
    """A folder where ranks write the pids of the children they start; a failing test leaves
    none of those 600 s sleeps behind."""
    yield tmp_path
    for pid in pids_in(tmp_path):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_ranks_run_in_separate_processes_and_communicate(capfd):
    results = run_ranks(rank_jobs.sum_of_ranks, WORLD, 10)
    assert "slotmap: backend" not in capfd.readouterr().out  # the ranks stay quiet
    assert [r["rank"] for r in results] == list(range(WORLD))
    assert all(r["world"] == WORLD for r in results)
    assert all(r["sum"] == sum(10 * rank for rank in range(WORLD)) for r in results)
    pids = {r["pid"] for r in results}
    assert len(pids) == WORLD and os.getpid() not in pids
    assert all(r["nvls"] == "0" for r in results)
    assert "NCCL_NVLS_ENABLE" not in os.environ or os.environ["NCCL_NVLS_ENABLE"] == "0"


def test_a_failing_rank_reports_its_traceback_and_stops_the_others():
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 1:(.|\n)*ValueError: rank one refuses"):
        run_ranks(rank_jobs.fail_on_rank_one, 2, timeout_s=60)
    assert time.monotonic() - start < 40  # not the sleeping rank's 60 s


def test_a_rank_that_dies_is_reported():
    with pytest.raises(RankFailed, match="rank 0 died with exit code 3"):
        run_ranks(rank_jobs.exit_on_rank_zero, 2, 3, timeout_s=60)


def test_the_deadline_stops_every_process(children):
    import multiprocessing

    # The ranks' children must have started before the deadline for the test to see them
    # stopped; on a loaded machine starting the ranks takes longer: double the deadline.
    for timeout_s in (8, 16, 32, 64):
        with pytest.raises(RankFailed, match=rf"did not finish within {timeout_s} s"):
            run_ranks(rank_jobs.child_then_sleep_forever, 2, str(children), timeout_s=timeout_s)
        ranks = [p for p in multiprocessing.active_children() if p.name.startswith("slotmap-rank")]
        assert not ranks
        started = len(pids_in(children))
        assert survivors(children, started) == []  # nor what the ranks started
        if started == 2:
            break
        for path in children.iterdir():
            path.unlink()
    assert started == 2, "the ranks did not start their children within 64 s"


def test_no_process_a_rank_started_outlives_a_successful_run(children):
    pids = run_ranks(rank_jobs.start_a_child, WORLD, str(children), timeout_s=90)
    assert len(set(pids)) == WORLD
    assert survivors(children, WORLD) == []


def test_ctrl_c_stops_every_rank_and_what_it_started(children, tmp_path_factory):
    # What Ctrl+C does: SIGINT to the process whose main thread is in run_ranks (the ranks lead
    # sessions of their own, so the terminal's SIGINT reaches only it): rank_jobs.interrupted_run,
    # in a process of its own whose path holds tests/, so that the ranks import rank_jobs.
    tests = Path(__file__).parent
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tests), os.environ.get("PYTHONPATH")])),
    }
    # Files, not pipes: a rank that outlives the driver would hold a pipe open, and reading it
    # to the end would wait for that rank's hour-long sleep.
    logs = tmp_path_factory.mktemp("driver")
    with open(logs / "out", "w") as out, open(logs / "err", "w") as err:
        driver = subprocess.Popen(
            [
                sys.executable,
                "-X",
                "faulthandler",  # SIGABRT prints where it hangs
                "-c",
                "import sys, rank_jobs; rank_jobs.interrupted_run(sys.argv[1])",
                str(children),
            ],
            env=environment,
            stdout=out,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 80
        while not all((children / str(rank)).exists() for rank in range(2)):
            assert driver.poll() is None, (logs / "err").read_text()[-3000:]
            assert time.monotonic() < deadline, "the ranks did not start their children"
            time.sleep(0.1)
        driver.send_signal(signal.SIGINT)
        driver.wait(timeout=60)
    except subprocess.TimeoutExpired:
        ranks = descendants(driver.pid)
        driver.send_signal(signal.SIGABRT)
        driver.wait(timeout=30)
        for pid in ranks:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        stack = (logs / "err").read_text()[-6000:]
        pytest.fail(f"run_ranks did not return within 60 s of SIGINT; where it was:\n{stack}")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, (logs / "err").read_text()[-3000:]
    last = (logs / "out").read_text().splitlines()[-1]
    assert json.loads(last) == {"raised": "KeyboardInterrupt", "ranks_left": []}
    assert survivors(children, 2) == []


def test_a_rank_stuck_outside_a_collective_is_named_not_the_ranks_that_timed_out(children):
    # The others' collectives time out at half the deadline: their errors are the knock-on.
    with pytest.raises(RankFailed) as failure:
        run_ranks(rank_jobs.stuck_outside_a_collective, WORLD, str(children), timeout_s=40)
    message = str(failure.value)
    assert message.startswith("rank 1 did not finish: still running after the others"), message
    waited = [rank for rank in range(WORLD) if rank != 1]
    assert all(f"rank {rank}:\n" in message for rank in waited), message
    assert message.count("did not finish") == 1, message
    assert survivors(children, WORLD) == []


def loaded_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(BACKEND.name != "cpu", reason="the CPU's ranks fork from a server")
def test_the_cpus_ranks_fork_from_a_server_that_imported_torch_once():
    first = run_ranks(rank_jobs.where_i_started, 2, "SLOTMAP_UNSET", timeout_s=90)
    second = run_ranks(rank_jobs.where_i_started, 2, "SLOTMAP_UNSET", timeout_s=90)
    servers = {r["parent"] for r in first + second}
    assert len(servers) == 1 and os.getpid() not in servers, servers
    assert "libtorch" in loaded_libraries(servers.pop())


def test_the_caller_serves_the_rendezvous_on_a_loopback_port_it_holds_from_the_start():
    # Were rank 0 to bind a port the caller had only found free, another run's store could
    # take it first and the two runs' ranks would pair across them (seen once in CI).
    reports = run_ranks(rank_jobs.who_serves_the_rendezvous, 2, timeout_s=90)
    assert len({r["port"] for r in reports}) == 1, reports
    assert [r["servers"] for r in reports] == [[os.getpid()]] * 2, reports
    assert reports[0]["address"] == "0100007F", "the store listens on the loopback interface only"


@pytest.mark.skipif(BACKEND.name != "cpu", reason="the CPU's ranks fork from a server")
def test_ranks_see_the_environment_of_the_call_not_the_servers(monkeypatch):
    run_ranks(rank_jobs.where_i_started, 2, "SLOTMAP_RANK_MARK", timeout_s=90)
    monkeypatch.setenv("SLOTMAP_RANK_MARK", "set after the server started")
    results = run_ranks(rank_jobs.where_i_started, 2, "SLOTMAP_RANK_MARK", timeout_s=90)
    assert [r["value"] for r in results] == ["set after the server started"] * 2
    monkeypatch.delenv("SLOTMAP_RANK_MARK")
    results = run_ranks(rank_jobs.where_i_started, 2, "SLOTMAP_RANK_MARK", timeout_s=90)
    assert [r["value"] for r in results] == [None, None]


def test_accelerators_ranks_are_spawned(monkeypatch):
    from slotmap import distributed

    monkeypatch.setattr(distributed, "BACKEND", dataclasses.replace(BACKEND, name="cuda"))
    assert distributed._rank_context().get_start_method() == "spawn"


def test_a_collective_timeout_must_come_before_the_deadline():
    refused = r"collective_timeout_s=10 must be in \(0, timeout_s=10\)"
    with pytest.raises(ValueError, match=refused):
        run_ranks(rank_jobs.sum_of_ranks, 2, 1, timeout_s=10, collective_timeout_s=10)


def test_functions_a_rank_cannot_import_are_refused():
    def local(ctx):
        return ctx.rank

    with pytest.raises(ValueError, match="cannot import it"):
        run_ranks(local, 2)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        run_ranks(rank_jobs.sum_of_ranks, 0, 1)


def test_the_rank_that_raised_is_reported_first_not_the_one_it_left_hanging():
    for _ in range(2):
        with pytest.raises(RankFailed) as failure:
            run_ranks(rank_jobs.fail_during_a_collective, 2, timeout_s=60)
        message = str(failure.value)
        assert message.startswith("rank 1:"), message
        assert "RuntimeError: boom on rank 1" in message


def test_a_quiet_exit_is_named_first_even_after_a_knock_on_failure():
    # The knock-on failure reports first; the rank that left quietly is still named, first.
    with pytest.raises(RankFailed) as failure:
        run_ranks(rank_jobs.quiet_exit_then_knock_on, 2, timeout_s=60)
    message = str(failure.value)
    assert message.startswith("rank 0 exited without reporting a result"), message
    assert "Connection reset by peer (rank 0 went away)" in message


def test_a_rank_that_exits_without_reporting_is_reported():
    start = time.monotonic()
    with pytest.raises(RankFailed, match="rank 0 exited without reporting a result"):
        run_ranks(rank_jobs.exit_on_rank_zero, 2, 0, timeout_s=60)
    assert time.monotonic() - start < 30


def test_ranks_start_when_tritons_interpreter_lent_main_its_file(monkeypatch):
    # A kernel defined in a notebook shares __main__'s globals, and Triton's interpreter
    # copies its own into them, __file__ included: a spawned rank would then run the
    # interpreter as its main script and die on import.
    from triton.runtime import interpreter

    main = sys.modules["__main__"]
    # A notebook's __main__ has no module spec, so a spawned child re-runs its __file__.
    monkeypatch.setattr(main, "__spec__", None, raising=False)
    monkeypatch.setattr(main, "__file__", interpreter.__file__, raising=False)
    results = run_ranks(rank_jobs.sum_of_ranks, 2, 1, timeout_s=120)
    assert [r["sum"] for r in results] == [1, 1]
    assert main.__file__ == interpreter.__file__  # put back for the caller


# ---------------------------------------------------------------------------------------------
# Processes that leave the rank's session: a cgroup of the run's own where one can be made,
# and the ranks' subreapers everywhere.
# ---------------------------------------------------------------------------------------------
def cgroup_available() -> bool:
    from slotmap import distributed

    jail = distributed._Jail()
    available = jail.path is not None
    jail.kill()  # removes it
    return available


def escape_survivors(folder: Path, world: int) -> list[str]:
    """The escapes the ranks started (``rank_jobs.start_escapes``) still alive after the run."""
    started = {path.name: int(path.read_text()) for path in folder.iterdir() if "-" in path.name}
    expected = {f"{rank}-{route}" for rank in range(world) for route in rank_jobs.ESCAPES}
    assert expected <= set(started), sorted(started)
    deadline = time.monotonic() + 10  # a SIGKILL on its way lands
    while any(alive(pid) for pid in started.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted(name for name, pid in started.items() if alive(pid))


@pytest.fixture
def escapes(tmp_path):
    """Like ``children``, for the escapes: none of their 600 s sleeps outlives a failed test."""
    yield tmp_path
    for path in tmp_path.iterdir():
        if "-" in path.name and path.name[0].isdigit() and alive(int(path.read_text())):
            os.kill(int(path.read_text()), signal.SIGKILL)


JAILS = [
    pytest.param(
        "cgroup",
        marks=pytest.mark.skipif(not cgroup_available(), reason="no writable cgroup2 here"),
    ),
    "subreaper",
]


@pytest.mark.parametrize("jail", JAILS)
@pytest.mark.parametrize("then", ["return", "raise"])
def test_no_escape_from_the_session_outlives_the_run(escapes, monkeypatch, jail, then):
    from slotmap import distributed

    if jail == "subreaper":  # as where no cgroup can be made: the subreapers alone
        monkeypatch.setattr(distributed, "_own_cgroup", lambda: None)
    if then == "return":
        assert run_ranks(rank_jobs.start_escapes, 2, str(escapes), timeout_s=90) == [0, 1]
    else:
        with pytest.raises(RankFailed, match="rank 1 fails after starting its escapes"):
            run_ranks(rank_jobs.start_escapes, 2, str(escapes), "raise", timeout_s=90)
    assert escape_survivors(escapes, 2) == []


@pytest.mark.skipif(not cgroup_available(), reason="no writable cgroup2 here")
def test_the_cgroup_holds_what_a_killed_rank_started(escapes):
    # A rank killed from outside cannot kill what it started, and its orphans leave its tree
    # (a subreaper's hold ends with it): only the cgroup still holds them.
    with pytest.raises(RankFailed, match="rank 1 died with exit code -9"):
        run_ranks(rank_jobs.start_escapes, 2, str(escapes), "die", timeout_s=90)
    assert escape_survivors(escapes, 2) == []


def test_the_run_leaves_no_cgroup_behind():
    from slotmap import distributed

    base = distributed._own_cgroup()
    run_ranks(rank_jobs.sum_of_ranks, 2, 1, timeout_s=90)
    if base is not None and base.is_dir():
        assert not list(base.glob(f"slotmap-ranks-{os.getpid()}-*"))
