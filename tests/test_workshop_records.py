"""Records posted to the room's dashboard, without a hub: the store files a record under the
token's user only, takes only what a check could have written (the same test as for the files),
caps a body and a learner's file; a token without the scope or of a service is refused; the
room shows posted records as it shows files. The learner's side posts each record with its
token from a thread, never slowing or failing the check, and keeps what it could not send.
tests/test_workshop_hub.py posts from real learners' kernels to a real hub's dashboard."""

from __future__ import annotations

import json
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from slotmap.exercises import progress
from slotmap.workshop import records
from slotmap.workshop.dashboard import render, room
from slotmap.workshop.records import BODY_CAP, PROGRESS_CAP, RECORDS_SCOPE, Refused, Store

NOW = 1_800_000_000.0
EXERCISES = ["01.slot_of", "01.slot_mapping"]


def _body(exercise: str = "01.slot_of", state: str = "pass", **more) -> bytes:
    item = {"exercise": exercise, "state": state, "message": "", "time": NOW - 60, **more}
    return json.dumps(item).encode()


def _users(*names: str) -> list[dict]:
    return [{"name": name, "admin": False, "last_activity": None} for name in names]


def test_a_record_is_filed_under_the_tokens_user_never_a_name_in_the_body(tmp_path):
    store = Store(tmp_path / "store")
    assert stat.S_IMODE(store.folder.stat().st_mode) == 0o700
    filed = store.append("ada", _body(learner="bob", user="bob", name="bob", extra="x"), NOW)
    assert filed == {"exercise": "01.slot_of", "state": "pass", "message": "", "time": NOW - 60}
    assert [p.name for p in store.folder.iterdir()] == ["ada.jsonl"]
    path = store.folder / "ada.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == filed  # the checked fields only, never the body
    table = room(_users("ada", "bob"), None, EXERCISES, now=NOW, store=store.folder)
    cells = {row["learner"]: row["cells"]["01.slot_of"]["state"] for row in table["learners"]}
    assert cells == {"ada": "pass", "bob": "none"}


def test_names_never_leave_the_store_folder():
    for name in ("..", ".", "a/../../etc", "/root", "x" * 300, "中文"):
        file_name = Store.file_name(name)
        assert "/" not in file_name and file_name not in (".", "..")
        assert len(file_name) < 255, name
    assert Store.file_name("x" * 300) != Store.file_name("x" * 301)


# What a learner may post instead of a record: each answered 400 (413 past the cap), none filed.
BAD_BODIES = [
    b"",
    b"not json",
    b"\xff\xfe not utf-8",
    b"[" * 200_000,
    b'{"exercise": "01.slot_of", "state": "pass", "time": Infinity}',
    b'{"exercise": "01.slot_of", "state": "pass", "time": NaN}',
    _body(state="won"),
    _body(exercise="../../etc/passwd"),
    _body(time=NOW + 10 * 24 * 3600),
    _body(time=True),
    _body(message={"html": "<script>"}),
    json.dumps(["01.slot_of", "pass"]).encode(),
    _body() + b"\n" + _body(),
    _body(message="x" * BODY_CAP),
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_what_is_not_a_record_is_refused_and_nothing_filed(tmp_path, body):
    store = Store(tmp_path / "store")
    with pytest.raises(Refused) as refused:
        store.append("ada", body, NOW)
    assert refused.value.status == (413 if len(body) > BODY_CAP else 400)
    assert list(store.folder.iterdir()) == []


def test_a_flood_of_records_fills_the_learners_own_file_up_to_its_cap(tmp_path):
    store = Store(tmp_path / "store")
    store.append("bob", _body("01.slot_mapping"), NOW)
    message = "m" * 380
    for count in range(3 * PROGRESS_CAP // 450):
        store.append("ada", _body(message=message, time=NOW - 1000 + count * 1e-4), NOW)
    store.append("ada", _body("01.slot_mapping", "fail", message="last"), NOW)
    size = (store.folder / "ada.jsonl").stat().st_size
    assert PROGRESS_CAP // 2 < size <= 2 * PROGRESS_CAP
    assert (store.folder / "bob.jsonl").stat().st_size < 200
    assert sorted(p.name for p in store.folder.iterdir()) == ["ada.jsonl", "bob.jsonl"]
    table = room(_users("ada", "bob"), None, EXERCISES, now=NOW, store=store.folder)
    ada, bob = table["learners"]
    assert ada["cells"]["01.slot_mapping"] == {"state": "fail", "message": "last"}
    assert ada["cells"]["01.slot_of"]["state"] == "pass"
    assert bob["cells"]["01.slot_mapping"]["state"] == "pass"


def _model(name: str = "ada", scopes=(f"{RECORDS_SCOPE}!user=ada",), kind: str = "user"):
    """The hub's answer (GET /hub/api/user) for a token: its user and the token's scopes."""
    return {"kind": kind, "name": name, "scopes": list(scopes)}


def test_only_a_token_with_the_scope_for_its_own_user_may_post():
    assert records.poster(_model()) == "ada"
    assert records.poster(_model(scopes=[RECORDS_SCOPE])) == "ada"  # granted to every user
    refused = [
        None,  # the hub knows no such token
        _model(scopes=[]),
        _model(scopes=["read:users:name!user=ada", "access:servers!server=ada/"]),
        _model(scopes=[f"{RECORDS_SCOPE}!user=bob"]),  # the scope for someone else only
        _model(name="workshop-dashboard", kind="service", scopes=[RECORDS_SCOPE]),
        {"kind": "user", "scopes": [RECORDS_SCOPE]},
    ]
    for model in refused:
        with pytest.raises(Refused) as refusal:
            records.poster(model)
        assert refusal.value.status == 403, model


def test_the_room_reads_files_and_posted_records_together(tmp_path):
    store = Store(tmp_path / "store")
    homes = {name: tmp_path / name for name in ("ada", "bob")}
    for home in homes.values():
        home.mkdir()
    (homes["ada"] / progress.PROGRESS_FILE).write_text(_body("01.slot_of").decode() + "\n")
    store.append("bob", _body("01.slot_mapping", "fail", message="posted"), NOW)
    (store.folder / Store.file_name("bob")).open("a").write("not json\n")
    users = _users("ada", "bob")
    table = room(users, homes.__getitem__, EXERCISES, now=NOW, store=store.folder)
    ada, bob = table["learners"]
    assert ada["cells"]["01.slot_of"]["state"] == "pass" and ada["unreadable"] == ""
    assert bob["cells"]["01.slot_mapping"] == {"state": "fail", "message": "posted"}
    assert bob["unreadable"] == "posted: 1 record skipped"
    assert "posted: 1 record skipped" in render(table)
    files_only = room(users, homes.__getitem__, EXERCISES, now=NOW)
    assert files_only["learners"][1]["cells"]["01.slot_mapping"]["state"] == "none"


class _Dashboard:
    """A real HTTP server on 127.0.0.1 that answers ``status`` to POSTs and keeps them."""

    def __init__(self, status: int = 204, delay: float = 0.0):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, self.headers["Authorization"], json.loads(body)))
                time.sleep(delay)
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/d/api/records"
        # A short poll: close() waits for it.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _result(exercise: str, passed: bool):
    failure = None if passed else SimpleNamespace(invariant="tokens 5 and 21 collide")
    return SimpleNamespace(exercise=exercise, passed=passed, failure=failure, skipped="")


@pytest.fixture
def learner(tmp_path, monkeypatch):
    """A learner's kernel under a hub: a workspace, the hub's token, nothing left unsent."""
    workspace = tmp_path / "my_work"
    workspace.mkdir()
    monkeypatch.setenv(progress.TOKEN_VARIABLE, "the-server-token")
    progress.unsent.clear()
    yield workspace
    progress.flush()
    progress.unsent.clear()


def test_a_check_posts_its_record_with_the_servers_token(learner, monkeypatch):
    dashboard = _Dashboard(delay=1.0)  # a slow dashboard: the check does not wait for it
    try:
        monkeypatch.setenv(progress.RECORDS_URL_VARIABLE, dashboard.url)
        started = time.monotonic()
        assert progress.record(_result("01.slot_of", False), learner, cwd=learner)
        assert time.monotonic() - started < 0.5
        progress.flush()
        ((path, authorization, item),) = dashboard.received
        assert path == "/services/d/api/records" and authorization == "token the-server-token"
        written = json.loads((learner / progress.PROGRESS_FILE).read_text())
        assert item == written and item["message"] == "tokens 5 and 21 collide"
        assert progress.last_failure == "" and not progress.unsent
        # A check outside the workspace (a lesson) posts nothing, as it writes nothing.
        assert progress.record(_result("01.slot_of", True), learner, cwd=learner.parent) is None
        progress.flush()
        assert len(dashboard.received) == 1
    finally:
        dashboard.close()


def test_a_dashboard_that_is_down_is_remembered_and_caught_up(learner, monkeypatch):
    dashboard = _Dashboard()
    url = dashboard.url
    dashboard.close()  # nothing listens there now
    monkeypatch.setenv(progress.RECORDS_URL_VARIABLE, url)
    assert progress.record(_result("01.slot_of", False), learner, cwd=learner)
    progress.flush()
    assert progress.last_failure and len(progress.unsent) == 1
    assert (learner / progress.PROGRESS_FILE).read_text().count("\n") == 1  # written anyway
    dashboard = _Dashboard()
    try:
        monkeypatch.setenv(progress.RECORDS_URL_VARIABLE, dashboard.url)
        progress.record(_result("01.slot_of", True), learner, cwd=learner)
        progress.flush()
        assert [item["state"] for _, _, item in dashboard.received] == ["fail", "pass"]
        assert progress.last_failure == "" and not progress.unsent
    finally:
        dashboard.close()


def test_a_refused_record_is_dropped_not_sent_again(learner, monkeypatch):
    dashboard = _Dashboard(status=403)
    try:
        monkeypatch.setenv(progress.RECORDS_URL_VARIABLE, dashboard.url)
        progress.record(_result("01.slot_of", True), learner, cwd=learner)
        progress.flush()
        assert progress.last_failure.startswith("403") and not progress.unsent
    finally:
        dashboard.close()


def test_without_the_hubs_variables_nothing_is_sent(learner, monkeypatch):
    monkeypatch.delenv(progress.RECORDS_URL_VARIABLE, raising=False)
    assert progress.send({"exercise": "01.slot_of"}) is None
    monkeypatch.setenv(progress.RECORDS_URL_VARIABLE, "http://127.0.0.1:9/")
    monkeypatch.delenv(progress.TOKEN_VARIABLE)
    assert progress.send({"exercise": "01.slot_of"}) is None and not progress.unsent


def test_the_service_needs_files_or_a_store(monkeypatch, capsys):
    from slotmap.workshop import dashboard

    monkeypatch.delenv(dashboard.WORKSPACES_VARIABLE, raising=False)
    monkeypatch.delenv(records.STORE_VARIABLE, raising=False)
    assert dashboard.serve(Path(".")) == 2
    monkeypatch.setenv(dashboard.WORKSPACES_VARIABLE, "/home/no-username-in-it")
    assert dashboard.serve(Path(".")) == 2
    assert records.STORE_VARIABLE in capsys.readouterr().out


def _answers(app, requests: list[tuple[str, str, dict]]) -> list[int]:
    """The status of each (method, path, headers) request to ``app`` served on 127.0.0.1."""
    import asyncio

    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    async def ask() -> list[int]:
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(app)
        server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
        try:
            client = AsyncHTTPClient()
            statuses = []
            for method, path, headers in requests:
                body = _body() if method == "POST" else None
                answer = await client.fetch(
                    f"http://127.0.0.1:{port}{path}",
                    method=method,
                    body=body,
                    headers=headers,
                    raise_error=False,
                )
                statuses.append(answer.code)
            return statuses
        finally:
            server.stop()

    return asyncio.run(ask())


def test_the_service_answers_a_post_without_a_learners_token_403_before_asking_the_hub(
    tmp_path, monkeypatch
):
    pytest.importorskip("jupyterhub")
    from slotmap.workshop.dashboard import make_app

    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/services/d/")
    root = Path(__file__).resolve().parents[1]
    store = tmp_path / "store"
    app = make_app(root, None, store)
    url = "/services/d/api/records"
    statuses = _answers(
        app,
        [
            ("POST", url, {}),
            ("POST", url, {"Authorization": "Basic a-password"}),
            ("GET", url, {}),
        ],
    )
    assert statuses == [403, 403, 405]
    assert list(store.iterdir()) == []
    # A dashboard that reads files only takes no records.
    assert _answers(make_app(root, str(tmp_path / "{username}")), [("POST", url, {})]) == [404]
