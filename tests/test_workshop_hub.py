"""The workshop end to end on a real JupyterHub: the hub and its proxy on 127.0.0.1 with
workshop/jupyterhub_config.py, adapted only through its environment variables for the ports,
the state folder and the passwords. As root (CI) learners are the real system users the hub
creates, as in a room (each name ends in this run's suffix; every one is deleted after);
otherwise every learner runs as the test's user under temporary homes.

First the refusals: root, ROOT, nobody, daemon and an existing account the hub did not
create (a real one, made and deleted by the test) are refused at the login page with a
message that says why, "zhang_wei" with the naming rules, and nothing is spawned; the hub's
state is root's only. Then four learners log in. The second chooses 中文 in the form the
hub shows before it starts a server, in Chromium: their JupyterLab opens on their Chinese
copies with its menus in Chinese. Three run lesson 01 and their copy of exercise 01 (the
second, the Chinese ones) through the Jupyter server's REST API and kernel websocket
(``slotmap.workshop.drive``), one of them with a wrong ``slot_of`` on purpose; the fourth
logs in through the hub's login page in Debian's Chromium (tests/browser_lab.py's recipe),
keeps the room's English in the form, and fills in exercise 01 in JupyterLab. The dashboard
then shows the room to the instructor, and answers 403 to a learner's tokens. Each check
also posted its record to the dashboard with the learner's server token, from the kernel: a
learner posting as another files under their own name, bad bodies get 400 or 413, tokens
without the scope 403. The hub is restarted (as systemd would): a learner's server lives on
and answers through the new hub, whose dashboard shows the room from posted records only.
Everything is stopped, and no process of the test is left.

One test function: a module-scoped hub would be started once per pytest-xdist worker.
Needs ``jupyterhub`` (the workshop extra) and ``configurable-http-proxy`` (``make hub``);
without them it skips, except under CI (``CI`` set), where it fails.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from browser_lab import NotebookPage, chromium_path, launch_chromium

from slotmap.workshop import LAB_NOTIFICATIONS, drive, proxy

ROOT = Path(__file__).resolve().parents[1]
UNDER_CI = bool(os.environ.get("CI"))
PASSWORD = "room-password-" + os.urandom(4).hex()
ADMIN_PASSWORD = "instructor-" + os.urandom(16).hex()
# As root the learners are real system users: names of this run's own.
SUFFIX = os.urandom(2).hex()
LEARNERS = tuple(f"{name}{SUFFIX}" for name in ("ada", "bob", "cy"))  # the REST API's
BROWSER_LEARNER = f"dee{SUFFIX}"
WRONG = LEARNERS[2]  # fails 01.slot_of on purpose
CHINESE = LEARNERS[1]  # chooses 中文 as their server starts
LESSON = "01_paged_kv_cache.ipynb"
OUTSIDER = f"other{SUFFIX}"  # an account of the machine the hub did not create
pytestmark = pytest.mark.timeout(900)
VIEWPORT = (1280, 900)


def _missing(reason: str):
    if UNDER_CI:
        pytest.fail(f"{reason} (CI is set: the hub test must run in CI)", pytrace=False)
    pytest.skip(reason)


def _exercise_answers(wrong: bool = False) -> dict[int, str]:
    """Code-cell index -> the cell as a learner fills it (the solution's code in the stub's
    cell); ``wrong``: slot_of forgets to scale the physical block by the block size (and
    slot_mapping, which calls it, fails with it)."""
    answers = drive.solved_cells(ROOT)
    assert len(answers) == 2
    if wrong:
        first = min(answers)
        answer = answers[first]
        answers[first] = answer.replace("* block_size + block_offset", "+ block_offset")
        assert answers[first] != answer
    return answers


# One server starts at a time: on a 2-core CI machine running other tests, four servers
# starting at once (each imports torch) can outlast the hub's patience.
SPAWNING = threading.Lock()


def _start(hub: drive.LocalHub, name: str) -> str:
    """Log in as ``name`` and start their server; returns their API token."""
    session = drive.login(hub.url, name, PASSWORD)
    token = drive.api_token(hub.url, session, name)
    with SPAWNING:
        drive.start_server(hub.url, token, name, timeout=400)
    return token


def _run_learner(hub: drive.LocalHub, name: str, results: dict, errors: dict) -> None:
    """Log in, start the server, run lesson 01 and exercise 01 through the kernel protocol."""
    try:
        token = _start(hub, name)  # the Chinese learner's is running already: their choice
        server = f"{hub.url}/user/{name}"
        folder = "zh_CN/" if name == CHINESE else ""
        lesson = f"notebooks/{folder}{LESSON}"
        notebook = drive.get_notebook(server, token, lesson)
        kernel = drive.Kernel(server, token, lesson)
        try:
            spoken = kernel.execute("import os; print(os.environ['SLOTMAP_LANG'])").outputs
            assert spoken[0]["text"].strip() == ("zh_CN" if folder else "en"), (name, spoken)
            # What the kernel's checks post their records with: the dashboard's address and
            # the server's own token, from the kernel's environment.
            posting = kernel.execute(
                "import json; print(json.dumps([os.environ.get(v) for v in "
                "('SLOTMAP_RECORDS_URL', 'JUPYTERHUB_API_TOKEN')]))"
            ).outputs
            records_url, server_token = json.loads(posting[0]["text"])
            for code in drive.code_cells(notebook):
                run = kernel.execute(code)
                assert not run.error, f"{name}, lesson 01: {run.error}"
        finally:
            kernel.close()
        if folder:  # the Chinese lesson: its title is the translation's
            assert "分页" in "".join(notebook["cells"][0]["source"]), notebook["cells"][0]
        answers = _exercise_answers(wrong=name == WRONG)
        checks, error = drive.run_exercise(server, token, answers, f"my_work/{folder}{LESSON}")
        assert not error, f"{name}, exercise 01: {error}"
        results[name] = (token, checks, records_url, server_token)
    except BaseException as error:  # noqa: BLE001 - reported by the test's thread
        errors[name] = error


def _log_in(page, hub: drive.LocalHub, name: str, password: str, query: str = "") -> None:  # noqa: ANN001
    """The hub's login page, filled in and sent as a learner does."""
    page.goto(f"{hub.url}/hub/login{query}")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.click("#login_submit")


def _browser_learner(hub: drive.LocalHub, tmp_path: Path) -> dict[str, bool]:
    """Log in through the hub's page in Chromium, open my_work's exercise 01 in JupyterLab,
    fill it in and run it: the check records it shows."""
    from playwright.sync_api import sync_playwright

    # The learner's own Jupyter setting, in their home: the app exposed to the page's scripts
    # (to read kernel state, as the browser test does). A system user's home exists once the
    # hub made it: start their server, stop it, write the setting, and let the login start it
    # again. No setting for the news pop-up: the course's own settings turn it off.
    token = _start(hub, BROWSER_LEARNER)
    assert drive.hub_api(hub.url, token, "DELETE", f"/users/{BROWSER_LEARNER}/server").ok
    drive.wait_stopped(hub.url, token, BROWSER_LEARNER)
    home = hub.home(BROWSER_LEARNER)
    config = home / ".jupyter"
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"LabApp": {"expose_app_in_browser": True}})
    )
    owner = home.stat()
    for path in (config, config / "jupyter_server_config.json"):
        os.chown(path, owner.st_uid, owner.st_gid)
    with sync_playwright() as playwright:
        context = launch_chromium(playwright, tmp_path / "chromium", VIEWPORT)
        try:
            context.set_default_timeout(60_000)
            page = context.new_page()
            _log_in(page, hub, BROWSER_LEARNER, PASSWORD)
            # The hub asks for the course's language, offering the room's (English), and
            # then sends the browser on to the learner's JupyterLab.
            page.wait_for_url("**/hub/spawn**")
            assert page.locator("input[name=lang]:checked").get_attribute("value") == "en"
            page.click("#spawn_form [type=submit]")
            page.wait_for_url(f"**/user/{BROWSER_LEARNER}/lab**", timeout=180_000)
            server = type("Server", (), {"url": f"{hub.url}/user/{BROWSER_LEARNER}"})()
            server.token = token
            notebook = NotebookPage(page, server, "my_work/01_paged_kv_cache.ipynb")
            notebook.open()
            for index, answer in _exercise_answers().items():
                notebook.replace_source(index, answer)
            notebook.run_all(240_000)
            assert notebook.error_outputs() == []
            # The course's settings: no "get Jupyter news?" toast over the learner's lab (it
            # would have shown long before the notebook ran), and the setting that says so.
            assert page.get_by_text("official Jupyter news").count() == 0
            settings = home / ".jupyter" / "lab" / "user-settings"
            assert json.loads((settings / LAB_NOTIFICATIONS).read_text())["fetchNews"] == "false"
            return notebook.check_records()
        finally:
            context.close()


def _chinese_learner_starts(hub: drive.LocalHub, tmp_path: Path) -> list[str]:
    """CHINESE logs in through the hub's page in Chromium and chooses 中文 in the form the
    hub shows before it starts their server; their JupyterLab opens on their Chinese copies
    of the exercises. Returns the labels of JupyterLab's menu bar."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = launch_chromium(playwright, tmp_path / "chromium-zh", VIEWPORT)
        try:
            context.set_default_timeout(60_000)
            page = context.new_page()
            _log_in(page, hub, CHINESE, PASSWORD)
            page.wait_for_url("**/hub/spawn**")
            assert "中文" in page.inner_text("#spawn_form")
            page.check("input[name=lang][value=zh_CN]")
            with SPAWNING:
                page.click("#spawn_form [type=submit]")
                page.wait_for_url(f"**/user/{CHINESE}/lab/tree/my_work/zh_CN**", timeout=400_000)
            labels = page.locator(".lm-MenuBar-itemLabel")
            labels.first.wait_for()
            return labels.all_inner_texts()
        finally:
            context.close()


def _dashboard_in_chromium(hub: drive.LocalHub, tmp_path: Path) -> tuple[str, int]:
    """The room's page as the instructor's browser shows it after the hub's login (the
    service's own OAuth flow), and the status a learner's browser gets for it."""
    from playwright.sync_api import sync_playwright

    dashboard = f"{hub.url}/services/workshop-dashboard/"
    with sync_playwright() as playwright:
        seen = []
        for name, password in (("instructor", ADMIN_PASSWORD), (BROWSER_LEARNER, PASSWORD)):
            context = launch_chromium(playwright, tmp_path / f"chromium-{name}", VIEWPORT)
            try:
                context.set_default_timeout(60_000)
                page = context.new_page()
                _log_in(page, hub, name, password, "?next=/hub/home")
                page.wait_for_url("**/hub/home**")
                response = page.goto(dashboard)
                if name == "instructor":
                    page.wait_for_selector("table")
                    seen.append(page.inner_text("table"))
                else:
                    seen.append(response.status)
            finally:
                context.close()
    return seen[0], seen[1]


def _refusals(hub: drive.LocalHub) -> None:
    """Root under any spelling, system accounts and an account the hub did not create are
    refused at the login page, each with a message that says why; nothing is spawned."""
    want = {
        "root": "'root' is reserved",
        "ROOT": "'root' is reserved",
        "nobody": "'nobody' is reserved",
        "daemon": "'daemon' is reserved",
        OUTSIDER: "an account of this machine, not one this workshop created",
        "zhang_wei": "lower-case letters (a-z) and digits",
    }
    if not hub.system_users:
        del want[OUTSIDER]
    for name, message in want.items():
        status, shown = drive.refused_login(hub.url, name, PASSWORD)
        assert message in shown, (name, status, shown)
        assert "Invalid username or password" not in shown, name
    # The instructor's name in capitals with the room's password is not the instructor.
    status, shown = drive.refused_login(hub.url, "INSTRUCTOR", PASSWORD)
    assert "Invalid username or password" in shown, shown
    # The login page says the rules before anyone types.
    import requests

    assert (
        "lower-case letters (a-z) and digits"
        in requests.get(f"{hub.url}/hub/login", timeout=30).text
    )


def _private(path: Path, mode: int, owner: int | None = None) -> None:
    """``path`` has ``mode`` and belongs to ``owner`` (this user by default)."""
    info = path.lstat()
    owner = os.geteuid() if owner is None else owner
    assert stat.S_IMODE(info.st_mode) == mode and info.st_uid == owner, (path, oct(info.st_mode))


def test_a_workshop_of_four_learners_on_a_real_hub(tmp_path):
    try:
        import jupyterhub  # noqa: F401
        import requests
    except ImportError:
        _missing("jupyterhub is not installed (pip install -e '.[workshop]'; make test does)")
    if proxy.proxy_executable() is None:
        _missing("configurable-http-proxy is not installed (make hub; make test does)")
    browser = chromium_path() is not None
    if not browser and UNDER_CI:
        _missing("Debian's chromium is not installed")

    # The proxy runs apart, as slotmap-proxy.service runs it in a room.
    hub = drive.LocalHub(tmp_path, PASSWORD, ADMIN_PASSWORD, external_proxy=True)
    outsider = hub.system_users
    if outsider:
        subprocess.run(["useradd", "--no-create-home", OUTSIDER], check=True)
    try:
        hub.start(ROOT / "workshop" / "jupyterhub_config.py")
        _refusals(hub)
        session = drive.login(hub.url, "instructor", ADMIN_PASSWORD)
        instructor = drive.api_token(hub.url, session, "instructor")
        users = drive.hub_api(hub.url, instructor, "GET", "/users").json()
        assert [user["name"] for user in users] == ["instructor"]  # no refused name got in
        # Nor through the admin page: the instructor cannot add root as a user.
        added = drive.hub_api(hub.url, instructor, "POST", "/users/root")
        assert added.status_code == 400, added.text
        assert hub.learners() == {}

        # The Chinese learner starts their server in the hub's form (in Chromium; without
        # a browser, through the REST API with the form's options).
        if browser:
            menus = " ".join(_chinese_learner_starts(hub, tmp_path))
            assert "帮助" in menus and "Help" not in menus, menus  # JupyterLab's own menus
        else:
            token = drive.api_token(hub.url, drive.login(hub.url, CHINESE, PASSWORD), CHINESE)
            started = drive.hub_api(
                hub.url, token, "POST", f"/users/{CHINESE}/server", json={"lang": "zh_CN"}
            )
            assert started.status_code in (201, 202), started.text
        results: dict = {}
        errors: dict = {}
        threads = [
            threading.Thread(target=_run_learner, args=(hub, name, results, errors))
            for name in LEARNERS
        ]
        for thread in threads:
            thread.start()
        browser_checks = _browser_learner(hub, tmp_path) if browser else None
        for thread in threads:
            thread.join(timeout=600)
        hub.remember_processes()
        assert not errors, f"{errors}\n{hub.log_tail()}"
        for name in LEARNERS:
            ok = name != WRONG
            assert results[name][1] == {"01.slot_of": ok, "01.slot_mapping": ok}, name
        if browser:
            assert browser_checks == {"01.slot_of": True, "01.slot_mapping": True}

        # The hub keeps the choice: with their server stopped, the form offers 中文 again.
        token = results[CHINESE][0]
        assert drive.hub_api(hub.url, token, "DELETE", f"/users/{CHINESE}/server").ok
        drive.wait_stopped(hub.url, token, CHINESE)
        session = drive.login(hub.url, CHINESE, PASSWORD)
        form = session.get(f"{hub.url}/hub/spawn", timeout=30)
        assert 'value="zh_CN" id="lang-zh_CN" checked' in form.text, form.text[-2000:]

        # Each learner's work is in their own home, and the records of their checks with it;
        # as system users, each server and kernel ran as the learner, never as root.
        everyone = [*LEARNERS, BROWSER_LEARNER] if browser else list(LEARNERS)
        for name in LEARNERS:
            my_work = hub.home(name) / "slotmap-course" / "my_work"
            text = (my_work / ".slotmap-progress.jsonl").read_text()
            assert "01.slot_mapping" in text, name
        if hub.system_users:
            assert sorted(hub.learners()) == sorted(everyone)
            for name in everyone:
                account = pwd.getpwnam(name)
                assert account.pw_uid == hub.learners()[name] >= 1000
                _private(Path(account.pw_dir), 0o700, account.pw_uid)
            for pid in hub.processes_of(LEARNERS[0]):
                assert Path(f"/proc/{pid}").stat().st_uid == pwd.getpwnam(LEARNERS[0]).pw_uid

        # The hub's state is root's only: the database, the cookie secret, the accounts.
        _private(hub.state, 0o700)
        for name in ("jupyterhub.sqlite", "jupyterhub_cookie_secret"):
            _private(hub.state / name, 0o600)
        if hub.system_users:
            _private(hub.state / "learners.json", 0o600)

        # The room, as the instructor sees it.
        view = f"{hub.url}/services/workshop-dashboard/"
        response = requests.get(
            view + "api/progress", headers={"Authorization": f"token {instructor}"}, timeout=30
        )
        assert response.status_code == 200, response.text
        table = response.json()
        rows = {row["learner"]: row for row in table["learners"]}
        assert sorted(rows) == sorted(everyone)  # the instructor is not a learner
        for name in everyone:
            cells = rows[name]["cells"]
            want = "fail" if name == WRONG else "pass"
            assert cells["01.slot_of"]["state"] == cells["01.slot_mapping"]["state"] == want
            assert cells["02.first_kernel"] == {"state": "none", "message": ""}
            assert rows[name]["idle_seconds"] is not None
        assert rows[WRONG]["cells"]["01.slot_of"]["message"]  # the invariant it broke
        page = requests.get(view, headers={"Authorization": f"token {instructor}"}, timeout=30)
        assert page.status_code == 200 and f"<th>{WRONG}</th>" in page.text

        # A learner's tokens are refused, for the table and for the page: the one they make
        # and their server's (in their kernel's environment).
        learner_token = results[LEARNERS[0]][0]
        for token in (learner_token, results[LEARNERS[0]][3]):
            for url in (view + "api/progress", view):
                refused = requests.get(
                    url, headers={"Authorization": f"token {token}"}, timeout=30
                )
                assert refused.status_code == 403, (url, refused.status_code)
                assert LEARNERS[1] not in refused.text
        _posting_as_an_attacker(hub, view, instructor, results, everyone)

        # The same in Chromium, through the hub's login page and the service's OAuth.
        if browser:
            table_text, learner_status = _dashboard_in_chromium(hub, tmp_path)
            for name in everyone:
                assert name in table_text
            assert learner_status == 403

        if hub.system_users:
            _doctored_files_take_nothing_down(hub, view, instructor, tmp_path)

        # A hub restart (SIGTERM, as systemctl restart sends) keeps the learner's server: the
        # same processes, answering through the proxy while the hub is down, and through the
        # new hub after, with the same token.
        before = set(hub.processes_of(LEARNERS[0]))
        assert before

        def learner_status() -> int:
            return requests.get(
                f"{hub.url}/user/{LEARNERS[0]}/api/status",
                headers={"Authorization": f"token {learner_token}"},
                timeout=60,
            ).status_code

        assert learner_status() == 200  # a learner at work just before the restart
        down: dict[str, int] = {}
        # The new hub's dashboard reads the posted records only: the room as on Kubernetes.
        hub.env["SLOTMAP_HUB_DASHBOARD_SOURCES"] = "posted"
        hub.restart(while_down=lambda: down.update(learner=learner_status()))
        assert down == {"learner": 200}, "the learner's server was unreachable during the restart"
        assert before <= set(hub.processes_of(LEARNERS[0]))
        assert learner_status() == 200
        _the_room_from_posted_records_only(view, instructor, everyone)
    finally:
        hub.stop()
        hub.remove_learners()
        if outsider:
            subprocess.run(["userdel", OUTSIDER], check=False)
    assert hub.leftovers() == []
    for name in [*LEARNERS, BROWSER_LEARNER, OUTSIDER]:
        with pytest.raises(KeyError):
            pwd.getpwnam(name)


def test_preflight_gets_a_real_test_learner_through_the_hub():
    """The pre-flight's test learner, for real: logged in, spawned, lesson 01's first cell
    and exercise 01's checks run, seen on the dashboard, stopped, the account removed."""
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        _missing("jupyterhub is not installed (pip install -e '.[workshop]'; make test does)")
    if proxy.proxy_executable() is None:
        _missing("configurable-http-proxy is not installed (make hub; make test does)")
    from slotmap.workshop import preflight

    assert preflight.trial_learner() == ""
    assert not [a.pw_name for a in pwd.getpwall() if a.pw_name.startswith("preflight")]


def _posting_as_an_attacker(
    hub: drive.LocalHub, view: str, instructor: str, results: dict, everyone: list[str]
) -> None:
    """Every learner's checks posted their records (the store has a file for each); a
    learner's server token posting as another learner files under its own name; a garbage
    body is answered 400, an oversized one 413, no token or one without the scope 403."""
    import time

    import requests

    from slotmap.workshop.records import BODY_CAP, Store

    store = hub.state / "dashboard-records"
    _private(store, 0o700)
    for name in everyone:
        assert "01.slot_mapping" in (store / Store.file_name(name)).read_text(), name
    me, other = LEARNERS[0], LEARNERS[1]
    url, server_token = results[me][2], results[me][3]
    assert url.endswith("/services/workshop-dashboard/api/records"), url
    mine = {"Authorization": f"token {server_token}"}
    record = {"exercise": "02.first_kernel", "state": "pass", "message": "", "time": time.time()}
    as_other = {**record, "learner": other, "user": other, "name": other}
    assert requests.post(url, json=as_other, headers=mine, timeout=30).status_code == 204
    for body in (b"{", b"[" * BODY_CAP, b'{"exercise": "02.x", "state": "won", "time": 1}'):
        answer = requests.post(url, data=body, headers=mine, timeout=30)
        assert answer.status_code == 400, (body[:20], answer.status_code)
    oversized = json.dumps({**record, "message": "x" * BODY_CAP})
    assert requests.post(url, data=oversized, headers=mine, timeout=30).status_code == 413
    # A flood is never read: the dashboard answers 400 and closes the connection, which the
    # client meets as that answer or, when the close comes while it still sends or reads, as a
    # reset.
    try:
        flood = requests.post(url, data=b"x" * (1 << 20), headers=mine, timeout=30)
    except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
        pass
    else:
        assert flood.status_code == 400, flood.status_code
    made = drive.hub_api(
        hub.url,
        results[me][0],
        "POST",
        f"/users/{me}/tokens",
        json={"scopes": [f"read:users:name!user={me}"]},
    )
    assert made.status_code == 201, made.text
    for headers in ({}, {"Authorization": f"token {made.json()['token']}"}):
        assert requests.post(url, json=record, headers=headers, timeout=30).status_code == 403
    table = requests.get(
        view + "api/progress", headers={"Authorization": f"token {instructor}"}, timeout=30
    ).json()
    rows = {row["learner"]: row for row in table["learners"]}
    assert rows[me]["cells"]["02.first_kernel"]["state"] == "pass"
    assert rows[other]["cells"]["02.first_kernel"]["state"] == "none"


def _the_room_from_posted_records_only(view: str, instructor: str, everyone: list[str]) -> None:
    """The dashboard with the learners' files off shows the room from their posted records:
    every learner's checks, and no file's trouble (the FIFO, the record of Infinity)."""
    import time

    import requests

    deadline = time.monotonic() + 60
    while True:  # the hub starts its services after its API answers
        response = requests.get(
            view + "api/progress", headers={"Authorization": f"token {instructor}"}, timeout=30
        )
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert response.status_code == 200, response.text
    rows = {row["learner"]: row for row in response.json()["learners"]}
    assert sorted(rows) == sorted(everyone)
    for name in everyone:
        cells = rows[name]["cells"]
        want = "fail" if name == WRONG else "pass"
        assert cells["01.slot_of"]["state"] == cells["01.slot_mapping"]["state"] == want, name
        assert rows[name]["unreadable"] == "", (name, rows[name]["unreadable"])
    assert rows[LEARNERS[0]]["cells"]["02.first_kernel"]["state"] == "pass"


def _doctored_files_take_nothing_down(
    hub: drive.LocalHub, view: str, instructor: str, tmp_path: Path
) -> None:
    """What a hostile learner can do to their own files: LEARNERS[1] replaces a notebook by a
    link to LEARNERS[0]'s and its progress file by a FIFO, LEARNERS[2] writes a record whose
    time is Infinity. The room's table still answers, naming both as unreadable, and the
    collection copies neither the link nor anything it points to, into root-only folders."""
    import requests

    from slotmap.workshop import collect
    from slotmap.workshop.accounts import REGISTRY_FILE, Registry

    honest, cheat, breaker = LEARNERS
    work = {name: hub.home(name) / "slotmap-course" / "my_work" for name in LEARNERS}
    notebook = sorted(work[honest].glob("*.ipynb"))[0].name
    uid = pwd.getpwnam(cheat).pw_uid
    (work[cheat] / notebook).unlink(missing_ok=True)
    (work[cheat] / notebook).symlink_to(work[honest] / notebook)
    os.lchown(work[cheat] / notebook, uid, uid)
    progress = work[cheat] / ".slotmap-progress.jsonl"
    progress.unlink()
    os.mkfifo(progress)
    os.chown(progress, uid, uid)
    with open(work[breaker] / ".slotmap-progress.jsonl", "a") as records:
        records.write('{"exercise": "01.slot_of", "state": "pass", "time": Infinity}\n')

    response = requests.get(
        view + "api/progress", headers={"Authorization": f"token {instructor}"}, timeout=30
    )
    assert response.status_code == 200, response.text
    rows = {row["learner"]: row for row in response.json()["learners"]}
    assert rows[cheat]["unreadable"] == "its progress file is not a regular file"
    assert rows[breaker]["unreadable"] == "1 record skipped"
    assert rows[honest]["unreadable"] == ""
    assert rows[honest]["cells"]["01.slot_of"]["state"] == "pass"

    into = tmp_path / "collected"
    report = collect.collect(into, Registry(hub.state / REGISTRY_FILE).created())
    skipped = {(item["learner"], item["file"]): item["why"] for item in report.skipped}
    assert "a symbolic link" in skipped[(cheat, notebook)], skipped
    assert notebook in report.copied[honest] and notebook not in report.copied.get(cheat, {})
    _private(into, 0o700)
    for name, files in report.copied.items():
        _private(into / name, 0o700)
        for file in files:
            _private(into / name / file, 0o600)
