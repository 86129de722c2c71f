"""The progress records a learner's checks send to the room's dashboard, and the dashboard's
store of them: the dashboard's view of a room whose homes it cannot read (Kubernetes: each
home is a volume of the learner's pod only).

A check that runs under a hub with ``$SLOTMAP_RECORDS_URL`` set also POSTs its record there
(``slotmap.exercises.progress``) with the learner's server token (``$JUPYTERHUB_API_TOKEN``).
The dashboard's ``{prefix}api/records`` asks the hub whose token it is and files the record
under that user's name only (a name in the body is ignored), when the token holds
``RECORDS_SCOPE`` for that user, the body is at most ``BODY_CAP`` bytes and it is a record a
check could have written (``parse_record``, the same test as for the records read from
files). The store is a folder of the service's own (``$SLOTMAP_DASHBOARD_STORE``, 0700), one
file per learner, appended to; a file past twice ``PROGRESS_CAP`` keeps its last
``PROGRESS_CAP`` bytes, so a learner who floods it fills their own file only, and the room's
learners are the hub's users.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.parse
from pathlib import Path
from typing import Any

from slotmap.exercises.progress import STATES
from slotmap.i18n import _

STORE_VARIABLE = "SLOTMAP_DASHBOARD_STORE"
# The hub's custom scope a learner's server token holds to post their own records.
RECORDS_SCOPE = "custom:slotmap-records:write"
RECORDS_PATH = "api/records"  # under the dashboard's prefix
CHECK_ID = re.compile(r"\d\d\.\w{1,60}")
# A room's worth of checks writes a few hundred bytes each: a larger file is read from its end.
PROGRESS_CAP = 1 << 20
MESSAGE_CAP = 400  # characters of a failure's message shown
FUTURE_SLACK = 24 * 3600  # seconds a record's time may lie ahead of the service's clock
# One record is a few hundred bytes; its message, cut at MESSAGE_CAP, can be escaped 6-fold.
BODY_CAP = 8 * 1024
_NAME_FILE_CAP = 200  # characters of a store file's name kept readable; longer: a digest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a record may hold")


def parse_record(line: str, now: float) -> dict[str, Any] | None:
    """The record one line holds, or None when it is not one a check could have written:
    JSON of an object with an exercise id, a state, a message and a finite time in range."""
    try:
        item = json.loads(line, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # RecursionError: deeply nested JSON
        return None
    if not isinstance(item, dict):
        return None
    exercise, state, moment = item.get("exercise"), item.get("state"), item.get("time")
    message = item.get("message")
    if (
        not isinstance(exercise, str)
        or not CHECK_ID.fullmatch(exercise)
        or state not in STATES
        or not isinstance(message, str | None)
        or isinstance(moment, bool)
        or not isinstance(moment, int | float)
        or not 0 < moment <= now + FUTURE_SLACK  # false for NaN and the infinities too
    ):
        return None
    return {
        "exercise": exercise,
        "state": state,
        "message": (message or "")[:MESSAGE_CAP],
        "time": float(moment),
    }


class Refused(Exception):
    """A record the store does not take: ``status`` is the HTTP answer (403, 400, 413)."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


class Store:
    """The dashboard's own folder of posted records, one file per learner."""

    def __init__(self, folder: Path | str):
        self.folder = Path(folder)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)  # the learners' records are the instructors' to read

    @staticmethod
    def file_name(learner: str) -> str:
        """The file of ``learner``'s records: their name, quoted (no "/", never "." or ".."),
        or a digest of a name too long for a file system."""
        quoted = urllib.parse.quote(learner, safe="")
        if len(quoted) > _NAME_FILE_CAP:
            quoted = "sha256-" + hashlib.sha256(learner.encode()).hexdigest()
        return f"{quoted}.jsonl"

    def append(self, learner: str, body: bytes, now: float) -> dict[str, Any]:
        """File the record ``body`` holds under ``learner`` (the token's user, never a name
        from the body); returns the record as filed. Raises ``Refused`` (400, 413)."""
        if len(body) > BODY_CAP:
            raise Refused(413, _("a record is at most {cap} bytes").format(cap=BODY_CAP))
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise Refused(400, _("a record is UTF-8 text")) from None
        item = parse_record(text, now)
        if item is None:
            raise Refused(400, _("not a record a check writes"))
        line = (json.dumps(item, sort_keys=True) + "\n").encode()
        path = self.folder / self.file_name(learner)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        descriptor = os.open(path, flags, 0o600)
        try:
            os.write(descriptor, line)
            size = os.fstat(descriptor).st_size
        finally:
            os.close(descriptor)
        if size > 2 * PROGRESS_CAP:
            self._keep_the_end(path)
        return item

    @staticmethod
    def _keep_the_end(path: Path) -> None:
        """Cut a learner's file to its last ``PROGRESS_CAP`` bytes, from a line's start."""
        with open(path, "rb") as records:
            records.seek(-PROGRESS_CAP, os.SEEK_END)
            kept = records.read().partition(b"\n")[2]
        cut = path.with_name(path.name + ".cut")
        cut.write_bytes(kept)
        os.chmod(cut, 0o600)
        os.replace(cut, path)  # one step: a reader sees the old file or the new one


def poster(user: dict[str, Any] | None) -> str:
    """The learner a token's user model (the hub's answer for it) may post records for: the
    model's own name when the token holds ``RECORDS_SCOPE`` for that user. Raises
    ``Refused`` (403) for no user, a service, or a token without the scope."""
    from jupyterhub.services.auth import check_scopes

    if not user or user.get("kind", "user") != "user" or not isinstance(user.get("name"), str):
        raise Refused(403, _("records come from a learner's server token"))
    name = user["name"]
    if not check_scopes(f"{RECORDS_SCOPE}!user={name}", set(user.get("scopes") or ())):
        raise Refused(
            403, _("this token may not post records ({scope})").format(scope=RECORDS_SCOPE)
        )
    return name
