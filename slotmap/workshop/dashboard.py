"""The instructor's live view of the room: a JupyterHub service (``slotmap workshop dashboard``).

It shows a learners x exercises table, read from each learner's progress records
(``slotmap.exercises.progress``): pass, fail with the invariant it broke, skip, or not tried
yet, and how long ago each learner was last active. ``{prefix}`` serves the page (it reloads
itself), ``{prefix}api/progress`` the same table as JSON.

The hub's OAuth protects it: the hub lets only holders of ``access:services!service=<name>``
in (its admins: ``workshop/jupyterhub_config.py`` grants it to no one else), and each request
is checked once more against the hub's own record of the user: an instructor who is not an
admin gets 403. The hub starts it with ``$JUPYTERHUB_*`` set; the learners' workspaces are
found through ``$SLOTMAP_HUB_WORKSPACES``, a path with ``{username}`` in it.
"""

from __future__ import annotations

import html
import json
import os
import re
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slotmap.exercises.progress import latest, read_records

WORKSPACES_VARIABLE = "SLOTMAP_HUB_WORKSPACES"
REFRESH_SECONDS = 5
_CHECK_CALL = re.compile(r"""check\(\s*\\?["'](\d\d\.\w+)\\?["']""")


def exercise_ids(course: Path) -> list[str]:
    """Every exercise the course's exercise notebooks check, in lesson order."""
    found: dict[str, None] = {}
    for notebook in sorted((course / "exercises").glob("[0-9][0-9]_*.ipynb")):
        for match in _CHECK_CALL.finditer(notebook.read_text(encoding="utf-8")):
            found.setdefault(match.group(1))
    return list(found)


def _parse_time(stamp: str | None) -> float | None:
    if not stamp:
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def room(
    users: list[dict[str, Any]],
    workspace_of: Callable[[str], Path],
    exercises: list[str],
    now: float | None = None,
) -> dict[str, Any]:
    """The table: one row per learner (the hub's non-admin users), one cell per exercise
    (``{"state": "pass"|"fail"|"skip"|"none", "message"}``), and the seconds since the
    learner was last active (their server's activity or their last check, the later)."""
    now = time.time() if now is None else now
    rows = []
    for user in sorted(users, key=lambda u: u["name"]):
        if user.get("admin"):
            continue
        last = latest(read_records(workspace_of(user["name"])))
        cells = {}
        for exercise in [*exercises, *sorted(set(last) - set(exercises))]:
            item = last.get(exercise)
            cells[exercise] = (
                {"state": item["state"], "message": item["message"]}
                if item
                else {"state": "none", "message": ""}
            )
        times = [t for t in [_parse_time(user.get("last_activity"))] if t is not None]
        times += [item["time"] for item in last.values()]
        idle = round(now - max(times)) if times else None
        rows.append({"learner": user["name"], "idle_seconds": idle, "cells": cells})
    columns = list(dict.fromkeys([e for row in rows for e in row["cells"]] or exercises))
    return {"exercises": columns, "learners": rows}


def _ago(seconds: int | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


SYMBOLS = {"pass": "pass", "fail": "FAIL", "skip": "skip", "none": "-"}
COLOURS = {"pass": "#d9f2df", "fail": "#fbdcdc", "skip": "#eeeeee", "none": "#ffffff"}


def render(table: dict[str, Any]) -> str:
    """The table as a page that reloads itself every few seconds."""
    head = "".join(f"<th>{html.escape(e)}</th>" for e in table["exercises"])
    body = []
    for row in table["learners"]:
        cells = []
        for exercise in table["exercises"]:
            cell = row["cells"].get(exercise, {"state": "none", "message": ""})
            text = SYMBOLS[cell["state"]]
            if cell["message"]:
                text += f"<br><small>{html.escape(cell['message'])}</small>"
            cells.append(f'<td style="background:{COLOURS[cell["state"]]}">{text}</td>')
        passed = sum(cell["state"] == "pass" for cell in row["cells"].values())
        body.append(
            f"<tr><th>{html.escape(row['learner'])}</th><td>{_ago(row['idle_seconds'])}</td>"
            f"<td>{passed}/{len(table['exercises'])}</td>{''.join(cells)}</tr>"
        )
    return (
        f'<!doctype html><html><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
        "<title>slotmap workshop: the room</title><style>"
        "body{font-family:sans-serif} td,th{border:1px solid #ccc;padding:4px;"
        "vertical-align:top;max-width:16em} table{border-collapse:collapse}</style></head>"
        "<body><h1>The room</h1><p>A progress view: each learner's own records of the checks "
        "they ran (a learner can write them). Confirm with <code>slotmap grade</code>.</p>"
        "<table><tr><th>learner</th><th>last active</th><th>passed</th>"
        f"{head}</tr>{''.join(body)}</table>"
        "</body></html>"
    )


def make_app(course: Path, workspaces: str) -> Any:
    """The tornado application of the service (imports JupyterHub's service auth)."""
    from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
    from jupyterhub.utils import url_path_join
    from tornado import web
    from tornado.httpclient import AsyncHTTPClient, HTTPRequest

    auth = HubOAuth(cache_max_age=5)
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
    exercises = exercise_ids(course)

    def workspace_of(name: str) -> Path:
        return Path(workspaces.format(username=name))

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

        async def table(self) -> dict[str, Any]:
            name = self.current_user["name"]
            # Scopes let the user in; the hub's own record of them must also say admin.
            model = await hub_get(f"/users/{urllib.parse.quote(name, safe='')}")
            if not model.get("admin"):
                raise web.HTTPError(403, "the room is for the workshop's instructors")
            return room(await hub_get("/users"), workspace_of, exercises)

    class Page(Base):
        @web.authenticated
        async def get(self) -> None:
            self.finish(render(await self.table()))

    class Api(Base):
        @web.authenticated
        async def get(self) -> None:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(await self.table()))

    class Callback(HubOAuthCallbackHandler):
        # The same HubOAuth as the pages: it holds the login's state (PKCE) in memory.
        hub_auth = auth

    return web.Application(
        [
            (prefix, Page),
            (url_path_join(prefix, "api/progress"), Api),
            (url_path_join(prefix, "oauth_callback"), Callback),
        ],
        cookie_secret=os.urandom(32),
    )


def serve(course: Path | None = None) -> int:
    """Run the service where the hub says (``$JUPYTERHUB_SERVICE_URL``) until stopped."""
    from tornado import ioloop

    from slotmap.workshop import course_source

    workspaces = os.environ.get(WORKSPACES_VARIABLE)
    if not workspaces or "{username}" not in workspaces:
        print(f"slotmap workshop dashboard: set ${WORKSPACES_VARIABLE} (with {{username}})")
        return 2
    url = urllib.parse.urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:0"))
    app = make_app(course or course_source(), workspaces)
    app.listen(url.port, url.hostname)
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
            result = graded.get((row["learner"], exercise), "not graded")
            if cell["state"] == "pass" and result not in ("PASS", True):
                lines.append(
                    f"{row['learner']} {exercise}: the room says pass, slotmap grade says {result}"
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
    print("\n".join(lines) or "every pass in the room is a pass under slotmap grade")
    return 1 if lines else 0
