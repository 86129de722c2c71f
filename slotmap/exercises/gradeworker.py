"""One notebook's execution for ``slotmap grade``, in a process of its own.

``slotmap.exercises.grade`` starts this file as a script (``python gradeworker.py FD``), in a
session of its own, with a job on stdin (the prepared notebook, where to run it, the limits).
It runs the notebook on a fresh kernel and writes one JSON line to file descriptor ``FD`` per
check cell as soon as that cell has run (its check outputs), then ``{"done": ...}``. The
kernel can kill this process at most: the grader keeps what was written and goes on.

It is a script so that it starts without importing ``slotmap`` (and torch); it needs only
nbclient and nbformat.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any

if __package__:
    from .sandbox import die_with_parent, kill_descendants, set_subreaper, undumpable
else:  # run as a script, beside sandbox.py, without importing slotmap
    from sandbox import die_with_parent, kill_descendants, set_subreaper, undumpable

# The reply nbclient records for a cell stopped at its time limit (the kernel interrupted).
TIMED_OUT = {"ename": "CellTimeoutError", "evalue": "the cell's time limit", "traceback": []}
POLL_SLICE = 1.0  # seconds: the longest one wait on a kernel channel may miss a message by


def sliced(get_msg):  # noqa: ANN001, ANN201
    """``get_msg`` whose waits last at most ``POLL_SLICE`` each, up to the same timeout.

    pyzmq's asyncio poll can miss the wake-up of a message that has arrived; it sees the
    message only when its timeout ends (it polls once more then). nbclient waits for a cell's
    reply with the cell's whole timeout, so a missed wake-up stalled a finished cell for that
    long and then went on. Short polls bound the cost of one to ``POLL_SLICE``."""
    from queue import Empty

    async def get(timeout: float | None = None):  # noqa: ANN202
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_SLICE if deadline is None else deadline - time.monotonic()
            try:
                return await get_msg(timeout=max(0.0, min(POLL_SLICE, left)))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    return get


def client_class():  # noqa: ANN201
    """nbclient's ``NotebookClient`` with sliced waits on the kernel's channels (``sliced``)
    and a cap on the output it keeps (``max_output`` characters; past it the kernel dies)."""
    import nbclient

    class Client(nbclient.NotebookClient):
        max_output = 0
        kept = 0
        flooded = False

        async def async_start_new_kernel_client(self):  # noqa: ANN201
            kc = await super().async_start_new_kernel_client()
            for channel in (kc.shell_channel, kc.iopub_channel):
                channel.get_msg = sliced(channel.get_msg)
            return kc

        def output(self, outs, msg, display_id, cell_index):  # noqa: ANN001, ANN201
            out = super().output(outs, msg, display_id, cell_index)
            if out is not None and self.max_output:
                self.kept += _output_size(out)
                if self.kept > self.max_output:
                    outs.pop()
                    if not self.flooded:
                        self.flooded = True
                        kill_descendants(os.getpid())  # ends the flood; the kernel dies
            return out

    return Client


class OverBudget(Exception):
    """The notebook's whole time budget is spent: no further cell starts."""


def _output_size(output: dict[str, Any]) -> int:
    if output.get("output_type") == "stream":
        return len(output.get("text", ""))
    data = output.get("data", {})
    size = sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in data.values())
    return size + len(json.dumps(output.get("traceback", [])))


def main() -> int:
    """Run the job read from stdin; results go to the file descriptor named on the command line."""
    os.setsid() if os.getpgrp() != os.getpid() else None
    results_fd = int(sys.argv[1])
    os.set_inheritable(results_fd, False)  # the kernel must not be able to write results
    results = os.fdopen(results_fd, "w", buffering=1)
    job = json.load(sys.stdin)
    die_with_parent(job["grader"])
    set_subreaper()
    undumpable()  # a kernel of this user cannot trace the judge or read its memory
    sys.path.insert(0, job["snapshot"])
    from slotmap import i18n
    from slotmap.exercises.gradecheck import Judge
    from slotmap.i18n import _

    i18n.use(job["lang"])  # the grader's, which its report and the judge's messages speak

    checks = {int(i): ids for i, ids in job["checks"].items()}
    judge = Judge(job["judge"], timeout=job["timeout"] + 60)
    if job.get("uid") is not None:
        os.chown(job["judge"], job["uid"], -1)
    os.chmod(job["judge"], 0o600)
    judge.preload()
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    limit = job["nproc"]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))

    from slotmap.jupyter_main import leave_unused_parsers_unimported

    leave_unused_parsers_unimported()
    import nbformat
    from jupyter_client.manager import AsyncKernelManager

    notebook = nbformat.from_dict(job["notebook"])
    deadline = time.monotonic() + job["notebook_timeout"]
    over_budget = _("over the notebook's budget of {seconds} s").format(
        seconds=job["notebook_timeout"]
    )
    timed_out: list[int] = []
    cwd = job["cwd"]
    uid = job.get("uid")

    class KernelManager(AsyncKernelManager):
        def write_connection_file(self, **kwargs):  # noqa: ANN003, ANN201
            written = super().write_connection_file(**kwargs)
            if uid is not None:  # the kernel runs as ``uid`` and must read its connection file
                os.chown(self.connection_file, uid, -1)
            return written

    def cell_timeout(cell) -> int:  # noqa: ANN001
        # The notebook's budget bounds every cell, so N cells cannot take N x the cell limit.
        left = deadline - time.monotonic()
        if left <= 0:
            raise OverBudget(over_budget)
        return max(1, min(job["timeout"], int(left) + 1))

    def start(cell, cell_index, **unused) -> None:  # noqa: ANN001
        if cell_index in checks:
            judge.open(cell_index, checks[cell_index])

    def report(cell, cell_index, execute_reply=None, **unused) -> None:  # noqa: ANN001
        content = (execute_reply or {}).get("content", {})
        if content.get("ename") == TIMED_OUT["ename"]:
            timed_out.append(cell_index)
        # Every cell's check outputs, so the grader can count them (none is accepted), and the
        # judge's verdicts for a check cell.
        records = [
            o["data"][job["check_mime"]]
            for o in cell.get("outputs", [])
            if job["check_mime"] in o.get("data", {})
        ]
        judged = judge.close() if cell_index in checks else []
        if cell_index in checks or records:
            message = {"cell": cell_index, "records": records, "judged": judged}
            results.write(json.dumps(message) + "\n")

    Client = client_class()
    km = KernelManager(
        kernel_name=job["kernel_name"],
        transport="ipc",
        ip=job["ipc"],
        # In the notebook's private folder (removed afterwards), not a file of its own in /tmp.
        connection_file=job["connection_file"],
    )
    client = Client(
        notebook,
        km=km,
        timeout_func=cell_timeout,
        iopub_timeout=30,  # a loaded machine can be late with a cell's last outputs
        allow_errors=True,
        # A cell over its limit is interrupted and the next cells run, each on its own limit.
        interrupt_on_timeout=True,
        error_on_timeout=TIMED_OUT,
        resources={"metadata": {"path": cwd}},
        on_cell_execute=start,
        on_cell_executed=report,
    )
    client.max_output = job["max_output"]
    error = ""
    try:
        # The kernel's own stdout and stderr (not the notebook's): nowhere, not the worker's log.
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        client.execute(env=job["env"], cwd=cwd, **quiet)
    except OverBudget as exc:
        error = str(exc)
    except Exception as exc:  # a dead kernel, a timeout, an unreadable notebook
        first = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {first[0] if first else ''}"
        if type(exc).__name__ == "CellTimeoutError" and time.monotonic() >= deadline - 1:
            error = over_budget
    finally:
        kill_descendants(os.getpid())
    if client.flooded:
        error = _("more than {count} characters of output: the kernel was stopped").format(
            count=job["max_output"]
        )
    if timed_out and not error:
        error = _(
            "cell {cells} ran over the limit of {seconds} s a cell and was interrupted; "
            "the later cells ran"
        ).format(cells=", ".join(str(i) for i in timed_out), seconds=job["timeout"])
    results.write(json.dumps({"done": True, "error": error}) + "\n")
    results.close()
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(main())
