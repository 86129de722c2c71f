"""slotmap.distributed.run_ranks: real processes, real collectives, bounded and cleaned up."""

from __future__ import annotations

import os
import time

import pytest
import rank_jobs

from slotmap.cp import max_ranks
from slotmap.distributed import RankFailed, run_ranks

# One rank per device on an accelerator: these tests need two of them there.
pytestmark = pytest.mark.skipif(max_ranks() < 2, reason="two ranks need two devices")
WORLD = min(3, max_ranks())


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


def test_the_deadline_stops_every_process():
    with pytest.raises(RankFailed, match=r"did not finish within 8 s"):
        run_ranks(rank_jobs.sleep_forever, 2, timeout_s=8)
    import multiprocessing

    assert not [p for p in multiprocessing.active_children() if p.name.startswith("slotmap-rank")]


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
