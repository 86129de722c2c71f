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
import sys
import time
from typing import Any

from sandbox import kill_descendants, set_subreaper


def _output_size(output: dict[str, Any]) -> int:
    if output.get("output_type") == "stream":
        return len(output.get("text", ""))
    data = output.get("data", {})
    size = sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in data.values())
    return size + len(json.dumps(output.get("traceback", [])))


def _client_class():
    import nbclient

    class Client(nbclient.NotebookClient):
        """Keeps at most ``max_output`` characters of outputs; past that the kernel is killed."""

        max_output = 0
        kept = 0
        flooded = False

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


def main() -> int:
    """Run the job read from stdin; results go to the file descriptor named on the command line."""
    os.setsid() if os.getpgrp() != os.getpid() else None
    results_fd = int(sys.argv[1])
    os.set_inheritable(results_fd, False)  # the kernel must not be able to write results
    results = os.fdopen(results_fd, "w", buffering=1)
    job = json.load(sys.stdin)
    set_subreaper()
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    limit = job["nproc"]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))

    import nbformat
    from jupyter_client.manager import AsyncKernelManager

    notebook = nbformat.from_dict(job["notebook"])
    check_cells = {int(i) for i in job["check_cells"]}
    deadline = time.monotonic() + job["notebook_timeout"]
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
        return max(1, min(job["timeout"], int(deadline - time.monotonic()) + 1))

    def report(cell, cell_index, **_) -> None:  # noqa: ANN001
        # Every cell's check outputs, so the grader can count the ones it will not accept.
        records = [
            o["data"][job["check_mime"]]
            for o in cell.get("outputs", [])
            if job["check_mime"] in o.get("data", {})
        ]
        if cell_index in check_cells or records:
            results.write(json.dumps({"cell": cell_index, "records": records}) + "\n")

    Client = _client_class()
    km = KernelManager(kernel_name=job["kernel_name"], transport="ipc", ip=job["ipc"])
    client = Client(
        notebook,
        km=km,
        timeout_func=cell_timeout,
        allow_errors=True,
        resources={"metadata": {"path": cwd}},
        on_cell_executed=report,
    )
    client.max_output = job["max_output"]
    error = ""
    try:
        client.execute(env=job["env"], cwd=cwd)
    except Exception as exc:  # a dead kernel, a timeout, an unreadable notebook
        first = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {first[0] if first else ''}"
        if type(exc).__name__ == "CellTimeoutError" and time.monotonic() >= deadline - 1:
            error = f"over the notebook's budget of {job['notebook_timeout']} s"
    finally:
        kill_descendants(os.getpid())
    if client.flooded:
        error = f"more than {job['max_output']} characters of output: the kernel was stopped"
    results.write(json.dumps({"done": True, "error": error}) + "\n")
    results.close()
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(main())
