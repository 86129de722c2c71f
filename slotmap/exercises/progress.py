"""The learner's progress records: one line per check that ran, in their own ``my_work/``.

``check`` calls ``record`` after a check has run: it appends ``{"exercise", "state"
("pass", "fail" or "skip"), "message" (the invariant a failure broke), "time"}`` as one JSON
line to ``my_work/.slotmap-progress.jsonl``. It records only checks that run in a notebook
inside the learner's workspace (the kernel's current folder is in ``learner_workspace()``):
the lessons, the solutions and the test suite, which run elsewhere, leave nothing. A record
is never a reason for a check to fail: a workspace that cannot be written to is skipped.

The records are the learner's own file: the workshop dashboard shows them as a progress view,
and ``slotmap grade`` (which re-runs the checks itself) is what an instructor can trust.

Under a hub whose dashboard takes posted records (``$SLOTMAP_RECORDS_URL``, with the
server's ``$JUPYTERHUB_API_TOKEN`` in the kernel's environment) each record is also sent
there, from a thread of its own with a short timeout: the check never waits for it. A record
that could not be sent is kept (``unsent``, the newest ``UNSENT_CAP``) and sent before the
next one; ``last_failure`` says why the last send failed. The dashboard refuses for good a
record it answers 4xx to: that one is dropped.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any

PROGRESS_FILE = ".slotmap-progress.jsonl"
STATES = ("pass", "fail", "skip")
RECORDS_URL_VARIABLE = "SLOTMAP_RECORDS_URL"  # the dashboard's api/records, set by the hub
TOKEN_VARIABLE = "JUPYTERHUB_API_TOKEN"  # the learner's server token, set by the hub
POST_TIMEOUT = 3.0  # seconds; the sending thread's, never the check's
UNSENT_CAP = 500  # records kept for the next send while the dashboard does not answer
unsent: deque[dict[str, Any]] = deque(maxlen=UNSENT_CAP)
last_failure = ""  # why the last send failed ("" once one succeeds)
_sending = threading.Lock()
_sender: threading.Thread | None = None


def _inside(folder: Path, path: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def state_of(result: Any) -> str:
    """ "pass", "fail" or "skip" for a ``CheckResult`` (a skipped check says so itself)."""
    if getattr(result, "skipped", False):
        return "skip"
    return "pass" if result.passed else "fail"


def entry(result: Any, now: float | None = None) -> dict[str, Any]:
    """The record of one check's result."""
    failure = getattr(result, "failure", None)
    state = state_of(result)
    message = failure.invariant if failure is not None and state == "fail" else ""
    if state == "skip":
        message = str(result.skipped)  # why this machine could not check it
    return {
        "exercise": result.exercise,
        "state": state,
        "message": message,
        "time": time.time() if now is None else now,
    }


def record(result: Any, workspace: Path | None = None, cwd: Path | None = None) -> Path | None:
    """Append ``result`` to the learner's progress file when the check ran in a notebook
    inside their workspace; returns the file written, or None. Never raises for a file it
    cannot write."""
    from slotmap.exercises.build import learner_workspace

    workspace = learner_workspace() if workspace is None else workspace
    if not workspace.is_dir() or not _inside(workspace, cwd or Path.cwd()):
        return None
    path = workspace / PROGRESS_FILE
    item = entry(result)
    send(item)
    line = json.dumps(item, sort_keys=True) + "\n"
    try:
        # One write of one line in append mode: concurrent checks never interleave within it.
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line.encode())
        finally:
            os.close(descriptor)
    except OSError:
        return None
    return path


def send(item: dict[str, Any]) -> threading.Thread | None:
    """Queue ``item`` for the dashboard and send the queue from a thread, when the hub says
    where (``$SLOTMAP_RECORDS_URL``, ``$JUPYTERHUB_API_TOKEN``); returns the thread."""
    global _sender
    url, token = os.environ.get(RECORDS_URL_VARIABLE), os.environ.get(TOKEN_VARIABLE)
    if not url or not token:
        return None
    unsent.append(item)
    _sender = threading.Thread(target=deliver, args=(url, token), daemon=True)
    _sender.start()
    return _sender


def flush(timeout: float = 2 * POST_TIMEOUT) -> None:
    """Wait for the last send to end (a kernel about to stop, a test)."""
    if _sender is not None:
        _sender.join(timeout)


def deliver(url: str, token: str) -> None:
    """POST every unsent record to ``url``, oldest first, until one fails."""
    global last_failure
    # The dashboard is inside the hub's own network: never through a proxy of the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with _sending:
        while unsent:
            item = unsent[0]
            request = urllib.request.Request(
                url,
                data=json.dumps(item, sort_keys=True).encode(),
                headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
                method="POST",
            )
            try:
                opener.open(request, timeout=POST_TIMEOUT).close()
            except urllib.error.HTTPError as error:
                last_failure = f"{error.code} {error.reason}"
                if error.code >= 500:
                    return  # the dashboard's trouble: try again with the next record
                # Refused for good (its token's scope, its size, its shape): not sent again.
            except (OSError, ValueError) as error:  # URLError, timeouts, a malformed URL
                last_failure = str(error)
                return
            else:
                last_failure = ""
            unsent.popleft()


def read_records(workspace: Path) -> list[dict[str, Any]]:
    """Every well-formed record in a workspace's progress file, in the order written (a
    missing file is no records; a line that is not a record is skipped)."""
    try:
        text = (workspace / PROGRESS_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    records = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(item, dict)
            and isinstance(item.get("exercise"), str)
            and item.get("state") in STATES
            and isinstance(item.get("time"), int | float)
        ):
            item["message"] = str(item.get("message") or "")
            records.append(item)
    return records


def latest(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Exercise -> its most recent record."""
    last: dict[str, dict[str, Any]] = {}
    for item in sorted(records, key=lambda r: r["time"]):
        last[item["exercise"]] = item
    return last
