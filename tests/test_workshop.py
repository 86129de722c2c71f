"""The workshop's pieces without a hub: where a learner's work lives, the course copy each
learner gets (two learners, an update), the progress records and the dashboard's table.
tests/test_workshop_hub.py runs them together on a real JupyterHub."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

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

    # 10 learners: 8 GB for a server and a kernel each, 20 GB with lesson 05's three ranks.
    assert Memory(10, 32).line().endswith(": OK")
    tight = Memory(10, 12)
    assert tight.ok and tight.line().endswith("TIGHT, only 6 can run lessons 05 and 07 at once")
    short = Memory(10, 6)
    assert not short.ok and short.line().endswith("NOT ENOUGH, room for 7 learners")


def test_preflight_cpu_advice():
    from slotmap.workshop.preflight import cpu_line

    assert cpu_line(16, 2).endswith(": OK")
    assert "SLOW" in cpu_line(30, 2) and "about 16 learners" in cpu_line(30, 2)


def test_preflight_fails_when_the_doctor_does(monkeypatch, capsys):
    import subprocess

    from slotmap.workshop import preflight

    monkeypatch.setattr(preflight, "hub_pieces", lambda: [])
    monkeypatch.setattr(preflight, "available_gb", lambda: 100.0)
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
    assert command[1:3] == ["-m", "jupyterhub.singleuser"] and command[-1] == "--debug"
    assert f"--ServerApp.root_dir={course.resolve()}" in command
    assert "--ContentsManager.pre_save_hook=slotmap.lab.keep_course_notebooks_clean" in command
    # The hub says where the server listens: not the lab's loopback default.
    assert not [option for option in command if option.startswith("--ServerApp.ip")]
