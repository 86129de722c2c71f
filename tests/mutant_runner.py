"""Runs the mutation tests' pytest jobs, each in a fresh fork of one process that has already
imported torch, Triton, hypothesis and pytest: a new interpreter per job would spend most of
its time importing them again.

Jobs come on stdin, one JSON object a line: ``cwd`` (the mutated copy), ``env`` (the job's whole
environment), ``args`` (pytest's) and ``log`` (a file for the job's stdout and stderr). For each
job, this process forks; the child becomes the job (its folder, its environment, the copy first
on ``sys.path``) and imports slotmap from the copy, since this process never imports slotmap.
The answer, one line on stdout, is the job's exit status. ``tests/test_mutants.py`` starts it
in a session of its own (a timeout kills the runner and its job), with the jobs' environment
less their paths: on the CPU that includes ``TRITON_INTERPRET=1``, which Triton must see at
import, as slotmap sets it when it is imported first.
"""

from __future__ import annotations

import json
import os
import sys

import hypothesis  # noqa: F401  (imported once, shared by every job)
import numpy  # noqa: F401
import pytest
import torch  # noqa: F401
import triton  # noqa: F401

assert "slotmap" not in sys.modules, "the runner never imports slotmap: each job imports its copy"


def run_job(job: dict) -> int:
    """Fork, run pytest in the child as the job, and return the child's exit status."""
    pid = os.fork()
    if pid == 0:
        status = 3  # pytest's internal error, if anything below raises
        try:
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            sys.path[0] = job["cwd"]  # this file's folder, the original tests/, is never the copy
            log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            status = int(pytest.main(job["args"]))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status)


def main() -> None:
    for line in sys.stdin:
        print(json.dumps(run_job(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
