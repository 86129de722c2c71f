"""Attacks on ``slotmap grade`` by a hostile learner: faked results, tampering with the grading,
killing the grader, a fork bomb, an output flood, a hung notebook.

Every notebook here is tiny and built in the test; the checks are exercise 01's real ones
(``01.slot_of`` is fast), so a result can only come from the course's checking code. The
submission is a stub (or a wrong answer) wherever an attack tries to make it pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("nbclient")

from slotmap.exercises import sandbox  # noqa: E402
from slotmap.exercises.core import CHECK_MIME  # noqa: E402
from slotmap.exercises.grade import (  # noqa: E402
    PACKAGE,
    GradeOptions,
    grade_folder,
)

ROOT_ONLY = pytest.mark.skipif(not sandbox.is_root(), reason="kernels get a user of their own")

IMPORT = "from slotmap.exercises import check"
GOOD = "def slot_of(p, row, size):\n    return row[p // size] * size + p % size"
STUB = "def slot_of(p, row, size):\n    # YOUR CODE HERE\n    raise NotImplementedError()"
CHECK = 'check("01.slot_of", slot_of);'
PASS_RECORD = {"exercise": "01.slot_of", "passed": True}


def cell(kind: str, source: str, cell_id: str, **extra: object) -> dict:
    out = {"cell_type": kind, "id": cell_id, "metadata": {}, "source": source}
    if kind == "code":
        out.update(outputs=[], execution_count=None)
    out.update(extra)
    return out


def saved(record: dict) -> list[dict]:
    """A saved output that shows a check result, as an executed notebook keeps it."""
    return [{"output_type": "display_data", "metadata": {}, "data": {CHECK_MIME: record}}]


def notebook(*cells: dict) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def submission(*middle: dict, answer: str = STUB, after: tuple[dict, ...] = ()) -> dict:
    """The exercise's shape: import, answer, [attack cells], the check cell, [cells after]."""
    return notebook(
        cell("code", IMPORT, "imports"),
        cell("code", answer, "answer"),
        *middle,
        cell("code", CHECK, "check-slot-of"),
        *after,
    )


SOLUTION = notebook(
    cell("code", IMPORT, "imports"),
    cell("code", GOOD, "answer"),
    cell("code", CHECK, "check-slot-of"),
)


def write(folder: Path, notebooks: dict[str, dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, nb in notebooks.items():
        (folder / name).write_text(json.dumps(nb))
    return folder


def solutions(tmp: Path) -> Path:
    return write(tmp / "solutions", {"01_x.ipynb": SOLUTION})


def grade(tmp: Path, notebooks: dict[str, dict], **options: object) -> dict:
    folder = write(tmp / "submissions", notebooks)
    options.setdefault("timeout", 120)
    grades = grade_folder(folder, solutions=solutions(tmp), options=GradeOptions(**options))
    return {g.notebook: g for g in grades}


# ---------------------------------------------------------------------------------------------
# Faked results: every route, graded in one run (two at a time)
# ---------------------------------------------------------------------------------------------
# Doctors the checking code as the kernel reads it: every result a pass.
DOCTORED_OPEN = """
import builtins, io
_open = builtins.open
def open(path, *args, **kwargs):
    handle = _open(path, *args, **kwargs)
    if str(path).endswith("gradecheck.py"):
        return io.StringIO(handle.read().replace("result.passed is True", "True"))
    return handle
"""
PATCHED_EXEC = """
import builtins
_exec = builtins.exec
def exec(source, *args):
    if isinstance(source, str):
        source = source.replace("result.passed is True", "True")
    return _exec(source, *args)
builtins.exec = exec
"""
# Re-signs every check result the kernel displays as a pass, with a secret found in the kernel.
FORGE = """
import re, hmac
_shell = get_ipython()
_publish = _shell.display_pub.publish
def forge(text):
    found = re.search(r"secret='([0-9a-f]+)'", text or "")
    if not found:
        return
    secret = found.group(1)
    def publish(data, *args, **kwargs):
        record = dict(data.get("application/vnd.slotmap.check+json") or {})
        if record:
            record["passed"] = True
            message = f"{record['exercise']}\\nTrue\\n{record['cell']}"
            record["signature"] = hmac.new(secret.encode(), message.encode(), "sha256").hexdigest()
            data = dict(data, **{"application/vnd.slotmap.check+json": record})
        return _publish(data, *args, **kwargs)
    _shell.display_pub.publish = publish
"""
RUN_CELL_HOOK = """
get_ipython().events.register("pre_run_cell", lambda info: forge(info.raw_cell))
"""
STACK_WALKING_STUB = """
import sys
def slot_of(p, row, size):
    frame = sys._getframe(1)
    while frame is not None:
        forge(repr(frame.f_locals.get("secret")).replace('"', "'").join(["secret=", ""]))
        frame = frame.f_back
    raise NotImplementedError()
"""
IN_READING_STUB = """
def slot_of(p, row, size):
    forge(get_ipython().user_ns["In"][-1])
    raise NotImplementedError()
"""
# A Skipped raised as if by slotmap's own code (its frame names a file of the package).
SKIPPING_STUB = """
import slotmap.exercises.core as core
def slot_of(p, row, size):
    exec(compile("raise core.Skipped('no machine for this')", core.__file__, "exec"))
"""


def faking_notebooks() -> dict[str, dict]:
    """name -> a stub submission that tries to report a pass without passing."""
    display_pass = "from IPython.display import display\n" + (
        f"display({{{CHECK_MIME!r}: {PASS_RECORD!r}}}, raw=True)"
    )
    return {
        # Saved outputs of cells the kernel never runs.
        "skip_tag_01_x.ipynb": submission(
            after=(
                cell(
                    "code",
                    "pass",
                    "skipped",
                    outputs=saved(PASS_RECORD),
                    metadata={"tags": ["skip-execution"]},
                ),
            )
        ),
        "blank_cell_01_x.ipynb": submission(
            after=(cell("code", "  \n", "blank", outputs=saved(PASS_RECORD)),)
        ),
        "markdown_outputs_01_x.ipynb": submission(
            after=(cell("markdown", "done!", "note", outputs=saved(PASS_RECORD)),)
        ),
        "stale_check_output_01_x.ipynb": notebook(
            cell("code", IMPORT, "imports"),
            cell("code", STUB, "answer"),
            cell(
                "code",
                CHECK,
                "check-slot-of",
                outputs=saved(PASS_RECORD),
                metadata={"tags": ["skip-execution"]},
            ),
        ),
        # Results reported by the learner's own code.
        "own_display_01_x.ipynb": submission(after=(cell("code", display_pass, "fake"),)),
        "patched_run_check_01_x.ipynb": submission(
            cell(
                "code",
                (
                    "import slotmap.exercises.core as core\n"
                    "core.run_check = lambda exercise, candidate, **k: "
                    "core.CheckResult(exercise.id, True)"
                ),
                "patch",
            ),
        ),
        "patched_check_name_01_x.ipynb": submission(
            cell(
                "code",
                f"def check(*args, **kwargs):\n    {display_pass.splitlines()[1]}",
                "shadow",
            ),
            after=(cell("code", "import builtins; builtins.check = check", "shadow2"),),
        ),
        "edited_check_cell_01_x.ipynb": notebook(
            cell("code", IMPORT, "imports"),
            cell("code", STUB, "answer"),
            cell(
                "code",
                'check("01.slot_of", lambda p, r, s: r[p // s] * s + p % s)',
                "check-slot-of",
            ),
        ),
        "forged_signature_01_x.ipynb": submission(
            after=(
                cell(
                    "code",
                    display_pass.replace(
                        "'passed': True}", "'passed': True, 'cell': 2, 'signature': '0' * 64}"
                    ),
                    "forge",
                ),
            ),
        ),
        "patched_exercise_registry_01_x.ipynb": submission(
            cell(
                "code",
                (
                    "import dataclasses, hypothesis, slotmap.exercises.core as core\n"
                    "exercise = core.get_exercise('01.slot_of')\n"
                    "core.EXERCISES['01.slot_of'] = dataclasses.replace(\n"
                    "    exercise, cases=lambda: [], strategy=None)\n"
                    "hypothesis.given = lambda *a, **k: (lambda f: (lambda: None))"
                ),
                "patch",
            ),
        ),
        # Controls: the same shape, honest.
        "honest_good_01_x.ipynb": submission(answer=GOOD),
        "honest_stub_01_x.ipynb": submission(),
    }


def judge_route_notebooks() -> dict[str, dict]:
    """name -> a stub submission that takes a route into the judge as it was when the judge
    ran in the kernel (each gave a PASS then); now no judge runs there."""
    return {
        "global_open_01_x.ipynb": submission(cell("code", DOCTORED_OPEN, "open")),
        "patched_exec_01_x.ipynb": submission(cell("code", PATCHED_EXEC, "exec")),
        "run_cell_hook_01_x.ipynb": submission(cell("code", FORGE + RUN_CELL_HOOK, "hook")),
        "stack_walk_01_x.ipynb": submission(
            cell("code", FORGE, "forge"), answer=STACK_WALKING_STUB
        ),
        "in_history_01_x.ipynb": submission(cell("code", FORGE, "forge"), answer=IN_READING_STUB),
        "faked_skip_01_x.ipynb": submission(answer=SKIPPING_STUB),
    }


@pytest.fixture(scope="module")
def faked(tmp_path_factory):
    return grade(tmp_path_factory.mktemp("faking"), faking_notebooks(), jobs=2)


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    return grade(tmp_path_factory.mktemp("routes"), judge_route_notebooks(), jobs=2)


@pytest.mark.parametrize("name", list(judge_route_notebooks()))
def test_a_route_into_the_judge_meets_no_judge(routed, name):
    assert routed[name].results == {"01.slot_of": "FAIL"}, routed[name]


def test_honest_notebooks_grade_as_before(faked):
    assert faked["honest_good_01_x.ipynb"].results == {"01.slot_of": "PASS"}
    assert faked["honest_stub_01_x.ipynb"].results == {"01.slot_of": "FAIL"}
    assert faked["honest_good_01_x.ipynb"].ignored == 0


@pytest.mark.parametrize("name", [n for n in faking_notebooks() if not n.startswith("honest")])
def test_a_faked_result_does_not_pass(faked, name):
    assert faked[name].results == {"01.slot_of": "FAIL"}, faked[name]


@pytest.mark.parametrize("name", ["own_display_01_x.ipynb", "forged_signature_01_x.ipynb"])
def test_a_result_displayed_by_the_learner_is_counted_as_ignored(faked, name):
    assert faked[name].ignored == 1


# ---------------------------------------------------------------------------------------------
# Tampering with the grading: the checking code, other submissions, the report
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def public():
    """A folder every user can reach (pytest's own are root's alone), so that only the grader's
    isolation, not an unreachable path, keeps a kernel from what is in it."""
    folder = Path(tempfile.mkdtemp(prefix="slotmap-attack-"))
    os.chmod(folder, 0o755)
    yield folder
    sandbox.remove_tree(folder)


def _drop(folder: Path) -> Path:
    drop = folder / "drop"
    drop.mkdir()
    os.chmod(drop, 0o777)  # writable by any user: only the attacker's death keeps it empty
    return drop


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(path.as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


@ROOT_ONLY
def test_a_submission_cannot_patch_the_checks_or_delete_a_classmate(public):
    tmp_path = public
    course = tmp_path / "course"
    shutil.copytree(PACKAGE, course / "slotmap", ignore=shutil.ignore_patterns("__pycache__"))
    before = _tree_hash(course)
    submissions = tmp_path / "submissions"
    patch = (
        "\\ndef run_check(exercise, candidate, **kwargs):\\n"
        "    return CheckResult(exercise.id, True)\\n"
    )
    attack = "\n".join(
        [
            "import pathlib, slotmap.exercises.core as core",
            "hits = []",
            f"for target in (pathlib.Path(core.__file__), pathlib.Path({str(course)!r}) / "
            "'slotmap/exercises/core.py'):",
            "    try:",
            f"        target.write_text(target.read_text() + '{patch}')",
            "        hits.append(str(target))",
            "    except OSError:",
            "        pass",
            f"for other in pathlib.Path({str(submissions)!r}).rglob('*.ipynb'):",
            "    try:",
            "        other.unlink()",
            "    except OSError:",
            "        pass",
        ]
    )
    grades = grade(
        tmp_path,
        {
            "a_attacker_01_x.ipynb": submission(cell("code", attack, "attack")),
            "b_victim_01_x.ipynb": submission(answer=GOOD),
            "c_stub_after_01_x.ipynb": submission(),
        },
        package=course / "slotmap",
    )
    assert grades["b_victim_01_x.ipynb"].results == {"01.slot_of": "PASS"}
    assert grades["b_victim_01_x.ipynb"].error == ""
    assert grades["c_stub_after_01_x.ipynb"].results == {"01.slot_of": "FAIL"}
    assert _tree_hash(course) == before
    assert len(list(submissions.glob("*.ipynb"))) == 3


DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open({pid!r}, "w").write(str(os.getpid()))
        while not os.path.exists({go!r}):  # the test says when: after the grading has ended
            time.sleep(0.05)
        for path in ({report!r}, {marker!r}):
            try:
                open(path, "w").write("forged by a daemon")
            except OSError:
                pass
        open({done!r}, "w").write("tried")
        os._exit(0)
    os._exit(0)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _daemon_attack(tmp_path: Path, sandbox_user: bool) -> tuple[Path, Path, bool]:
    from slotmap.cli import main

    drop = _drop(tmp_path)
    report, marker = drop / "grades.json", drop / "marker"
    pid, go, done = drop / "pid", drop / "go", drop / "done"
    daemon = DAEMON.format(
        report=str(report), marker=str(marker), pid=str(pid), go=str(go), done=str(done)
    )
    write(tmp_path / "submissions", {"a_01_x.ipynb": submission(cell("code", daemon, "d"))})
    options = ["--timeout", "120", "--json", str(report), "--solutions", str(solutions(tmp_path))]
    if not sandbox_user:
        os.environ["SLOTMAP_GRADE_SANDBOX_USER"] = "0"
    try:
        assert main(["grade", str(tmp_path / "submissions"), *options]) == 0
    finally:
        os.environ.pop("SLOTMAP_GRADE_SANDBOX_USER", None)
    # The daemon started (it wrote its pid) and is dead now that the grading has ended; were it
    # alive, it would write as soon as it is told to go, and the test waits until it has.
    survived = _running(int(pid.read_text()))
    go.write_text("go")
    if survived:
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return report, marker, survived


@ROOT_ONLY
def test_a_daemon_left_behind_cannot_rewrite_the_report(public):
    report, marker, survived = _daemon_attack(public, sandbox_user=True)
    assert not survived
    assert json.loads(report.read_text())[0]["results"] == {"01.slot_of": "FAIL"}
    assert not marker.exists()


def test_a_daemon_is_killed_without_a_user_of_its_own_too(public):
    report, marker, survived = _daemon_attack(public, sandbox_user=False)
    assert not survived
    assert json.loads(report.read_text())[0]["results"] == {"01.slot_of": "FAIL"}
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# Killing the grader, a fork bomb, an output flood, a hung notebook
# ---------------------------------------------------------------------------------------------
KILL_ANCESTORS = """
import os
pid = os.getppid()
while pid > 1:
    try:
        os.kill(pid, 9)
    except OSError:
        pass
    pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
"""


@ROOT_ONLY
def test_a_kernel_cannot_kill_its_worker_or_the_grader(tmp_path):
    grades = grade(
        tmp_path,
        {
            "a_01_x.ipynb": submission(answer=GOOD),
            "b_killer_01_x.ipynb": submission(cell("code", KILL_ANCESTORS, "kill"), answer=GOOD),
            "c_01_x.ipynb": submission(),
        },
    )
    assert grades["a_01_x.ipynb"].results == {"01.slot_of": "PASS"}
    assert grades["b_killer_01_x.ipynb"].results == {"01.slot_of": "PASS"}
    assert grades["c_01_x.ipynb"].results == {"01.slot_of": "FAIL"}


def test_a_kernel_that_kills_its_worker_loses_only_its_own_notebook(tmp_path):
    # Without a user of its own the kernel can kill its worker, never the grader (its worker's
    # parent); what its check cells reported before that is kept.
    killer = submission(
        answer=GOOD, after=(cell("code", "import os\nos.kill(os.getppid(), 9)", "kill"),)
    )
    grades = grade(
        tmp_path,
        {
            "a_01_x.ipynb": submission(answer=GOOD),
            "b_killer_01_x.ipynb": killer,
            "c_01_x.ipynb": submission(),
        },
        sandbox_user=False,
    )
    assert grades["a_01_x.ipynb"].results == {"01.slot_of": "PASS"}
    assert grades["b_killer_01_x.ipynb"].results == {"01.slot_of": "PASS"}
    assert "worker died" in grades["b_killer_01_x.ipynb"].error
    assert grades["c_01_x.ipynb"].results == {"01.slot_of": "FAIL"}


FORK_BOMB = """
import os, time
forks = 0
for _ in range(300):  # bounded: the process limit must stop it well before
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    forks += 1
open({count!r}, "w").write(str(forks))
"""


@ROOT_ONLY
def test_a_fork_bomb_is_stopped_by_the_process_limit_and_killed(public):
    tmp_path, drop = public, _drop(public)
    bomb = FORK_BOMB.format(count=str(drop / "forks"))
    grades = grade(
        tmp_path,
        {
            "a_bomb_01_x.ipynb": submission(cell("code", bomb, "bomb")),
            "b_01_x.ipynb": submission(answer=GOOD),
        },
        nproc=64,
    )
    assert 0 < int((drop / "forks").read_text()) < 64
    assert grades["b_01_x.ipynb"].results == {"01.slot_of": "PASS"}
    table = sandbox._proc_table()
    assert [pid for pid, (_, uid) in table.items() if uid == sandbox.sandbox_uid(0)] == []


def test_an_output_flood_is_cut_at_the_cap_and_said_in_the_graders_language(tmp_path):
    from slotmap import i18n

    flood = "for _ in range(100):\n    print('x' * 1_000_000)"  # 100 MB
    i18n.use("zh")  # the worker says why it stopped the kernel in the grader's language
    try:
        grades = grade(
            tmp_path,
            {
                "a_flood_01_x.ipynb": submission(cell("code", flood, "flood"), answer=GOOD),
                "b_01_x.ipynb": submission(answer=GOOD),
            },
            max_output=2_000_000,
        )
    finally:
        i18n.use("en")
    assert grades["a_flood_01_x.ipynb"].error == "输出超过 2000000 个字符：内核已被停止"
    assert grades["a_flood_01_x.ipynb"].results == {"01.slot_of": "missing"}
    assert grades["b_01_x.ipynb"].results == {"01.slot_of": "PASS"}


def test_a_hung_notebook_is_stopped_by_its_budget(tmp_path):
    # Each cell keeps under the per-cell limit; only the notebook's budget can stop them.
    sleeps = [cell("code", "import time\ntime.sleep(9)", f"sleep-{i}") for i in range(4)]
    grades = grade(
        tmp_path,
        {"a_01_x.ipynb": submission(*sleeps, answer=GOOD)},
        timeout=10,
        notebook_timeout=12,
    )
    assert "budget" in grades["a_01_x.ipynb"].error
    assert grades["a_01_x.ipynb"].results == {"01.slot_of": "missing"}


# ---------------------------------------------------------------------------------------------
# The headless stall: a finished cell waited out its whole timeout
# ---------------------------------------------------------------------------------------------
def test_no_wait_on_the_kernel_is_longer_than_a_slice(tmp_path, monkeypatch):
    # pyzmq's asyncio poll can miss a message's wake-up until its timeout ends; every poll the
    # executor makes must therefore be short, whatever the cell's timeout.
    import zmq.asyncio

    from slotmap.exercises.grade import execute_notebook
    from slotmap.exercises.gradeworker import POLL_SLICE

    asked: list[int | None] = []
    poll = zmq.asyncio.Socket.poll

    def recording_poll(self, timeout=None, flags=1):  # noqa: ANN001, ANN202
        asked.append(timeout)
        return poll(self, timeout, flags)

    monkeypatch.setattr(zmq.asyncio.Socket, "poll", recording_poll)
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook(cell("code", "import time\ntime.sleep(1.5)", "a"))))
    execute_notebook(path, timeout=300)
    waits = [t for t in asked if t != 0]
    assert waits and all(t is not None and t <= 1000 * POLL_SLICE for t in waits), waits


def test_a_worker_leaves_the_unused_grammar_unbuilt_before_it_reads_a_notebook():
    # A worker starts per notebook graded: rfc3987-syntax's grammar cost each one about 1 s.
    # What the call does is tested with the lab's servers (test_cli); here, that the worker
    # makes it before any import of the modules that bring the grammar.
    import ast
    import inspect

    from slotmap.exercises import gradeworker

    module = ast.parse(inspect.getsource(gradeworker))
    (main,) = [n for n in module.body if getattr(n, "name", "") == "main"]
    # What runs before the worker reads a notebook: the module's top level, then main.
    tree = ast.Module(body=[n for n in module.body if not hasattr(n, "name")] + [main])
    readers = ("nbformat", "nbclient", "jupyter_client")
    imports = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        and any(a.name.startswith(readers) for a in node.names)
        or isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith(readers)
    ]
    calls = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", "") == "leave_unused_parsers_unimported"
    ]
    assert calls and imports and min(calls) < min(imports), (calls, imports)


LESSON_06 = Path(__file__).resolve().parents[1] / "notebooks" / "06_hybrid_groups_replay.ipynb"


@pytest.mark.timeout(240)  # three runs of about 15-25 s; one stall would cost 300 s
def test_lesson_06_runs_three_times_without_a_stall():
    from slotmap.exercises.grade import execute_notebook

    for _ in range(3):
        executed = execute_notebook(LESSON_06, timeout=300, allow_errors=True)
        errors = [
            o
            for c in executed.cells
            for o in c.get("outputs", [])
            if o.get("output_type") == "error"
        ]
        assert errors == []


# ---------------------------------------------------------------------------------------------
# A workshop: several notebooks at once, progress, results on disk as each one finishes
# ---------------------------------------------------------------------------------------------
def test_jobs_grade_in_parallel_with_progress_and_a_report_per_notebook(
    tmp_path, capsys, monkeypatch
):
    from slotmap import cli
    from slotmap.exercises import grade as grade_module

    written: list[list[str]] = []
    write_atomically = grade_module.write_atomically

    def recording(path: Path, text: str) -> None:
        written.append([g["notebook"] for g in json.loads(text)])
        write_atomically(path, text)

    monkeypatch.setattr(grade_module, "write_atomically", recording)
    notebooks = {
        f"{name}_01_x.ipynb": submission(answer=answer)
        for name, answer in (("a", GOOD), ("b", STUB), ("c", GOOD))
    }
    write(tmp_path / "submissions", notebooks)
    report = tmp_path / "grades.json"
    arguments = ["--jobs", "2", "--json", str(report), "--solutions", str(solutions(tmp_path))]
    assert cli.main(["grade", str(tmp_path / "submissions"), *arguments]) == 0
    results = {g["notebook"]: g["results"]["01.slot_of"] for g in json.loads(report.read_text())}
    assert results == {"a_01_x.ipynb": "PASS", "b_01_x.ipynb": "FAIL", "c_01_x.ipynb": "PASS"}
    # One write as each notebook finishes (1, 2, then 3 of them), and the final one.
    assert [len(w) for w in written] == [1, 2, 3, 3]
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert [line.split()[0] for line in progress] == ["[1/3]", "[2/3]", "[3/3]"]


# ---------------------------------------------------------------------------------------------
# The course's own solutions still pass (their objects are of slotmap's classes; lesson 08
# grades against committed timings beside the package)
# ---------------------------------------------------------------------------------------------
def test_solutions_that_use_slotmap_classes_and_data_still_pass(tmp_path):
    course = Path(__file__).resolve().parents[1] / "solutions"
    folder = tmp_path / "submissions"
    folder.mkdir()
    for name in ("03_window_gather.ipynb", "08_performance.ipynb"):
        shutil.copy(course / name, folder / name)
    grades = grade_folder(folder, solutions=course, options=GradeOptions(timeout=120, jobs=2))
    for graded in grades:
        assert set(graded.results.values()) == {"PASS"}, graded


def test_a_malformed_notebook_is_an_error_of_its_own(tmp_path):
    grades = grade(tmp_path, {"bad_01_x.ipynb": {"cells": ["not a cell"]}})
    assert grades["bad_01_x.ipynb"].results == {"01.slot_of": "missing"}
    assert "not a notebook" in grades["bad_01_x.ipynb"].error


def test_only_the_judges_one_verdict_for_its_own_cell_counts():
    from slotmap.exercises.grade import verify

    checks = {3: ["01.slot_of"], 5: ["01.slot_mapping"]}
    good = {"exercise": "01.slot_of", "passed": True, "cell": 3}
    assert verify([{"cell": 3, "judged": [good]}], checks) == ({"01.slot_of": "PASS"}, 0)
    # A record the kernel displayed never counts, however it looks; it is counted as ignored.
    assert verify([{"cell": 3, "records": [good], "judged": []}], checks) == ({}, 1)
    # A verdict for another cell's exercise, or moved to another cell, does not count there.
    assert verify([{"cell": 5, "judged": [good]}], checks) == ({}, 0)
    assert verify([{"cell": 3, "judged": [dict(good, cell=5)]}], checks) == ({}, 0)
    # Two verdicts for one exercise in one cell (two connections to the judge): a fail.
    failed = dict(good, passed=False)
    assert verify([{"cell": 3, "judged": [good, failed]}], checks)[0] == {"01.slot_of": "FAIL"}


# ---------------------------------------------------------------------------------------------
# What grading lets through and leaves behind: credentials, temporary files, a killed grader
# ---------------------------------------------------------------------------------------------
CREDENTIALS = {
    "DATABASE_URL": "postgres://app:hunter2@db/app",
    "MYSQL_PWD": "hunter2",
    "GITHUB_PAT": "ghp_0123456789",
    "HTTPS_PROXY": "http://user:hunter2@proxy:3128",
    "PIP_INDEX_URL": "https://user:hunter2@pypi.example/simple",
    "TRITON_CACHE_DIR": "https://user:hunter2@x/",  # an allowed name, a URL with a password
}


def test_a_kernel_gets_only_allowed_environment_variables(monkeypatch):
    from slotmap.exercises.grade import kernel_environment

    environ = dict(CREDENTIALS, PATH="/usr/bin", LANG="C.UTF-8", SLOTMAP_BACKEND="cpu")
    environ.update(TRITON_INTERPRET="1", OPENAI_API_KEY="sk-1", SLOTMAP_HUB_PASSWORD="x")
    assert kernel_environment(environ) == {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "SLOTMAP_BACKEND": "cpu",
        "TRITON_INTERPRET": "1",
    }


# The answer is right only when the kernel sees no credential, and it leaves files in every
# temporary folder a kernel can write to.
LEAKS = """
import os, tempfile
LEAKED = sorted(k for k in {names!r} if k in os.environ)
for folder in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
    try:
        open(os.path.join(folder, {token!r} + str(os.getpid())), "w").write("left behind")
    except OSError:
        pass
def slot_of(p, row, size):
    assert not LEAKED, LEAKED
    return row[p // size] * size + p % size
"""


def _left_behind(token: str) -> list[str]:
    found = []
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        found += [str(p) for p in Path(folder).glob(f"{token}*")]
    return found


@ROOT_ONLY
def test_a_kernel_sees_no_credential_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    token = f"slotmap-leak-{os.getpid()}-"
    answer = LEAKS.format(names=sorted(CREDENTIALS), token=token)
    try:
        grades = grade(tmp_path, {"a_01_x.ipynb": submission(answer=answer)})
        assert grades["a_01_x.ipynb"].results == {"01.slot_of": "PASS"}
        assert _left_behind(token) == []
    finally:
        for path in _left_behind(token):
            os.unlink(path)


def test_a_killed_grader_takes_its_kernels_along_and_the_next_run_cleans_up(public):
    import signal
    import subprocess
    import sys

    from slotmap.exercises.grade import FOLDER_PREFIX, Grader

    drop = _drop(public)
    pid_file = drop / "kernel"
    hang = (
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)"
    )
    write(public / "submissions", {"a_01_x.ipynb": submission(cell("code", hang, "hang"))})
    grader = subprocess.Popen(
        [sys.executable, "-m", "slotmap.cli", "grade", str(public / "submissions")]
        + ["--solutions", str(solutions(public))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while not pid_file.exists() or not pid_file.read_text():
            assert grader.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        kernel = int(pid_file.read_text())
        folders = list(Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}{grader.pid}-*"))
        assert folders and _running(kernel)
    finally:
        grader.send_signal(signal.SIGKILL)
        grader.wait()
    # The kernel's worker dies with the grader (parent-death signal), the kernel with its worker.
    deadline = time.monotonic() + 60
    while _running(kernel) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(kernel)
    assert all(f.exists() for f in folders)  # what a killed run keeps, until the next run
    with Grader(GradeOptions(sandbox_user=False)):
        assert not any(f.exists() for f in folders)


# ---------------------------------------------------------------------------------------------
# Grading output: later checks after a cell timeout, untouched stubs, a table that fits
# ---------------------------------------------------------------------------------------------
REGION_SOLUTION = notebook(
    cell("code", IMPORT, "imports"),
    cell(
        "code",
        "def slot_of(p, row, size):\n    ### BEGIN SOLUTION\n"
        "    return row[p // size] * size + p % size\n    ### END SOLUTION",
        "answer",
    ),
    cell("code", CHECK, "check-slot-of"),
)


def test_later_checks_run_after_a_timeout_and_an_untouched_stub_is_not_attempted(tmp_path):
    from slotmap.exercises.build import cut_code

    folder = solutions(tmp_path)
    write(folder, {"01_r.ipynb": REGION_SOLUTION})
    stub = cut_code(REGION_SOLUTION["cells"][1]["source"], "")
    wrong = stub.replace("raise NotImplementedError()", "return p")
    # Interrupted at 20 s, the cell limit: room for the other cells on a loaded machine.
    hang = cell("code", "import time\ntime.sleep(600)", "hang")
    notebooks = {
        "a_hang_01_x.ipynb": submission(hang, answer=GOOD),
        "b_untouched_01_r.ipynb": submission(answer=stub),
        "c_tried_01_r.ipynb": submission(answer=wrong),
    }
    submitted = write(tmp_path / "submissions", notebooks)
    grades = {
        g.notebook: g
        for g in grade_folder(
            submitted, solutions=folder, options=GradeOptions(timeout=20, jobs=2)
        )
    }
    # The hung cell is interrupted at its limit; the check after it runs on its own.
    assert grades["a_hang_01_x.ipynb"].results == {"01.slot_of": "PASS"}
    assert "interrupted" in grades["a_hang_01_x.ipynb"].error
    assert grades["b_untouched_01_r.ipynb"].results == {"01.slot_of": "not attempted"}
    assert grades["c_tried_01_r.ipynb"].results == {"01.slot_of": "FAIL"}


def test_the_table_fits_the_terminal_and_the_json_keeps_everything():
    from slotmap.exercises.grade import Grade, grades_json, table

    exercises = [f"0{n // 3 + 1}.exercise_{n}" for n in range(24)]
    few = [Grade(f"learner_{i}.ipynb", dict.fromkeys(exercises, "PASS")) for i in range(3)]
    many = [Grade(f"learner_{i}.ipynb", dict.fromkeys(exercises, "FAIL")) for i in range(40)]
    small = [Grade("a.ipynb", {"01.slot_of": "PASS", "01.slot_mapping": "FAIL"})]
    for grades, layout in ((small, "notebook"), (few, "exercise"), (many, "notebook")):
        lines = table(grades, width=100).splitlines()
        assert max(len(line) for line in lines) <= 100
        assert lines[0].split()[0] == layout
    # Three learners: an exercise a row; forty: a line per learner and exercise.
    assert len(table(few, width=100).splitlines()) == 2 + len(exercises) + 1
    assert len(table(many, width=100).splitlines()) == 2 + 40 * (len(exercises) + 1)
    assert len(table(few, width=1000).splitlines()) == 2 + len(few)
    assert [g["results"] for g in json.loads(grades_json(many))] == [g.results for g in many]
