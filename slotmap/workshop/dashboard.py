"""The instructor's live view of the room: a JupyterHub service (``slotmap workshop dashboard``).

It shows a learners x exercises table, read from each learner's progress records
(``slotmap.exercises.progress``): pass, fail with the invariant it broke, skip, or not tried
yet; how many learners are at each state of each exercise; which learner has been failing one
exercise for more than 10 minutes (with a link to that failure's row of ``workshop/stuck.md``,
served at ``{prefix}stuck``); and when each learner was last active, to the minute.
``{prefix}`` serves the page (it reloads itself; ``?track=3h``, the default, ``day`` or
``all`` picks the exercises of a track of ``slotmap.workshop.track``), ``{prefix}api/progress``
the same table as JSON (every exercise unless ``?track=`` says otherwise).

A progress file is the learner's own: the service reads it as a regular file only (never
through a link, never blocking on a FIFO), at most its last ``PROGRESS_CAP`` bytes, and skips
each record it cannot parse or whose values are out of range, showing the learner's row as
unreadable in part; one learner's file never fails the room.

The hub's OAuth protects it: the hub lets only holders of ``access:services!service=<name>``
in (its admins: ``workshop/jupyterhub_config.py`` grants it to no one else), and each request
is checked once more against the hub's own record of the user: an instructor who is not an
admin gets 403. The hub starts it with ``$JUPYTERHUB_*`` set. It reads the learners' progress
files through ``$SLOTMAP_HUB_WORKSPACES``, a path with ``{username}`` in it, and the records
their checks post to ``{prefix}api/records`` (``slotmap.workshop.records``: a learner's server
token files its own records only) into the folder ``$SLOTMAP_DASHBOARD_STORE``; either or
both (Kubernetes: the posted records only).

Every word of the pages is in the instructor's language: ``?lang=zh`` or ``?lang=en`` on the
page's address (the links keep it), else the service's own (``$SLOTMAP_LANG``, as
``slotmap.i18n`` reads it). The JSON API stays English: tools read it.
"""

from __future__ import annotations

import errno
import html
import json
import os
import re
import stat
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Any

from slotmap import i18n
from slotmap.exercises.progress import PROGRESS_FILE, STATES
from slotmap.workshop.records import (
    BODY_CAP,
    PROGRESS_CAP,
    RECORDS_PATH,
    STORE_VARIABLE,
    Refused,
    Store,
    parse_record,
    poster,
)
from slotmap.workshop.records import CHECK_ID as _CHECK_ID
from slotmap.workshop.track import TRACKS, exercise_lessons, track

WORKSPACES_VARIABLE = "SLOTMAP_HUB_WORKSPACES"
REFRESH_SECONDS = 5
_CHECK_CALL = re.compile(r"""check\(\s*\\?["'](\d\d\.\w+)\\?["']""")
STUCK_SECONDS = 10 * 60
DEFAULT_TRACK = TRACKS[0].name

# The language of the page being made (None: the service's); one request's, not the process's.
_speaking: ContextVar[str | None] = ContextVar("dashboard_language", default=None)


@contextmanager
def speaking(lang: str | None) -> Iterator[str]:
    """Say everything in ``lang`` (``zh``, ``en``, ...; None: the service's language) inside
    the block; yields the normalized name. Raises ValueError for a language the course lacks."""
    chosen = i18n.language() if lang is None else i18n.normalize(lang)
    token = _speaking.set(chosen)
    try:
        yield chosen
    finally:
        _speaking.reset(token)


def _(message: str) -> str:
    """``message`` in the language of the page being made (``speaking``)."""
    return i18n.tr(message, _speaking.get())


def ngettext(singular: str, plural: str, n: int) -> str:
    """The singular or plural form for ``n``, in the language of the page being made."""
    return i18n.ngettext(singular, plural, n, _speaking.get())


def exercise_ids(course: Path) -> list[str]:
    """Every exercise the course's exercise notebooks check, in lesson order."""
    found: dict[str, None] = {}
    for notebook in sorted((course / "exercises").glob("[0-9][0-9]_*.ipynb")):
        for match in _CHECK_CALL.finditer(notebook.read_text(encoding="utf-8")):
            found.setdefault(match.group(1))
    return list(found)


def track_exercises(exercises: list[str], name: str) -> list[str]:
    """The exercises the room does in track ``name`` ("all": every one)."""
    if name == "all":
        return exercises
    lessons = set(exercise_lessons(track(name)))
    return [exercise for exercise in exercises if exercise[:2] in lessons]


def _parse_time(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Unreadable(Exception):
    """A progress file the service will not read (a FIFO, a link, a device, ...)."""


def _progress_bytes(workspace: Path, file_name: str) -> tuple[bytes, bool]:
    """The last ``PROGRESS_CAP`` bytes of a workspace's progress file, and whether that is
    less than all of it; no bytes when there is no file yet. Opens neither the workspace nor
    the file through a symbolic link, and reads only a regular file, without blocking."""
    try:
        folder = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return b"", False
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Unreadable(_("its workspace is a link or not a folder")) from None
        raise Unreadable(
            _("its workspace cannot be opened ({reason})").format(reason=error.strerror)
        ) from None
    try:
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        descriptor = os.open(file_name, flags, dir_fd=folder)
    except FileNotFoundError:
        return b"", False
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Unreadable(_("its progress file is a link")) from None
        raise Unreadable(
            _("its progress file cannot be opened ({reason})").format(reason=error.strerror)
        ) from None
    finally:
        os.close(folder)
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(_("its progress file is not a regular file"))
        start = max(0, info.st_size - PROGRESS_CAP)
        chunks, size = [], 0
        while size < PROGRESS_CAP:
            chunk = os.pread(descriptor, PROGRESS_CAP - size, start + size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise Unreadable(
            _("its progress file cannot be read ({reason})").format(reason=error.strerror)
        ) from None
    finally:
        os.close(descriptor)
    data = b"".join(chunks)
    if start:
        data = data.partition(b"\n")[2]  # the first line is cut
    return data, start > 0


def read_progress(
    workspace: Path, now: float, file_name: str = PROGRESS_FILE
) -> tuple[list[dict[str, Any]], str]:
    """The well-formed records of a workspace's progress file (or of ``file_name`` in a
    folder: the store's), in the order written, and what could not be read of it ("" when
    everything could)."""
    try:
        data, cut = _progress_bytes(workspace, file_name)
    except Unreadable as error:
        return [], str(error)
    records, skipped = [], 0
    for line in data.decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        item = parse_record(line, now)
        if item is None:
            skipped += 1
        else:
            records.append(item)
    problems = []
    if skipped:
        many = ngettext("{n} record skipped", "{n} records skipped", skipped)
        problems.append(many.format(n=skipped))
    if cut:
        problems.append(_("only its last {kib} KiB read").format(kib=PROGRESS_CAP // 1024))
    return records, _("; ").join(problems)


def _stuck(
    records: list[dict[str, Any]], exercises: list[str], now: float
) -> dict[str, Any] | None:
    """The exercise a learner has been failing for more than ``STUCK_SECONDS`` (their latest
    check, failing, on an exercise they have not passed since their first failure of it in
    this run of failures), with how long and the message; else None."""
    if not records:
        return None
    ordered = sorted(records, key=lambda r: r["time"])
    last = ordered[-1]
    if last["state"] != "fail" or last["exercise"] not in exercises:
        return None
    since = last["time"]
    for item in reversed(ordered):
        if item["exercise"] != last["exercise"]:
            continue
        if item["state"] == "pass":
            break
        since = item["time"]
    if now - since <= STUCK_SECONDS:
        return None
    return {
        "exercise": last["exercise"],
        "minutes": int((now - since) // 60),
        "message": last["message"],
    }


def room(
    users: list[dict[str, Any]],
    workspace_of: Callable[[str], Path] | None,
    exercises: list[str],
    now: float | None = None,
    lang: str | None = None,
    store: Path | None = None,
) -> dict[str, Any]:
    """The table: one row per learner (the hub's non-admin users), one cell per exercise
    (``{"state": "pass"|"fail"|"skip"|"none", "message"}``), the seconds since the learner
    was last active (their server's activity or their last check, the later), what of their
    progress file could not be read (said in ``lang``, as ``speaking``), and the exercise they
    are stuck on (or None); then, per exercise, how many learners are at each state.
    The records are those of the learner's progress file (``workspace_of``: its folder) and
    those they posted (``store``: the folder of ``slotmap.workshop.records.Store``), either
    or both; None: not read."""
    with speaking(lang):
        return _room(users, workspace_of, exercises, time.time() if now is None else now, store)


def _records_of(
    name: str, workspace_of: Callable[[str], Path] | None, store: Path | None, now: float
) -> tuple[list[dict[str, Any]], str]:
    """A learner's records from their progress file and the store, and what was unreadable."""
    records, problems = [], []
    if workspace_of is not None:
        found, unreadable = read_progress(workspace_of(name), now)
        records += found
        problems += [unreadable] if unreadable else []
    if store is not None:
        found, unreadable = read_progress(store, now, Store.file_name(name))
        records += found
        problems += [_("posted: {why}").format(why=unreadable)] if unreadable else []
    return records, _("; ").join(problems)


def _room(
    users: list[dict[str, Any]],
    workspace_of: Callable[[str], Path] | None,
    exercises: list[str],
    now: float,
    store: Path | None,
) -> dict[str, Any]:
    rows = []
    for user in sorted(users, key=lambda u: u["name"]):
        if user.get("admin"):
            continue
        records, unreadable = _records_of(user["name"], workspace_of, store, now)
        last = {item["exercise"]: item for item in sorted(records, key=lambda r: r["time"])}
        cells = {}
        for exercise in exercises:
            item = last.get(exercise)
            cells[exercise] = (
                {"state": item["state"], "message": item["message"]}
                if item
                else {"state": "none", "message": ""}
            )
        times = [t for t in [_parse_time(user.get("last_activity"))] if t is not None]
        times += [item["time"] for item in records]
        idle = max(0, round(now - max(times))) if times else None
        rows.append(
            {
                "learner": user["name"],
                "idle_seconds": idle,
                "cells": cells,
                "unreadable": unreadable,
                "stuck": _stuck(records, exercises, now),
            }
        )
    totals = {
        exercise: {
            state: sum(row["cells"][exercise]["state"] == state for row in rows)
            for state in (*STATES, "none")
        }
        for exercise in exercises
    }
    return {"exercises": list(exercises), "learners": rows, "totals": totals}


def _ago(seconds: int | None) -> str:
    """How long ago, to the minute."""
    if seconds is None:
        return _("never")
    minutes = seconds // 60
    if minutes < 1:
        return _("this minute")
    if minutes < 60:
        return _("{minutes} min ago").format(minutes=minutes)
    return _("{hours} h {minutes} min ago").format(
        hours=minutes // 60, minutes=f"{minutes % 60:02d}"
    )


SYMBOLS = {"pass": i18n.N_("pass"), "fail": i18n.N_("FAIL"), "skip": i18n.N_("skip"), "none": "-"}
COLOURS = {"pass": "#d9f2df", "fail": "#fbdcdc", "skip": "#eeeeee", "none": "#ffffff"}
STUCK_COLOUR = "#ffd27f"


def _stuck_link(stuck: dict[str, Any], rows: list[dict[str, str]], query: str) -> str:
    anchor = stuck_anchor(rows, stuck["exercise"], stuck["message"])
    target = f"stuck{query}#{urllib.parse.quote(anchor)}" if anchor else f"stuck{query}"
    text = _("stuck on {exercise} for {minutes} min: what to say").format(
        exercise=html.escape(stuck["exercise"]), minutes=stuck["minutes"]
    )
    return f'<a href="{html.escape(target)}">{text}</a>'


def _lang_query(lang: str | None, more: str = "") -> str:
    """The query that keeps the page's language on a link (and ``more``, ``a=b`` pairs)."""
    pairs = [more] if more else []
    if lang is not None:
        pairs.append(f"lang={urllib.parse.quote(lang)}")
    return "?" + "&".join(pairs) if pairs else ""


def render(
    table: dict[str, Any],
    track_name: str = "all",
    hints: list[dict[str, str]] | None = None,
    lang: str | None = None,
) -> str:
    """The table as a page that reloads itself every few seconds (``hints``: stuck.md's
    rows, for the links of learners who are stuck), in ``lang`` (None: the service's
    language; see ``speaking``), its links keeping ``lang``."""
    with speaking(lang):
        return _render(table, track_name, hints, lang)


def _render(
    table: dict[str, Any], track_name: str, hints: list[dict[str, str]] | None, lang: str | None
) -> str:
    exercises = table["exercises"]
    head = "".join(f"<th>{html.escape(e)}</th>" for e in exercises)
    body = []
    for row in table["learners"]:
        cells = []
        for exercise in exercises:
            cell = row["cells"].get(exercise, {"state": "none", "message": ""})
            text = _(SYMBOLS[cell["state"]])
            if cell["message"]:
                text += f"<br><small>{html.escape(cell['message'])}</small>"
            stuck = row.get("stuck")
            colour = COLOURS[cell["state"]]
            if stuck and stuck["exercise"] == exercise:
                colour = STUCK_COLOUR
            cells.append(f'<td style="background:{colour}">{text}</td>')
        passed = sum(row["cells"][e]["state"] == "pass" for e in exercises)
        notes = []
        if row.get("stuck"):
            notes.append(_stuck_link(row["stuck"], hints or [], _lang_query(lang)))
        if row.get("unreadable"):
            notes.append(_("unreadable: {why}").format(why=html.escape(row["unreadable"])))
        learner = html.escape(row["learner"])
        if notes:
            learner += "".join(f"<br><small>{note}</small>" for note in notes)
        style = f' style="background:{STUCK_COLOUR}"' if row.get("stuck") else ""
        body.append(
            f"<tr><th{style}>{learner}</th><td>{_ago(row['idle_seconds'])}</td>"
            f"<td>{passed}/{len(exercises)}</td>{''.join(cells)}</tr>"
        )
    totals = table.get("totals", {})
    foot = "".join(
        "<td><small>"
        + ", ".join(
            f"{totals[e][state]} {_(SYMBOLS[state])}" for state in (*STATES, "none") if e in totals
        )
        + "</small></td>"
        for e in exercises
    )
    titles = [*((t.name, _(t.title)) for t in TRACKS), ("all", _("all exercises"))]
    choices = " · ".join(
        f"<b>{html.escape(title)}</b>"
        if name == track_name
        else f'<a href="{html.escape(_lang_query(lang, "track=" + urllib.parse.quote(name)))}">'
        f"{html.escape(title)}</a>"
        for name, title in titles
    )
    stuck = html.escape("stuck" + _lang_query(lang))
    page_lang = "zh-CN" if _speaking.get() == i18n.CHINESE else "en"
    title, heading, everyone = _("slotmap workshop: the room"), _("The room"), _("the room")
    columns = "".join(f"<th>{name}</th>" for name in (_("learner"), _("last active"), _("passed")))
    return (
        f'<!doctype html><html lang="{page_lang}"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
        f"<title>{title}</title><style>"
        "body{font-family:sans-serif} td,th{border:1px solid #ccc;padding:4px;"
        "vertical-align:top;max-width:16em} table{border-collapse:collapse}</style></head>"
        f"<body><h1>{heading}</h1><p>"
        + _(
            "A progress view: each learner's own records of the checks they ran (a learner "
            "can write them). Confirm with <code>slotmap grade</code>."
        )
        + "</p><p>"
        + _(
            "Track: {choices}. A learner failing one exercise for more than {minutes} minutes "
            'is highlighted, with a link to <a href="{stuck}">what to say</a>.'
        ).format(choices=choices, minutes=STUCK_SECONDS // 60, stuck=stuck)
        + f"</p><table><tr>{columns}{head}</tr>{''.join(body)}"
        + f"<tr><th>{everyone}</th><td></td><td></td>{foot}</tr></table></body></html>"
    )


def stuck_rows(markdown: str) -> list[dict[str, str]]:
    """The rows of ``workshop/stuck.md``'s table: exercise, symptom, message, hint."""
    rows = []
    for line in markdown.splitlines():
        if not line.startswith("| "):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and _CHECK_ID.fullmatch(cells[0]):
            rows.append(dict(zip(("exercise", "symptom", "message", "hint"), cells, strict=True)))
    return rows


def _shape(message: str) -> str:
    """A message with its numbers and addresses masked, as stuck.md writes it."""
    text = re.sub(r"0x[0-9a-f]+", "0x…", " ".join(message.split()))
    return re.sub(r"\d+", "#", text)


def stuck_anchor(rows: list[dict[str, str]], exercise: str, message: str) -> str:
    """The anchor of stuck.md's row for this failure: the exercise's row whose message starts
    the same way as the learner's for longest (20 characters at least), else the exercise's
    first row; "" when stuck.md has no row for the exercise."""
    best, best_length = "", 19
    first = ""
    shape = _shape(message)
    for index, row in enumerate(rows):
        if row["exercise"] != exercise:
            continue
        anchor = f"stuck-{exercise}-{index}"
        first = first or anchor
        other = _shape(row["message"])
        common = len(os.path.commonprefix([shape, other]))
        if common > best_length:
            best, best_length = anchor, common
    return best or first


def render_stuck(rows: list[dict[str, str]], lang: str | None = None) -> str:
    """stuck.md's table as a page, one anchor per row (``stuck-<exercise>-<row>``), its own
    words in ``lang`` (``speaking``; stuck.md's rows as written)."""
    with speaking(lang) as chosen:
        return _render_stuck(rows, "zh-CN" if chosen == i18n.CHINESE else "en")


def _render_stuck(rows: list[dict[str, str]], page_lang: str) -> str:
    body = "".join(
        f'<tr id="stuck-{html.escape(row["exercise"])}-{index}"><th>'
        f"{html.escape(row['exercise'])}</th><td>{html.escape(row['symptom'])}</td>"
        f"<td>{html.escape(row['message'])}</td><td>{html.escape(row['hint'])}</td></tr>"
        for index, row in enumerate(rows)
    )
    title = _("When a learner is stuck")
    names = (_("exercise"), _("the learner probably wrote"), _("the check says"), _("next hint"))
    columns = "".join(f"<th>{name}</th>" for name in names)
    return (
        f'<!doctype html><html lang="{page_lang}"><head><meta charset="utf-8"><title>{title}'
        "</title><style>body{font-family:sans-serif} td,th{border:1px solid #ccc;"
        "padding:4px;vertical-align:top} table{border-collapse:collapse} tr:target"
        f"{{background:#ffd27f}}</style></head><body><h1>{title}</h1><p>"
        + _("From <code>workshop/stuck.md</code>: give the hint before the solution.")
        + f"</p><table><tr>{columns}</tr>{body}</table></body></html>"
    )


def make_app(course: Path, workspaces: str | None, store: Path | None = None) -> Any:
    """The tornado application of the service (imports JupyterHub's service auth): the room
    from the progress files of ``workspaces`` (a path with ``{username}``) and the records
    posted to ``{prefix}api/records`` into ``store``, either or both (None: off)."""
    from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
    from jupyterhub.utils import url_path_join
    from tornado import web
    from tornado.httpclient import AsyncHTTPClient, HTTPRequest

    auth = HubOAuth(cache_max_age=5)
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
    exercises = exercise_ids(course)
    stuck_md = course / "workshop" / "stuck.md"
    if not stuck_md.is_file():  # a course source without the workshop kit: the checkout's
        from slotmap.lab import CHECKOUT

        stuck_md = CHECKOUT / "workshop" / "stuck.md"
    stuck = stuck_rows(stuck_md.read_text(encoding="utf-8")) if stuck_md.is_file() else []

    def workspace(name: str) -> Path:
        return Path(str(workspaces).format(username=name))

    workspace_of = workspace if workspaces else None
    posted = Store(store) if store is not None else None

    async def hub_get(path: str) -> Any:
        request = HTTPRequest(
            url_path_join(auth.api_url, path),
            headers={"Authorization": f"token {auth.api_token}"},
            request_timeout=10,
        )
        response = await AsyncHTTPClient().fetch(request)
        return json.loads(response.body)

    class Base(HubOAuthenticated, web.RequestHandler):
        hub_auth = auth

        async def admitted(self) -> None:
            name = self.current_user["name"]
            # Scopes let the user in; the hub's own record of them must also say admin.
            model = await hub_get(f"/users/{urllib.parse.quote(name, safe='')}")
            if not model.get("admin"):
                raise web.HTTPError(403, _("the room is for the workshop's instructors"))

        default_track = DEFAULT_TRACK

        def track_name(self) -> str:
            name = self.get_argument("track", self.default_track)
            if name != "all" and name not in {t.name for t in TRACKS}:
                raise web.HTTPError(400, _("no such track"))
            return name

        def lang(self) -> str | None:
            """The page's language: ``?lang=``, else None (the service's)."""
            lang = self.get_argument("lang", None)
            if lang is not None:
                try:
                    i18n.normalize(lang)
                except ValueError:
                    raise web.HTTPError(400, _("no such language")) from None
            return lang

        async def table(self, lang: str | None) -> dict[str, Any]:
            await self.admitted()
            shown = track_exercises(exercises, self.track_name())
            users = await hub_get("/users")
            folder = posted.folder if posted else None
            return room(users, workspace_of, shown, lang=lang, store=folder)

    class Page(Base):
        @web.authenticated
        async def get(self) -> None:
            lang = self.lang()
            table = await self.table(lang)
            self.finish(render(table, self.track_name(), stuck, lang))

    class Api(Base):
        default_track = "all"  # what `slotmap workshop confirm` compares: every exercise

        @web.authenticated
        async def get(self) -> None:
            self.set_header("Content-Type", "application/json")
            table = await self.table(i18n.ENGLISH)  # for tools: `slotmap workshop confirm`
            self.finish(json.dumps(table, allow_nan=False))

    class Stuck(Base):
        @web.authenticated
        async def get(self) -> None:
            lang = self.lang()
            await self.admitted()
            self.finish(render_stuck(stuck, lang))

    class Records(web.RequestHandler):
        """A learner's check posts its record here with their server token."""

        async def post(self) -> None:
            if posted is None:
                raise web.HTTPError(404)
            match = auth.auth_header_pat.fullmatch(self.request.headers.get("Authorization", ""))
            # The hub says whose token it is (and its scopes): the name in the body is not read.
            user = await auth.user_for_token(match.group(1), sync=False) if match else None
            try:
                name = poster(user)
                posted.append(name, self.request.body, time.time())
            except Refused as refused:
                raise web.HTTPError(refused.status, str(refused)) from None
            self.set_status(204)

    class Callback(HubOAuthCallbackHandler):
        # The same HubOAuth as the pages: it holds the login's state (PKCE) in memory.
        hub_auth = auth

    return web.Application(
        [
            (prefix, Page),
            (url_path_join(prefix, "api/progress"), Api),
            (url_path_join(prefix, "stuck"), Stuck),
            (url_path_join(prefix, RECORDS_PATH), Records),
            (url_path_join(prefix, "oauth_callback"), Callback),
        ],
        cookie_secret=os.urandom(32),
    )


def serve(course: Path | None = None) -> int:
    """Run the service where the hub says (``$JUPYTERHUB_SERVICE_URL``) until stopped."""
    from tornado import ioloop

    from slotmap.workshop import course_source

    workspaces = os.environ.get(WORKSPACES_VARIABLE) or None
    store = os.environ.get(STORE_VARIABLE) or None
    if (workspaces and "{username}" not in workspaces) or not (workspaces or store):
        print(
            _(
                "slotmap workshop dashboard: set ${variable} (with {{username}}), "
                "${store} (a folder for the records learners post), or both"
            ).format(variable=WORKSPACES_VARIABLE, store=STORE_VARIABLE)
        )
        return 2
    url = urllib.parse.urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:0"))
    app = make_app(course or course_source(), workspaces, Path(store) if store else None)
    # A body past a record's cap is refused before it is read to its end (GETs have none).
    app.listen(url.port, url.hostname, max_body_size=4 * BODY_CAP)
    ioloop.IOLoop.current().start()
    return 0


def disagreements(table: dict[str, Any], grades: list[dict[str, Any]]) -> list[str]:
    """Where the room's progress view says pass and ``slotmap grade`` (its ``--json`` over a
    folder holding one subfolder per learner) does not: one line each; empty when the view
    holds up."""
    graded: dict[tuple[str, str], Any] = {}
    for grade in grades:
        learner = Path(grade["notebook"]).parts[0]
        for exercise, result in grade.get("results", {}).items():
            if graded.get((learner, exercise)) not in ("PASS", True):
                graded[(learner, exercise)] = result
    lines = []
    for row in table["learners"]:
        for exercise, cell in row["cells"].items():
            result = graded.get((row["learner"], exercise), _("not graded"))
            if cell["state"] == "pass" and result not in ("PASS", True):
                lines.append(
                    _(
                        "{learner} {exercise}: the room says pass, slotmap grade says {result}"
                    ).format(learner=row["learner"], exercise=exercise, result=result)
                )
    return lines


def confirm(room_path: Path, grades_path: Path, collected: Path | None = None) -> int:
    """``slotmap workshop confirm``: print the disagreements, and with ``collected`` (the
    folder ``slotmap workshop collect`` filled) every notebook that is not the learner's own;
    1 if there are any."""
    grades = json.loads(grades_path.read_text(encoding="utf-8"))
    lines = disagreements(json.loads(room_path.read_text(encoding="utf-8")), grades)
    if collected is not None:
        from slotmap.workshop.collect import problems

        lines += problems(collected, grades)
    print("\n".join(lines) or _("every pass in the room is a pass under slotmap grade"))
    return 1 if lines else 0
