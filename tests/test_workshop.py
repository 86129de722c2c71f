"""The workshop's pieces without a hub: where a learner's work lives, the course copy each
learner gets (two learners, an update), the progress records and the dashboard's table.
tests/test_workshop_hub.py runs them together on a real JupyterHub."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from slotmap.workshop import proxy

ROOT = Path(__file__).resolve().parents[1]


def _course(folder: Path, exercises: dict[str, str], lessons: dict[str, str]) -> Path:
    """A small course: the marker, exercise notebooks and lessons with the given text."""
    (folder / "exercises").mkdir(parents=True)
    (folder / "notebooks").mkdir()
    (folder / "solutions").mkdir()
    (folder / ".slotmap-course").write_text("")
    for name, text in exercises.items():
        notebook = {"cells": [{"cell_type": "code", "id": "slotmap-banner", "source": text}]}
        (folder / "exercises" / name).write_text(json.dumps(notebook))
    for name, text in lessons.items():
        (folder / "notebooks" / name).write_text(text)
    return folder


def test_exercises_copy_in_a_course_copy_fills_that_copys_my_work(tmp_path, monkeypatch):
    # A learner's course copy outside the checkout (the hub's ~/slotmap-course): the copies
    # go into its my_work/, not into the checkout the package runs from.
    from slotmap.cli import main

    monkeypatch.delenv("SLOTMAP_WORKSPACE", raising=False)
    course = tmp_path / "slotmap-course"
    (course / "notebooks").mkdir(parents=True)
    (course / ".slotmap-course").write_text("")
    monkeypatch.chdir(course / "notebooks")
    assert main(["exercises", "copy"]) == 0
    copied = sorted(p.name for p in (course / "my_work").glob("*.ipynb"))
    assert "01_paged_kv_cache.ipynb" in copied
    assert copied == sorted(p.name for p in (ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))


def test_learner_workspace_is_the_variable_else_the_course_copy_else_home(tmp_path, monkeypatch):
    from slotmap.exercises.build import learner_workspace

    course = tmp_path / "course"
    (course / "my_work").mkdir(parents=True)
    (course / ".slotmap-course").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLOTMAP_WORKSPACE", str(tmp_path / "elsewhere"))
    monkeypatch.chdir(course / "my_work")
    assert learner_workspace() == (tmp_path / "elsewhere").resolve()
    monkeypatch.delenv("SLOTMAP_WORKSPACE")
    assert learner_workspace() == course.resolve() / "my_work"
    monkeypatch.chdir(tmp_path)
    assert learner_workspace() == tmp_path / "home" / "slotmap-course" / "my_work"


def test_two_learners_keep_their_own_work_through_an_update(tmp_path):
    from slotmap.workshop import sync_course

    source = _course(
        tmp_path / "source",
        {"01_a.ipynb": "exercise 1, first version"},
        {"01_a.ipynb": "lesson 1, first version", "02_b.ipynb": "lesson 2, first version"},
    )
    ada, bob = tmp_path / "ada" / "slotmap-course", tmp_path / "bob" / "slotmap-course"
    for learner in (ada, bob):
        messages = sync_course(source, learner)
        assert f"new  {learner / 'my_work' / '01_a.ipynb'}" in messages
    # Each edits their own copy of exercise 1; Ada also edits lesson 1.
    (ada / "my_work" / "01_a.ipynb").write_text("ada's answer")
    (bob / "my_work" / "01_a.ipynb").write_text("bob's answer")
    (ada / "notebooks" / "01_a.ipynb").write_text("ada's notes in lesson 1")
    # The course is updated: both lessons, exercise 1, and a new exercise 2.
    for name in ("01_a.ipynb", "02_b.ipynb"):
        (source / "notebooks" / name).write_text(f"{name}, second version")
    (source / "exercises" / "01_a.ipynb").write_text("exercise 1, second version")
    (source / "exercises" / "02_b.ipynb").write_text(json.dumps({"cells": []}))
    os.utime(source / "exercises" / "01_a.ipynb", (2e9, 2e9))  # newer than the learners' copies
    for learner, name in ((ada, "ada"), (bob, "bob")):
        sync_course(source, learner)
        assert (learner / "my_work" / "01_a.ipynb").read_text() == f"{name}'s answer"
        assert (learner / "my_work" / "02_b.ipynb").exists()  # the new exercise arrives
        assert (learner / "exercises" / "01_a.ipynb").read_text() == "exercise 1, second version"
        assert (learner / "notebooks" / "02_b.ipynb").read_text() == "02_b.ipynb, second version"
    # A lesson Ada edited is hers; Bob's untouched copy is brought up to date.
    assert (ada / "notebooks" / "01_a.ipynb").read_text() == "ada's notes in lesson 1"
    assert (bob / "notebooks" / "01_a.ipynb").read_text() == "01_a.ipynb, second version"
    texts = {p.read_text() for p in (bob / "my_work").rglob("*")}
    assert not any("ada" in text for text in texts)


def test_the_course_copy_leaves_hidden_files_and_run_leftovers_behind(tmp_path):
    from slotmap.workshop import course_files

    source = _course(tmp_path / "source", {"01_a.ipynb": "x"}, {"01_a.ipynb": "y"})
    for junk in (".hypothesis/db", ".ipynb_checkpoints/01_a.ipynb", "__pycache__/m.pyc"):
        (source / "notebooks" / junk).parent.mkdir(parents=True, exist_ok=True)
        (source / "notebooks" / junk).write_text("junk")
    (source / "solutions" / "my_rank_fn.py").write_text("an answer")
    assert sorted(map(str, course_files(source))) == [
        ".slotmap-course",
        "exercises/01_a.ipynb",
        "notebooks/01_a.ipynb",
    ]


def _result(exercise: str, passed: bool, invariant: str = "", skipped: str = ""):
    failure = None if passed else SimpleNamespace(invariant=invariant)
    return SimpleNamespace(exercise=exercise, passed=passed, failure=failure, skipped=skipped)


def test_progress_is_recorded_only_for_checks_run_inside_the_workspace(tmp_path):
    from slotmap.exercises import progress

    workspace = tmp_path / "my_work"
    workspace.mkdir()
    elsewhere = tmp_path / "notebooks"
    elsewhere.mkdir()
    assert progress.record(_result("01.a", True), workspace, cwd=elsewhere) is None
    assert progress.record(_result("01.a", True), tmp_path / "none", cwd=tmp_path) is None
    progress.record(_result("01.a", False, "tokens 5 and 21 collide"), workspace, cwd=workspace)
    progress.record(_result("01.a", True), workspace, cwd=workspace)
    skip = _result("01.b", False, "ignored", skipped="this machine has one device, not two")
    progress.record(skip, workspace, cwd=workspace)
    with open(workspace / progress.PROGRESS_FILE, "a") as file:
        file.write("not json\n" + json.dumps({"exercise": "01.c", "state": "won"}) + "\n")
    records = progress.read_records(workspace)
    assert [(r["exercise"], r["state"], r["message"]) for r in records] == [
        ("01.a", "fail", "tokens 5 and 21 collide"),
        ("01.a", "pass", ""),
        ("01.b", "skip", "this machine has one device, not two"),
    ]
    assert {e: r["state"] for e, r in progress.latest(records).items()} == {
        "01.a": "pass",
        "01.b": "skip",
    }


def test_a_progress_file_that_cannot_be_written_is_no_error(tmp_path):
    from slotmap.exercises import progress

    workspace = tmp_path / "my_work"
    (workspace / progress.PROGRESS_FILE).mkdir(parents=True)  # a folder where the file goes
    assert progress.record(_result("01.a", True), workspace, cwd=workspace) is None


def test_the_dashboard_table_shows_pass_fail_with_its_message_and_not_tried(tmp_path):
    from slotmap.exercises import progress
    from slotmap.workshop.dashboard import exercise_ids, render, room

    assert exercise_ids(ROOT)[:2] == ["01.slot_of", "01.slot_mapping"]
    homes = {name: tmp_path / name for name in ("ada", "bob", "cy")}
    for home in homes.values():
        home.mkdir()
    progress.record(_result("01.slot_of", True), homes["ada"], cwd=homes["ada"])
    progress.record(_result("01.slot_of", False, "slot 37 twice"), homes["bob"], cwd=homes["bob"])
    users = [
        {"name": "bob", "admin": False, "last_activity": None},
        {"name": "ada", "admin": False, "last_activity": "2026-01-01T00:00:00.000000Z"},
        {"name": "cy", "admin": False, "last_activity": None},
        {"name": "instructor", "admin": True, "last_activity": None},
    ]
    table = room(users, homes.__getitem__, ["01.slot_of", "01.slot_mapping"])
    assert [row["learner"] for row in table["learners"]] == ["ada", "bob", "cy"]
    cells = {row["learner"]: row["cells"] for row in table["learners"]}
    assert cells["ada"]["01.slot_of"] == {"state": "pass", "message": ""}
    assert cells["bob"]["01.slot_of"] == {"state": "fail", "message": "slot 37 twice"}
    assert (
        cells["ada"]["01.slot_mapping"]
        == cells["cy"]["01.slot_of"]
        == {
            "state": "none",
            "message": "",
        }
    )
    idle = {row["learner"]: row["idle_seconds"] for row in table["learners"]}
    assert idle["cy"] is None and idle["bob"] is not None
    page = render(table)
    assert "slot 37 twice" in page and "<th>cy</th><td>never</td><td>0/2</td>" in page
    assert "<th>ada</th><td>" in page and "<td>1/2</td>" in page


def test_the_workshop_command_line(capsys):
    from slotmap.cli import main

    with pytest.raises(SystemExit):
        main(["workshop", "nonsense"])
    assert main(["workshop", "dashboard", "--unknown"]) == 2
    assert "unrecognized arguments: --unknown" in capsys.readouterr().err


def test_a_check_run_in_the_workspace_leaves_a_record_and_one_run_elsewhere_none(
    tmp_path, monkeypatch
):
    from slotmap.exercises import check, progress

    workspace, lessons = tmp_path / "my_work", tmp_path / "notebooks"
    workspace.mkdir()
    lessons.mkdir()
    monkeypatch.setenv("SLOTMAP_WORKSPACE", str(workspace))

    def unscaled(position: int, block_table_row: list[int], block_size: int) -> int:
        return block_table_row[position // block_size] + position % block_size

    monkeypatch.chdir(lessons)  # a lesson's check: not the learner's exercise
    assert not check("01.slot_of", unscaled)
    assert not (workspace / progress.PROGRESS_FILE).exists()
    monkeypatch.chdir(workspace)
    failed = check("01.slot_of", unscaled)
    records = progress.read_records(workspace)
    assert [(r["exercise"], r["state"]) for r in records] == [("01.slot_of", "fail")]
    assert records[0]["message"] == failed.failure.invariant != ""


def test_preflight_memory_for_the_room():
    from slotmap.workshop.preflight import Memory

    # 10 learners: 6 GB at first, 12 GB at the track's peak.
    assert Memory(10, 12).line().endswith(": OK")
    tight = Memory(10, 8)
    assert tight.ok and tight.line().endswith("TIGHT, only 6 fit at the peak")
    short = Memory(10, 5)
    assert not short.ok and short.line().endswith("NOT ENOUGH, room for 8 learners")


@pytest.mark.parametrize(
    ("constant", "results", "pattern"),
    [
        (
            "LEARNER_FLOOR_GB",
            "workshop-track-memory.md",
            r"\| lesson 01 \|[^\n]*\| (\d+) \| \d+ \| none \|",
        ),
        ("LEARNER_PEAK_GB", "workshop-track-memory.md", r"Peak: (\d+) MiB"),
        ("LEARNER_UNCULLED_GB", "workshop-track-memory-no-culling.md", r"Peak: (\d+) MiB"),
    ],
)
def test_preflights_memory_model_is_the_committed_track_measurement(constant, results, pattern):
    import math

    from slotmap.workshop import limits

    text = (ROOT / "benchmarks" / "results" / results).read_text(encoding="utf-8")
    mib = int(re.search(pattern, text).group(1))
    assert getattr(limits, constant) == math.ceil(mib * 2**20 / 1e8) / 10, (constant, mib)


def test_preflight_cpu_advice():
    from slotmap.workshop.preflight import cpu_line

    assert cpu_line(16, 2).endswith(": OK")
    assert "SLOW" in cpu_line(30, 2) and "about 16 learners" in cpu_line(30, 2)


def _a_ready_machine(monkeypatch, doctor_says: str = "doctor: all good\n", trial: str = ""):
    """preflight on a machine where everything but what a test changes is ready: the hub's
    pieces installed, 100 GB free, a Python learners can run, the doctor and the test learner
    as given. Returns the preflight module."""
    import subprocess

    from slotmap.workshop import preflight

    monkeypatch.setattr(preflight, "hub_pieces", lambda: [])
    monkeypatch.setattr(preflight, "available_gb", lambda: 100.0)
    monkeypatch.setattr(preflight, "python_line", lambda: (True, "python       OK"))
    done = subprocess.CompletedProcess([], 0, doctor_says, "")
    monkeypatch.setattr(preflight.subprocess, "run", lambda *a, **k: done)
    monkeypatch.setattr(preflight, "trial_learner", lambda: trial)
    return preflight


def test_preflight_fails_when_the_doctor_does(monkeypatch, capsys):
    import subprocess

    preflight = _a_ready_machine(monkeypatch)
    outcomes = iter([(0, "doctor: all good\n"), (1, "doctor: the canary FAILED\n")])

    def doctor(command, **kwargs):
        code, out = next(outcomes)
        assert command[-2:] == ["slotmap", "doctor"]
        return subprocess.CompletedProcess(command, code, out, "")

    monkeypatch.setattr(preflight.subprocess, "run", doctor)
    assert preflight.preflight(10) == 0
    assert "preflight: ready" in capsys.readouterr().out
    assert preflight.preflight(10) == 1
    out = capsys.readouterr().out
    assert "doctor       FAIL: doctor: the canary FAILED" in out and "NOT ready" in out


def test_preflight_speaks_chinese_under_slotmap_lang_zh(monkeypatch, capsys):
    from slotmap import i18n

    preflight = _a_ready_machine(monkeypatch, "doctor：一切正常\n")
    i18n.use("zh")
    try:
        code = preflight.preflight(10)
        tight = preflight.Memory(10, 8).line()
        slow = preflight.cpu_line(30, 2)
    finally:
        i18n.use("en")
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == [
        "学员         10",
        "doctor       通过：doctor：一切正常",
        "python       OK",
        "hub          已安装",
    ]
    assert lines[4].startswith("内存         可用 100.0 GB；10 个学员开始时需要 6.0 GB")
    assert lines[4].endswith("：正常")
    assert lines[5].startswith("CPU          ") and lines[6].startswith("资源限制     ")
    assert lines[-3:] == [
        "测试学员（登录、启动服务器、第 01 课、一项检查、看板、删除）……",
        "测试学员     通过",
        "preflight：准备好了" if code == 0 else "preflight：尚未准备好",
    ]
    assert tight.endswith("：紧张，峰值时只容得下 6 个")
    assert slow.startswith("CPU          2 个核大约能容纳 16 个学员") and slow.endswith(
        "：偏慢：预计控件重绘的 p95 超过 1 秒"
    )


def test_preflight_is_ready_only_when_the_test_learner_got_through(monkeypatch, capsys):
    failed = "start the test learner's server: 500 Permission denied: .venv/bin/python"
    preflight = _a_ready_machine(monkeypatch, trial=failed)
    assert preflight.preflight(10) == 1
    out = capsys.readouterr().out
    assert f"test learner FAIL: {failed}" in out and "preflight: NOT ready" in out
    # A Python learners cannot run: the trial is not even tried, and the line says the fix.
    monkeypatch.setattr(preflight, "python_line", lambda: (False, "python       FAIL: ..."))
    monkeypatch.setattr(preflight, "trial_learner", lambda: pytest.fail("tried"))
    assert preflight.preflight(10) == 1
    assert "test learner FAIL: not run" in capsys.readouterr().out


def test_an_interpreter_under_a_closed_folder_is_refused_with_the_fix(tmp_path, monkeypatch):
    from slotmap.workshop import preflight

    closed = tmp_path / "root-like"
    (closed / "bin").mkdir(parents=True)
    python = closed / "bin" / "python3.11"
    python.write_text("")
    python.chmod(0o755)
    (closed / "bin").chmod(0o755)
    closed.chmod(0o700)  # as /root is
    assert preflight.closed_to_others(python) == (
        f"{python}: {closed} (mode 700) is closed to other users"
    )
    assert preflight.closed_to_others("/bin/sh") == ""  # every user runs the shell
    monkeypatch.setattr(preflight, "closed_to_others", lambda executable: "/root is closed")
    ok, line = preflight.python_line()
    assert not ok and "make hub PYTHON=/usr/bin/python3.11" in line


def test_confirm_names_each_pass_that_slotmap_grade_does_not_hold(tmp_path, capsys):
    from slotmap.cli import main

    room = {
        "exercises": ["01.slot_of", "01.slot_mapping"],
        "learners": [
            {
                "learner": "ada",
                "idle_seconds": 3,
                "cells": {
                    "01.slot_of": {"state": "pass", "message": ""},
                    "01.slot_mapping": {"state": "pass", "message": ""},
                },
            },
            {
                "learner": "bob",
                "idle_seconds": 3,
                "cells": {
                    "01.slot_of": {"state": "fail", "message": "slot 37 twice"},
                    "01.slot_mapping": {"state": "none", "message": ""},
                },
            },
        ],
    }
    grades = [
        {
            "notebook": "ada/01_paged_kv_cache.ipynb",
            "error": "",
            "ignored_results": [],
            "results": {"01.slot_of": "PASS", "01.slot_mapping": "FAIL"},
        },
        {
            "notebook": "bob/01_paged_kv_cache.ipynb",
            "error": "",
            "ignored_results": [],
            "results": {"01.slot_of": "FAIL", "01.slot_mapping": "missing"},
        },
    ]
    (tmp_path / "room.json").write_text(json.dumps(room))
    (tmp_path / "grades.json").write_text(json.dumps(grades))
    arguments = ["--room", str(tmp_path / "room.json"), "--grades", str(tmp_path / "grades.json")]
    assert main(["workshop", "confirm", *arguments]) == 1
    assert capsys.readouterr().out == (
        "ada 01.slot_mapping: the room says pass, slotmap grade says FAIL\n"
    )
    grades[0]["results"]["01.slot_mapping"] = "PASS"
    (tmp_path / "grades.json").write_text(json.dumps(grades))
    assert main(["workshop", "confirm", *arguments]) == 0


def test_a_learners_server_is_jupyterhub_singleuser_with_the_labs_options(tmp_path):
    from slotmap.workshop import learner_server_command

    course = tmp_path / "slotmap-course"
    course.mkdir()
    (course / ".slotmap-course").write_text("")
    command = learner_server_command(course, ["--debug"])
    assert command[1:4] == ["-m", "slotmap.jupyter_main", "jupyterhub.singleuser"]
    assert command[-1] == "--debug" and command.count("jupyterlab") == 0
    assert f"--ServerApp.root_dir={course.resolve()}" in command
    assert "--ContentsManager.pre_save_hook=slotmap.lab.keep_course_notebooks_clean" in command
    # The hub says where the server listens: not the lab's loopback default.
    assert not [option for option in command if option.startswith("--ServerApp.ip")]
    # Never --allow-root (this test runs as root in CI), and never as root at all.
    assert "--allow-root" not in command


def test_a_learners_server_refuses_to_run_as_root(monkeypatch, capsys):
    from slotmap import workshop

    monkeypatch.setattr(workshop.os, "geteuid", lambda: 0)
    monkeypatch.setattr(workshop, "sync_course", lambda *a: pytest.fail("synced as root"))
    assert workshop.learner_server([]) == 2
    assert "never runs as root" in capsys.readouterr().out


def test_the_name_rules_and_reserved_names(tmp_path):
    from slotmap.workshop import accounts

    for good in ("ada", "zhangwei", "w2", "a" * 31):
        assert accounts.name_problem(good) == "", good
    assert accounts.name_problem("Ada") == ""  # lower-cased, as the hub does
    for bad in ("zhang_wei", "2ada", "ada.b", "a" * 32, "", "ada bob", "ädä"):
        assert "lower-case letters (a-z) and digits" in accounts.name_problem(bad), bad
    for reserved in ("root", "ROOT", "Root", "nobody", "daemon", "admin", "www"):
        assert "reserved" in accounts.name_problem(reserved), reserved
    (tmp_path / "login.defs").write_text("# UID_MIN 5\nUID_MIN\t\t 2000\nUID_MAX 60000\n")
    assert accounts.uid_min(tmp_path / "login.defs") == 2000
    assert accounts.uid_min(tmp_path / "missing") == 1000


def test_the_login_pages_refusals_speak_the_hubs_language():
    from slotmap import i18n
    from slotmap.workshop import accounts

    i18n.use("zh")
    try:
        broken = accounts.name_problem("zhang_wei")
        reserved = accounts.name_problem("root")
        rules = i18n.tr(accounts.NAME_RULES)
    finally:
        i18n.use("en")
    assert broken == f"“zhang_wei”在这里不是合法的用户名：{rules}。"
    assert "请输入 zhangwei" in rules and "保留名" in reserved


def _system_user(name: str) -> int:
    import subprocess

    subprocess.run(["useradd", "--create-home", name], check=True, capture_output=True)
    import pwd

    return pwd.getpwnam(name).pw_uid


@pytest.fixture
def system_users():
    """Make real system users (as root only) and delete them, with their homes, after."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("needs root: makes real system users")
    made: list[str] = []

    def make(name: str) -> int:
        made.append(name)
        return _system_user(name)

    yield make
    for name in made:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


def test_only_accounts_the_hub_created_may_log_in_or_spawn(tmp_path, system_users):
    import pwd

    from slotmap.workshop import accounts

    suffix = os.urandom(2).hex()
    registry = accounts.Registry(tmp_path / "state" / accounts.REGISTRY_FILE)
    outsider = f"other{suffix}"
    system_users(outsider)
    for name in ("root", "nobody", "daemon", "bin"):  # existing system accounts
        assert accounts.account_problem(name, registry) != "", name
    assert "not one this workshop created" in accounts.account_problem(outsider, registry)
    with pytest.raises(PermissionError):
        accounts.prepare_account(outsider, registry)
    with pytest.raises(PermissionError):
        accounts.prepare_account("root", registry, admins={"root"})  # not even as an admin
    # A new name: the hub creates it (0700 home), records it, and it may log in again.
    learner = f"ada{suffix}"
    try:
        assert accounts.account_problem(learner, registry) == ""
        account = accounts.prepare_account(learner, registry)
        assert account.pw_uid >= accounts.uid_min()
        assert registry.created() == {learner: account.pw_uid}
        assert os.stat(account.pw_dir).st_mode & 0o777 == 0o700
        assert os.stat(registry.path).st_mode & 0o777 == 0o600
        assert accounts.account_problem(learner, registry) == ""
        assert accounts.prepare_account(learner, registry).pw_uid == account.pw_uid
    finally:
        import subprocess

        subprocess.run(["userdel", "--remove", learner], check=False, capture_output=True)
    # Deleted and made again by someone else: another uid, no longer the hub's.
    system_users(learner)
    registry.add(learner, account.pw_uid + 7)
    assert pwd.getpwnam(learner).pw_uid != account.pw_uid + 7
    assert "not one this workshop created" in accounts.account_problem(learner, registry)
    # An instructor named in the configuration may be an existing person's account.
    assert accounts.account_problem(outsider, registry, admins={outsider}) == ""
    assert "system account" in accounts.account_problem("daemon", registry, admins={"daemon"})


def _notebook(text: str) -> bytes:
    return json.dumps({"cells": [{"cell_type": "code", "source": text}]}).encode()


def test_collect_copies_only_each_learners_own_regular_files(tmp_path, system_users, capsys):
    """Real learners: a symlink to a classmate's notebook, one to /dev/zero, a FIFO, a huge
    file and a file root owns are skipped, each with why; what is copied is root's only."""
    from slotmap.cli import main
    from slotmap.workshop import accounts, collect

    suffix = os.urandom(2).hex()
    ada, bob, cy = (f"{name}{suffix}" for name in ("ada", "bob", "cy"))
    registry = accounts.Registry(tmp_path / "state" / accounts.REGISTRY_FILE)
    work = {}
    for name in (ada, bob, cy):
        uid = system_users(name)
        registry.add(name, uid)
        import pwd

        home = Path(pwd.getpwnam(name).pw_dir)
        work[name] = home / "slotmap-course" / "my_work"
        work[name].mkdir(parents=True)
        for path in (home / "slotmap-course", work[name]):
            os.chown(path, uid, uid)

    def own(name: str, path: Path) -> None:
        uid = registry.created()[name]
        os.lchown(path, uid, uid)

    solved = _notebook("def slot_of(): return 42")
    (work[ada] / "01_paged_kv_cache.ipynb").write_bytes(solved)
    own(ada, work[ada] / "01_paged_kv_cache.ipynb")
    # bob: his 01 is a link to ada's; a link to /dev/zero; a FIFO; a huge file; root's file.
    (work[bob] / "01_paged_kv_cache.ipynb").symlink_to(work[ada] / "01_paged_kv_cache.ipynb")
    (work[bob] / "02_zero.ipynb").symlink_to("/dev/zero")
    os.mkfifo(work[bob] / "03_fifo.ipynb")
    with open(work[bob] / "04_huge.ipynb", "wb") as huge:
        huge.truncate(collect.MAX_BYTES + 1)
    for name in ("01_paged_kv_cache.ipynb", "02_zero.ipynb", "03_fifo.ipynb", "04_huge.ipynb"):
        own(bob, work[bob] / name)
    (work[bob] / "05_roots.ipynb").write_bytes(_notebook("x = 1"))
    # cy: a byte-for-byte copy of ada's work (a plain file of cy's own).
    (work[cy] / "01_paged_kv_cache.ipynb").write_bytes(solved)
    own(cy, work[cy] / "01_paged_kv_cache.ipynb")

    into = tmp_path / "collected"
    code = main(["workshop", "collect", "--into", str(into), "--state", str(tmp_path / "state")])
    out = capsys.readouterr().out
    assert code == 1, out
    assert (into / ada / "01_paged_kv_cache.ipynb").read_bytes() == solved
    assert (into / cy / "01_paged_kv_cache.ipynb").read_bytes() == solved
    assert sorted(p.name for p in (into / bob).iterdir()) == []
    for folder in (into, into / ada, into / bob):
        assert os.lstat(folder).st_mode & 0o777 == 0o700
    for path in (into / ada / "01_paged_kv_cache.ipynb", into / collect.MANIFEST):
        assert os.lstat(path).st_mode & 0o777 == 0o600
    assert f"skipped   {bob} 01_paged_kv_cache.ipynb: a symbolic link (not followed)" in out
    assert f"skipped   {bob} 02_zero.ipynb: a symbolic link (not followed)" in out
    assert f"skipped   {bob} 03_fifo.ipynb: a FIFO, not a regular file" in out
    assert f"skipped   {bob} 04_huge.ipynb: {collect.MAX_BYTES + 1} bytes, over the cap" in out
    assert f"skipped   {bob} 05_roots.ipynb: owned by uid 0, not by the learner" in out

    # confirm flags bob's link and the copy, not ada's and cy's untouched stubs.
    room = {"exercises": ["01.slot_of"], "learners": []}
    for name in (ada, bob, cy):
        cells = {"01.slot_of": {"state": "pass", "message": ""}}
        room["learners"].append({"learner": name, "idle_seconds": 1, "cells": cells})
    grades = [
        {"notebook": f"{name}/01_paged_kv_cache.ipynb", "results": {"01.slot_of": "PASS"}}
        for name in (ada, cy)
    ]
    (tmp_path / "room.json").write_text(json.dumps(room))
    (tmp_path / "grades.json").write_text(json.dumps(grades))
    arguments = ["--room", str(tmp_path / "room.json"), "--grades", str(tmp_path / "grades.json")]
    assert main(["workshop", "confirm", *arguments, "--collected", str(into)]) == 1
    out = capsys.readouterr().out
    assert f"{bob} 01.slot_of: the room says pass, slotmap grade says not graded" in out
    assert f"{bob} 01_paged_kv_cache.ipynb: not collected: a symbolic link" in out
    assert f"{ada}, {cy} 01_paged_kv_cache.ipynb: the same file, byte for byte" in out


def test_collect_takes_a_chinese_learners_copies_and_never_a_linked_folder(
    tmp_path, system_users, capsys
):
    """A learner who worked in Chinese has their work in my_work/zh_CN: it is collected (and
    holds the room's passes); a zh_CN that is a link to a classmate's folder is not followed."""
    import pwd

    from slotmap.cli import main
    from slotmap.workshop import accounts

    suffix = os.urandom(2).hex()
    ada, bob = f"ada{suffix}", f"bob{suffix}"
    registry = accounts.Registry(tmp_path / "state" / accounts.REGISTRY_FILE)
    chinese = {}
    for name in (ada, bob):
        uid = system_users(name)
        registry.add(name, uid)
        course = Path(pwd.getpwnam(name).pw_dir) / "slotmap-course"
        chinese[name] = course / "my_work" / "zh_CN"
        if name == ada:
            chinese[name].mkdir(parents=True)
            (chinese[name] / "01_paged_kv_cache.ipynb").write_bytes(_notebook("ada 的答案"))
        else:
            chinese[name].parent.mkdir(parents=True)
            chinese[name].symlink_to(chinese[ada])
        for path in (course, *course.rglob("*")):
            os.lchown(path, uid, uid)

    into = tmp_path / "collected"
    code = main(["workshop", "collect", "--into", str(into), "--state", str(tmp_path / "state")])
    out = capsys.readouterr().out
    assert code == 1, out
    copy = into / ada / "zh_CN" / "01_paged_kv_cache.ipynb"
    assert copy.read_bytes() == _notebook("ada 的答案")
    assert os.lstat(copy).st_mode & 0o777 == 0o600
    assert os.lstat(copy.parent).st_mode & 0o777 == 0o700
    assert f"skipped   {bob} zh_CN: zh_CN: cannot open as a folder without following" in out
    assert not (into / bob / "zh_CN").exists()

    # The room's pass for ada holds: slotmap grade graded her Chinese notebook.
    cells = {"01.slot_of": {"state": "pass", "message": ""}}
    room = {"learners": [{"learner": ada, "idle_seconds": 1, "cells": cells}]}
    grades = [
        {"notebook": f"{ada}/zh_CN/01_paged_kv_cache.ipynb", "results": {"01.slot_of": "PASS"}}
    ]
    (tmp_path / "room.json").write_text(json.dumps(room))
    (tmp_path / "grades.json").write_text(json.dumps(grades))
    arguments = ["--room", str(tmp_path / "room.json"), "--grades", str(tmp_path / "grades.json")]
    assert main(["workshop", "confirm", *arguments]) == 0, capsys.readouterr().out


def test_the_systemd_unit_keeps_learners_across_a_restart():
    import configparser

    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read(ROOT / "workshop" / "slotmap-hub.service")
    service = parser["Service"]
    assert service["ExecStart"].split() == [
        "/opt/slotmap/.venv/bin/jupyterhub",
        "-f",
        "/opt/slotmap/workshop/jupyterhub_config.py",
    ]
    # Only the hub is stopped: the learners' servers are in its cgroup and must live on.
    assert service["KillMode"] == "process"
    assert int(service["TimeoutStopSec"]) <= 30
    assert service["Restart"] in ("on-failure", "always")
    assert service["StateDirectory"] == "slotmap-hub" and service["StateDirectoryMode"] == "0700"
    environment = service["Environment"].split()
    assert environment == ["SLOTMAP_HUB_STATE=/var/lib/slotmap-hub", "SLOTMAP_HUB_PROXY=external"]
    assert service["WorkingDirectory"] == "/var/lib/slotmap-hub"
    assert service["EnvironmentFile"] == "/etc/slotmap-hub.env"
    assert parser["Install"]["WantedBy"] == "multi-user.target"
    # The proxy is the other unit's: a hub restart leaves the learners' routes answering.
    assert "slotmap-proxy.service" in parser["Unit"]["Wants"].split()
    assert "slotmap-proxy.service" in parser["Unit"]["After"].split()
    assert proxy.external(dict(e.split("=", 1) for e in environment))

    proxy_unit = configparser.ConfigParser(interpolation=None, strict=False)
    proxy_unit.optionxform = str
    proxy_unit.read(ROOT / "workshop" / "slotmap-proxy.service")
    service = proxy_unit["Service"]
    assert service["ExecStart"].split() == [
        "/opt/slotmap/.venv/bin/slotmap",
        "workshop",
        "proxy",
    ]
    assert service["EnvironmentFile"] == "/etc/slotmap-hub.env"  # the token the hub has
    assert service["DynamicUser"] == "yes"  # never root
    assert service["Restart"] in ("on-failure", "always")
    assert proxy_unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_proxy_apart_listens_where_the_hub_expects_it(monkeypatch, tmp_path, capsys):
    ports = proxy.Ports.from_environment(
        {
            "SLOTMAP_HUB_PORT": "9000",
            "SLOTMAP_HUB_API_PORT": "9081",
            "SLOTMAP_HUB_PROXY_API_PORT": "9001",
        }
    )
    command = proxy.proxy_command(ports, "chp")
    assert command[command.index("--port") + 1] == "9000"
    assert command[command.index("--api-ip") + 1] == "127.0.0.1"
    assert command[command.index("--api-port") + 1] == "9001"
    assert command[command.index("--error-target") + 1] == "http://127.0.0.1:9081/hub/error"
    # No token, or a short one: refused before anything starts.
    for token in ("", "short"):
        assert proxy.run_proxy({"CONFIGPROXY_AUTH_TOKEN": token}) == 2
        assert "CONFIGPROXY_AUTH_TOKEN" in capsys.readouterr().err


def test_the_hub_leaves_an_external_proxy_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTMAP_HUB_PROXY", "external")
    monkeypatch.setenv("SLOTMAP_HUB_PROXY_API_PORT", "9001")
    (tmp_path / "a").mkdir()
    config = _load_hub_config(tmp_path / "a", monkeypatch)
    assert config.ConfigurableHTTPProxy.should_start is False
    assert config.ConfigurableHTTPProxy.api_url == "http://127.0.0.1:9001"
    monkeypatch.delenv("SLOTMAP_HUB_PROXY")
    (tmp_path / "b").mkdir()
    config = _load_hub_config(tmp_path / "b", monkeypatch)
    assert "should_start" not in config.ConfigurableHTTPProxy


def _load_hub_config(tmp_path, monkeypatch) -> object:
    """workshop/jupyterhub_config.py as JupyterHub loads it (its own loader)."""
    pytest.importorskip("jupyterhub")
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.setenv("SLOTMAP_HUB_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("SLOTMAP_HUB_PASSWORD", "room-password")
    (tmp_path / "state").mkdir(mode=0o755)
    (tmp_path / "state" / "jupyterhub.sqlite").write_text("")
    os.chmod(tmp_path / "state" / "jupyterhub.sqlite", 0o644)  # an older hub's
    umask = os.umask(0o022)
    try:
        return PyFileConfigLoader("jupyterhub_config.py", str(ROOT / "workshop")).load_config()
    finally:
        os.umask(umask)


def test_the_hub_config_keeps_servers_culls_kernels_and_closes_its_state(tmp_path, monkeypatch):
    config = _load_hub_config(tmp_path, monkeypatch)
    assert config.JupyterHub.cleanup_servers is False
    args = config.Spawner.args
    assert "--MappingKernelManager.cull_idle_timeout=1800" in args
    assert "--MappingKernelManager.cull_connected=True" in args
    assert "--LabApp.news_url=None" in args
    state = tmp_path / "state"
    assert os.stat(state).st_mode & 0o777 == 0o700
    assert os.stat(state / "jupyterhub.sqlite").st_mode & 0o777 == 0o600
    assert config.JupyterHub.db_url == f"sqlite:///{state / 'jupyterhub.sqlite'}"
    assert config.JupyterHub.cookie_secret_file == str(state / "jupyterhub_cookie_secret")
    assert "lower-case letters" in config.JupyterHub.template_vars["announcement_login"]


def test_the_hub_config_wires_the_records_learners_post_to_the_dashboard(tmp_path, monkeypatch):
    """One scope and one address at both ends: the learners' servers post where the dashboard
    listens, with a token that holds the scope on top of the server role's; the dashboard reads
    files, posted records or both, as $SLOTMAP_HUB_DASHBOARD_SOURCES says."""
    from urllib.parse import urlparse

    from jupyterhub.roles import get_default_roles

    from slotmap.exercises.progress import RECORDS_URL_VARIABLE
    from slotmap.workshop.records import RECORDS_PATH, RECORDS_SCOPE, STORE_VARIABLE

    monkeypatch.setenv("SLOTMAP_HUB_DASHBOARD_PORT", "8123")
    config = _load_hub_config(tmp_path, monkeypatch)
    assert list(config.JupyterHub.custom_scopes) == [RECORDS_SCOPE]
    server_role = next(r for r in get_default_roles() if r["name"] == "server")
    assert config.Spawner.server_token_scopes == [*server_role["scopes"], RECORDS_SCOPE]
    roles = {role["name"]: role for role in config.JupyterHub.load_roles}
    assert roles["user"]["scopes"] == ["self", RECORDS_SCOPE]
    (dashboard,) = [s for s in config.JupyterHub.services if "url" in s]
    posted = urlparse(config.Spawner.environment[RECORDS_URL_VARIABLE])
    assert posted.netloc == urlparse(dashboard["url"]).netloc == "127.0.0.1:8123"
    assert posted.path == f"/services/{dashboard['name']}/{RECORDS_PATH}"
    environment = dashboard["environment"]
    assert environment[STORE_VARIABLE] == str(tmp_path / "state" / "dashboard-records")
    assert "{username}" in environment["SLOTMAP_HUB_WORKSPACES"]

    monkeypatch.setenv("SLOTMAP_HUB_DASHBOARD_SOURCES", "posted")
    (tmp_path / "b").mkdir()
    environment = _load_hub_config(tmp_path / "b", monkeypatch).JupyterHub.services[1]
    assert STORE_VARIABLE in environment["environment"]
    assert "SLOTMAP_HUB_WORKSPACES" not in environment["environment"]
    monkeypatch.setenv("SLOTMAP_HUB_DASHBOARD_SOURCES", "files")
    (tmp_path / "c").mkdir()
    config = _load_hub_config(tmp_path / "c", monkeypatch)
    assert STORE_VARIABLE not in config.JupyterHub.services[1]["environment"]
    assert RECORDS_URL_VARIABLE not in config.Spawner.environment
    monkeypatch.setenv("SLOTMAP_HUB_DASHBOARD_SOURCES", "homes")
    (tmp_path / "d").mkdir()
    with pytest.raises(SystemExit, match="SLOTMAP_HUB_DASHBOARD_SOURCES"):
        _load_hub_config(tmp_path / "d", monkeypatch)


def test_a_learners_lab_asks_nothing_about_news_and_keeps_their_own_choice(tmp_path):
    from slotmap.workshop import LAB_NOTIFICATIONS, quiet_lab_settings

    quiet_lab_settings(tmp_path)
    assert json.loads((tmp_path / LAB_NOTIFICATIONS).read_text()) == {
        "fetchNews": "false",
        "checkForUpdates": False,
    }
    (tmp_path / LAB_NOTIFICATIONS).write_text('{"fetchNews": "true"}')
    quiet_lab_settings(tmp_path)
    assert json.loads((tmp_path / LAB_NOTIFICATIONS).read_text()) == {"fetchNews": "true"}


def _closed_venv(tmp_path: Path) -> tuple[Path, Path]:
    """(a folder only root enters, as a 0700 /root is; a venv in it), for root's test only."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or not shutil.which("make"):
        pytest.skip("the refusal is root's (only root runs a room of system users)")
    closed = tmp_path / "root-like"
    closed.mkdir(mode=0o700)
    venv = closed / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--copies", str(venv)], check=True
    )
    return closed, venv


def _make_hub(venv: Path):  # noqa: ANN202
    import subprocess

    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "hub", f"VENV={venv}"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_make_hub_refuses_an_environment_learners_cannot_run(tmp_path):
    """A Python under a folder only root enters (pyenv or conda in a 0700 /root): as root,
    `make hub` stops with the reason and the fix instead of building a hub whose every
    learner's first login fails."""
    closed, venv = _closed_venv(tmp_path)
    (venv / ".slotmap-cpu.stamp").touch()  # set up already: only the hub's part is left
    made = _make_hub(venv)
    assert made.returncode != 0
    assert f"{closed} (mode 700) is closed to other users" in made.stderr
    assert f"rm -rf {venv} && make hub PYTHON=/usr/bin/python3.11" in made.stderr
    assert not (venv / ".workshop-hub.stamp").exists()


def test_make_hub_refuses_a_closed_python_before_installing_anything(tmp_path):
    """The refusal comes first on a new environment too: `make hub PYTHON=<pyenv under
    /root>` must not spend minutes installing torch and the course into an environment it
    then refuses (found by benchmarks/fresh_vm_walkthrough.py)."""
    closed, venv = _closed_venv(tmp_path)
    made = _make_hub(venv)
    assert made.returncode != 0
    assert f"{closed} (mode 700) is closed to other users" in made.stderr
    assert "pip install" not in made.stdout + made.stderr  # nothing was installed first
    assert not list(venv.glob(".slotmap-*.stamp"))


def _walkthrough():
    """benchmarks/fresh_vm_walkthrough.py as a module (a script, not a package)."""
    import importlib.util

    path = ROOT / "benchmarks" / "fresh_vm_walkthrough.py"
    spec = importlib.util.spec_from_file_location("fresh_vm_walkthrough", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fresh_vm_walkthrough_types_the_readmes_own_lines():
    """The walkthrough (run as root with the network, never in CI) runs the README's block as
    written: every step an instructor types is found in it, in order, and only the clone's
    source and the foreground hub are changed."""
    walk = _walkthrough()
    block = walk.readme_block((ROOT / "workshop" / "README.md").read_text(encoding="utf-8"))
    wanted = ["apt-get install", "git clone", "make hub", "SLOTMAP_HUB_PASSWORD=", "openssl rand"]
    wanted += ["workshop preflight", "jupyterhub -f workshop/jupyterhub_config.py"]
    found = [next(i for i, line in enumerate(block) if w in line) for w in wanted]
    assert found == sorted(found), block
    assert "python3.11-venv" in block[found[0]]
    typed = [walk.typed(line) for line in block]
    assert [t for t, line in zip(typed, block, strict=True) if t != line] == [
        typed[found[1]],
        typed[found[-1]],
    ]
    assert walk.CLONE_SOURCE in typed[found[1]] and typed[found[-1]].endswith("echo hub-pid $!")


def test_the_readmes_fresh_vm_timings_are_the_committed_walkthroughs():
    """workshop/README.md's minutes from a fresh machine are the ones the walkthrough wrote
    (benchmarks/results/fresh-vm-walkthrough.json), rounded as the README writes them."""
    results = json.loads(
        (ROOT / "benchmarks" / "results" / "fresh-vm-walkthrough.json").read_text("utf-8")
    )
    readme = " ".join((ROOT / "workshop" / "README.md").read_text(encoding="utf-8").split())

    def minutes(run: str, command: str) -> str:
        seconds = next(s["seconds"] for s in results[run]["steps"] if command in s["command"])
        return f"{seconds / 60:.1f}"

    alone = f"{results['usr-cold-alone']['to_first_check_s'] / 60:.1f}"
    assert f"{alone} minutes from an empty disk to the first learner's first check" in readme
    npm = minutes("usr-cold-alone", "nodejs npm")
    hub, preflight = minutes("usr-cold-alone", "make hub"), minutes("usr-cold-alone", "preflight")
    assert f"(`nodejs` and `npm` {npm} minutes, `make hub` {hub}, the pre-flight {preflight})" in (
        readme
    )
    shared = f"{results['usr']['to_first_check_s'] / 60:.1f}"
    assert f"{shared} minutes when two walkthroughs and other people's tests shared" in readme
    assert results["root-python"]["to_first_check_s"]  # (b) reached the first check too


def _chinese_course(folder: Path) -> Path:
    """A small course in both languages: exercise 01 and lesson 01, and their Chinese."""
    course = _course(folder, {"01_a.ipynb": "exercise 1"}, {"01_a.ipynb": "lesson 1"})
    (course / "exercises" / "zh_CN").mkdir()
    (course / "notebooks" / "zh_CN").mkdir()
    notebook = {"cells": [{"cell_type": "code", "id": "slotmap-banner", "source": "练习 1"}]}
    (course / "exercises" / "zh_CN" / "01_a.ipynb").write_text(json.dumps(notebook))
    (course / "notebooks" / "zh_CN" / "01_a.ipynb").write_text("第 1 课")
    return course


def test_a_learner_switching_language_keeps_the_work_of_both(tmp_path):
    from slotmap.workshop import sync_course

    source = _chinese_course(tmp_path / "source")
    mine = tmp_path / "ada" / "slotmap-course"
    messages = sync_course(source, mine)  # English: no Chinese copies
    assert not (mine / "my_work" / "zh_CN").exists()
    messages = sync_course(source, mine, "zh_CN")
    assert f"new  {mine / 'my_work' / 'zh_CN' / '01_a.ipynb'}" in messages
    assert "练习 1" not in (mine / "my_work" / "01_a.ipynb").read_text()
    assert (mine / "notebooks" / "zh_CN" / "01_a.ipynb").read_text() == "第 1 课"
    (mine / "my_work" / "01_a.ipynb").write_text("ada's answer")
    (mine / "my_work" / "zh_CN" / "01_a.ipynb").write_text("ada 的答案")
    for lang in ("en", "zh_CN", "en"):
        sync_course(source, mine, lang)
        assert (mine / "my_work" / "01_a.ipynb").read_text() == "ada's answer"
        assert (mine / "my_work" / "zh_CN" / "01_a.ipynb").read_text() == "ada 的答案"


def test_a_chinese_learners_server_has_jupyterlab_and_the_lessons_in_chinese(
    tmp_path, monkeypatch
):
    from slotmap import workshop
    from slotmap.lab import LOCALE_PLUGIN

    source = _chinese_course(tmp_path / "source")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    monkeypatch.setenv("SLOTMAP_COURSE_SOURCE", str(source))
    monkeypatch.setattr(workshop.os, "geteuid", lambda: 1000)  # the learner, not root
    monkeypatch.delenv("SLOTMAP_WORKSPACE", raising=False)  # the server sets both
    monkeypatch.delenv("JUPYTERLAB_SETTINGS_DIR", raising=False)
    started = []

    def exec_server(path, command):  # the server itself is the real-hub test's
        started.append((command, dict(os.environ)))

    monkeypatch.setattr(workshop.os, "execv", exec_server)
    monkeypatch.chdir(tmp_path)
    for lang in ("zh_CN", "en"):
        monkeypatch.setenv("SLOTMAP_LANG", lang)
        assert workshop.learner_server([]) == 0
    (chinese, environment), (english, _) = started
    course = tmp_path / "home" / "slotmap-course"
    assert environment["SLOTMAP_LANG"] == "zh_CN"
    assert environment["SLOTMAP_WORKSPACE"] == str(course / "my_work")
    assert (course / "my_work" / "zh_CN" / "01_a.ipynb").is_file()
    assert "--LabApp.default_url=/lab/tree/notebooks/zh_CN" in chinese
    settings = [option for option in chinese if option.startswith("--LabApp.app_settings_dir=")]
    assert len(settings) == 1
    overrides = Path(settings[0].split("=", 1)[1]) / "overrides.json"
    assert json.loads(overrides.read_text())[LOCALE_PLUGIN]["locale"] == "zh_CN"
    # Back in English: the English lessons and menus, and the Chinese copies still there.
    assert "--LabApp.default_url=/lab/tree/notebooks" in english
    assert not [option for option in english if "app_settings_dir" in option]
    assert (course / "my_work" / "zh_CN" / "01_a.ipynb").is_file()


def test_the_hub_asks_each_learner_english_or_chinese(tmp_path, monkeypatch):
    import asyncio
    import re

    from jupyterhub.spawner import SimpleLocalProcessSpawner
    from tornado.web import HTTPError

    monkeypatch.setenv("SLOTMAP_HUB_HOMES", str(tmp_path / "homes" / "{username}"))
    monkeypatch.setenv("SLOTMAP_HUB_LANG", "zh")  # the room's default
    monkeypatch.setenv("SLOTMAP_LANG", "zh_CN")  # the instructor's, who starts the hub
    config = _load_hub_config(tmp_path, monkeypatch)

    def spawner(user_options: dict) -> SimpleLocalProcessSpawner:
        made = SimpleLocalProcessSpawner(config=config, user_options=user_options)
        made.user = SimpleNamespace(name="ada")  # what the hook reads of the hub's user
        return made

    def offered(user_options: dict) -> dict[str, bool]:
        form = asyncio.run(spawner(user_options).get_options_form())
        choices = re.findall(
            r'<input type="radio" name="lang" value="([^"]+)"[^>]*?( checked)?>', form
        )
        return {value: bool(checked) for value, checked in choices}

    # Never chose: the room's language; the last choice after that, whatever the room's.
    assert offered({}) == {"en": False, "zh_CN": True}
    assert offered({"lang": "en"}) == {"en": True, "zh_CN": False}
    assert offered({"lang": "klingon"}) == {"en": False, "zh_CN": True}
    form = asyncio.run(spawner({}).get_options_form())
    assert "English" in form and "中文" in form
    assert spawner({}).run_options_from_form({"lang": ["zh_CN"]}) == {"lang": "zh_CN"}
    assert spawner({}).run_options_from_form({"lang": ["en"]}) == {"lang": "en"}
    with pytest.raises(ValueError):
        spawner({}).run_options_from_form({"lang": ["klingon"]})

    # The server of a learner who chose Chinese, and of one who chose English (the hub
    # applies the options, then runs the pre-spawn hook).
    def apply(options: dict) -> SimpleLocalProcessSpawner:
        made = spawner(options)
        asyncio.run(made._run_apply_user_options(made.user_options))
        made.run_pre_spawn_hook()
        return made

    chinese = apply({"lang": "zh_CN"})
    assert chinese.environment["SLOTMAP_LANG"] == "zh_CN"
    assert chinese.environment["SLOTMAP_COURSE_SOURCE"] == str(ROOT)
    assert chinese.default_url == "/lab/tree/my_work/zh_CN"
    english = apply({"lang": "en"})
    assert english.environment["SLOTMAP_LANG"] == "en"
    assert english.default_url == "/lab/tree/my_work"
    # A REST start without options: the room's language.
    default = apply({})
    assert default.environment["SLOTMAP_LANG"] == "zh_CN"
    with pytest.raises(HTTPError) as refused:  # a REST request's body, not the form's
        apply({"lang": "klingon"})
    assert refused.value.status_code == 400

    # The dashboard speaks the hub's language (the instructor's), not a learner's.
    services = {service["name"]: service for service in config.JupyterHub.services}
    assert services["workshop-dashboard"]["environment"]["SLOTMAP_LANG"] == "zh_CN"


def test_the_hub_refuses_a_room_language_the_course_does_not_have(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTMAP_HUB_LANG", "fr")
    with pytest.raises(SystemExit, match="SLOTMAP_HUB_LANG"):
        _load_hub_config(tmp_path, monkeypatch)
