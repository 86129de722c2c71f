"""Grade a folder of learner notebooks headless: notebook x exercise, pass or fail.

A submission is never trusted to report its own results. For each notebook the grader

* clears every saved output (a result left in a cell that never runs counts for nothing),
* puts the solution's check cells back in place of the submission's (matched by cell id, else
  by source, like nbgrader's restored test cells), so the learner's code runs first and the
  check last,
* runs it in a worker process of its own (``gradeworker.py``), on a fresh kernel that imports
  the checking code from a read-only snapshot, in a private folder, as a user of its own when
  the grader is root (``sandbox``), under a time budget for each cell and for the notebook,
  and a cap on its output,
* accepts a check result only from a restored check cell's own outputs, signed with a secret
  that is new for each notebook and is in no cell before it (``gradecheck``).

The exercises a notebook is expected to contain are those its solution (``solutions/<same
name>``) checks, so a deleted check cell shows up as "missing" rather than vanishing.
"""

from __future__ import annotations

import copy
import hmac
import json
import os
import re
import secrets
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slotmap.exercises import sandbox
from slotmap.exercises.build import ROOT, SOLUTIONS
from slotmap.exercises.core import CHECK_MIME
from slotmap.exercises.gradecheck import signature

CHECK_CALL = re.compile(r"""\bcheck\(\s*["'](\d\d\.[\w.-]+)["']""")
PACKAGE = Path(__file__).resolve().parents[1]  # the slotmap package the kernels check with
# What a restored check cell runs: the gate, read by path from the snapshot, then its ``run``.
GATE = (
    "# slotmap grade: the solution's check cell, with checking code from a read-only snapshot\n"
    '(lambda g: exec(open({gate!r}, encoding="utf-8").read(), g) or g["run"])'
    '({{"__name__": "slotmap_grade_gate"}})(\n'
    "    snapshot={snapshot!r}, secret={secret!r}, cell={cell}, source={source!r},\n"
    "    namespace=globals(),\n)\n"
)
# Environment variables a kernel does not get: the grader's credentials are not the learner's.
PRIVATE_ENV = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH", re.IGNORECASE)
GRACE = 30  # seconds past a notebook's budget before its worker is killed from outside


def execute_notebook(path: Path, *, timeout: int = 300, allow_errors: bool = False):
    """Run a notebook top to bottom on a fresh python3 kernel, in its own folder, with this
    checkout importable. Returns the executed nbformat notebook.

    Per-cell ``timeout``. Waits on the kernel are sliced (``gradeworker.sliced``), so a missed
    wake-up does not stall a finished cell until the timeout. No isolation: for the course's
    own notebooks.
    """
    import nbformat

    from slotmap.exercises.gradeworker import client_class

    notebook = nbformat.read(path, as_version=4)
    client = client_class()(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(path.parent)}},
        # Every output is in by then; a graceful shutdown waits seconds for torch's exit.
        shutdown_kernel="immediate",
    )
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    client.execute(env=dict(os.environ, PYTHONPATH=pythonpath))
    return notebook


def solution_of(path: Path, solutions: Path = SOLUTIONS) -> Path | None:
    """The solution a submitted notebook answers: same file name, or a name that ends with a
    solution's (``alice_01_paged_kv_cache.ipynb``, ``alice/01_paged_kv_cache.ipynb``)."""
    names = sorted(solutions.glob("*.ipynb"), key=lambda s: -len(s.name))
    return next((s for s in names if path.name.endswith(s.name)), None)


def _text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _check_ids(cell: dict) -> list[str]:
    if cell.get("cell_type") != "code":
        return []
    ids: list[str] = []
    for exercise in CHECK_CALL.findall(_text(cell)):
        ids += [exercise] if exercise not in ids else []
    return ids


def expected_exercises(path: Path, solutions: Path = SOLUTIONS) -> list[str]:
    """The exercise ids that this notebook's solution checks (or, without one, that the
    notebook itself checks), in order."""
    source = solution_of(path, solutions) or path
    notebook = json.loads(source.read_text(encoding="utf-8"))
    ids: list[str] = []
    for cell in notebook["cells"]:
        ids += [i for i in _check_ids(cell) if i not in ids]
    return ids


def check_records(notebook) -> dict[str, bool]:  # noqa: ANN001
    """exercise id -> passed, from an executed notebook's outputs (the last check wins).

    It trusts the notebook: for the course's own lessons and solutions. The grader accepts only
    signed results from the check cells it restored (``grade_notebook``)."""
    results: dict[str, bool] = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            record = output.get("data", {}).get(CHECK_MIME)
            if record:
                results[record["exercise"]] = bool(record["passed"])
    return results


def clear_outputs(notebook: dict) -> dict:
    """Every saved output removed, and ``outputs`` dropped from cells that are not code: a cell
    the kernel never runs (skipped, blank, markdown) must not bring a result of its own."""
    for cell in notebook.get("cells", []):
        cell["source"] = _text(cell)  # one string, as the executor wants it
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
        else:
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
    return notebook


def _same_source(a: str, b: str) -> bool:
    def norm(s: str) -> str:
        return re.sub(r"\s+", "", s).rstrip(";")

    return norm(a) == norm(b)


def restore_check_cells(notebook: dict, solution: dict | None) -> dict[int, list[str]]:
    """Put the solution's check cells back into ``notebook``; returns cell index -> the
    exercise ids it checks. A solution check cell replaces a submission's code cell that checks
    the same exercise: the one with its id, else with its source, else the last; one the
    learner deleted is not added (it is "missing").
    Without a solution the notebook's own check cells are the check cells."""
    cells = notebook.get("cells", [])
    if solution is None:
        return {i: ids for i, cell in enumerate(cells) if (ids := _check_ids(cell))}
    restored: dict[int, list[str]] = {}
    for wanted in solution.get("cells", []):
        ids = _check_ids(wanted)
        if not ids:
            continue
        # Only a cell that checks one of these exercises can stand for this one; its source is
        # replaced, so a lenient match is safe: same id, else same source, else the last one.
        free = [
            i
            for i in range(len(cells))
            if i not in restored and set(_check_ids(cells[i])) & set(ids)
        ]
        match = next(
            (i for i in free if wanted.get("id") and cells[i].get("id") == wanted["id"]), None
        )
        if match is None:
            same = [i for i in free if _same_source(_text(cells[i]), _text(wanted))]
            match = (same or free or [None])[-1]
        if match is None:
            continue
        cells[match] = {
            "cell_type": "code",
            "id": cells[match].get("id") or wanted.get("id") or f"check-{match}",
            "metadata": {},
            "source": _text(wanted),
            "outputs": [],
            "execution_count": None,
        }
        restored[match] = ids
    return restored


@dataclass
class Grade:
    notebook: str
    # exercise id -> PASS / FAIL / missing, or "SKIP: <why>" (this machine could not check it)
    results: dict[str, str] = field(default_factory=dict)
    error: str = ""  # a notebook that could not run at all, or was stopped
    ignored: int = 0  # check results the grader did not accept (not from its check cells)

    def as_json(self) -> dict[str, Any]:
        return {
            "notebook": self.notebook,
            "results": self.results,
            "error": self.error,
            "ignored_results": self.ignored,
        }


@dataclass
class GradeOptions:
    """How each notebook is run. ``sandbox_user``: run kernels as a user of their own (None:
    when the grader is root, which it must be for that, unless ``SLOTMAP_GRADE_SANDBOX_USER``
    is ``0``)."""

    timeout: int = 300  # seconds a cell may take
    notebook_timeout: int = 1800  # seconds the whole notebook may take
    max_output: int = 20_000_000  # characters of output kept per notebook; past it, stopped
    nproc: int = 512  # processes and threads the kernel's user may have (a fork bomb stops)
    jobs: int = 1  # notebooks graded at once
    sandbox_user: bool | None = None
    package: Path = PACKAGE  # the slotmap package snapshotted for the checks


class Grader:
    """One grading run: a private folder, a read-only snapshot of the checking code, and a
    kernel user per slot (``jobs`` slots). Use as a context manager."""

    def __init__(self, options: GradeOptions | None = None) -> None:
        self.options = options or GradeOptions()
        if self.options.sandbox_user is None:
            wanted = os.environ.get("SLOTMAP_GRADE_SANDBOX_USER", "1") != "0"
            self.options.sandbox_user = wanted and sandbox.is_root()
        if self.options.sandbox_user and shutil.which("setpriv") is None:
            print(
                "slotmap grade: no setpriv (util-linux): kernels run as this user", file=sys.stderr
            )
            self.options.sandbox_user = False
        self.folder = Path(tempfile.mkdtemp(prefix="slotmap-grade-"))
        os.chmod(self.folder, 0o711)  # kernel users reach their own folder, list none
        self.snapshot = sandbox.snapshot_package(self.options.package, self.folder / "pkg")
        self.specs = self.folder / "jupyter"
        self.lock = threading.Lock()
        self.free_slots = list(range(max(1, self.options.jobs)))
        self.count = 0
        self.argv: dict[int, list[str]] = {}
        self.live: dict[int, tuple[subprocess.Popen, int | None, str]] = {}  # pid -> how to stop

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_all()
        sandbox.remove_tree(self.folder)

    def stop_all(self) -> None:
        """Stop every notebook still running (the grader was interrupted)."""
        with self.lock:
            running = list(self.live.values())
        for worker, uid, marker in running:
            self._stop(worker, uid, marker)

    def _uid(self, slot: int) -> int | None:
        return sandbox.sandbox_uid(slot) if self.options.sandbox_user else None

    def _kernel_name(self, slot: int) -> str:
        name = f"slotmap-grade-{slot}"
        with self.lock:
            if slot not in self.argv:
                self.argv[slot] = sandbox.kernel_argv(self._uid(slot))
                sandbox.write_kernelspec(self.specs, name, self.argv[slot])
        return name

    def grade(self, text: str, name: str, solution: Path | None) -> Grade:
        """Grade one notebook, given as its file's text."""
        with self.lock:
            slot = self.free_slots.pop()
            self.count += 1
            number = self.count
        try:
            return self._grade(text, name, solution, slot, number)
        finally:
            with self.lock:
                self.free_slots.append(slot)

    def _grade(self, text: str, name: str, solution: Path | None, slot: int, number: int) -> Grade:
        grade = Grade(name)
        solution_nb = json.loads(solution.read_text(encoding="utf-8")) if solution else None
        checks: dict[int, list[str]] = {}
        try:
            notebook = json.loads(text)
            for key, default in (("cells", []), ("metadata", {}), ("nbformat", 4)):
                notebook.setdefault(key, default)
            notebook.setdefault("nbformat_minor", 5)
            clear_outputs(notebook)
            checks = restore_check_cells(notebook, solution_nb)
        except Exception as error:  # anything a hand-edited file can be
            notebook, grade.error = None, f"{type(error).__name__}: not a notebook"
        expected: list[str] = []
        for cell in (solution_nb or notebook or {"cells": []})["cells"]:
            expected += [i for i in _check_ids(cell) if i not in expected]
        records: dict[str, str] = {}
        if notebook is not None:
            records, grade.error, grade.ignored = self._run(notebook, checks, slot, number)
        for exercise in expected + [i for i in records if i not in expected]:
            grade.results[exercise] = records.get(exercise, "missing")
        return grade

    def _run(
        self, notebook: dict, checks: dict[int, list[str]], slot: int, number: int
    ) -> tuple[dict[str, str], str, int]:
        options, uid = self.options, self._uid(slot)
        secret = secrets.token_hex(32)
        gate = self.snapshot / "slotmap" / "exercises" / "gradecheck.py"
        job_notebook = copy.deepcopy(notebook)
        for index in checks:
            cell = job_notebook["cells"][index]
            cell["source"] = GATE.format(
                gate=str(gate),
                snapshot=str(self.snapshot),
                secret=secret,
                cell=index,
                source=_text(cell),
            )
        home = self.folder / f"nb-{number}"
        home.mkdir()
        (home / "runtime").mkdir()
        for path in (home / "runtime", home):
            sandbox.give(path, uid)
        marker = f"SLOTMAP_GRADE_SANDBOX={os.getpid()}-{number}"
        env = {k: v for k, v in os.environ.items() if not PRIVATE_ENV.search(k)}
        env.pop("PYTHONPATH", None)
        kernel_env = dict(
            env,
            PYTHONPATH=str(self.snapshot),
            HOME=str(home),
            TMPDIR=str(home),
            IPYTHONDIR=str(home / ".ipython"),
            MPLCONFIGDIR=str(home / ".matplotlib"),
            JUPYTER_RUNTIME_DIR=str(home / "runtime"),
            PYTHONDONTWRITEBYTECODE="1",
        )
        key, value = marker.split("=", 1)
        kernel_env[key] = value
        nproc = options.nproc
        if uid is None:  # the limit counts every thread of this user, the grader's included
            nproc += sandbox.count_tasks(os.getuid())
        job = {
            "notebook": job_notebook,
            "check_cells": sorted(checks),
            "check_mime": CHECK_MIME,
            "timeout": options.timeout,
            "notebook_timeout": options.notebook_timeout,
            "max_output": options.max_output,
            "nproc": nproc,
            "uid": uid,
            "cwd": str(home),
            "ipc": str(home / "k"),
            "kernel_name": self._kernel_name(slot),
            "env": kernel_env,
        }
        worker_env = dict(
            env,
            JUPYTER_PATH=str(self.specs),
            JUPYTER_RUNTIME_DIR=str(home / "runtime"),
            JUPYTER_PLATFORM_DIRS="1",
            PYTHONDONTWRITEBYTECODE="1",
        )
        worker_env[key] = value
        script = self.snapshot / "slotmap" / "exercises" / "gradeworker.py"
        read_end, write_end = os.pipe()
        log = open(self.folder / f"worker-{number}.log", "wb")  # noqa: SIM115
        try:
            worker = subprocess.Popen(
                [sys.executable, str(script), str(write_end)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
                pass_fds=(write_end,),
                start_new_session=True,
                cwd=self.folder,
                env=worker_env,
            )
        finally:
            os.close(write_end)
            log.close()
        with self.lock:
            self.live[worker.pid] = (worker, uid, marker)
        lines = []
        try:
            worker.stdin.write(json.dumps(job).encode())
            worker.stdin.close()
        except BrokenPipeError:
            pass
        done, error = None, ""
        deadline = time.monotonic() + options.notebook_timeout + GRACE
        with selectors.DefaultSelector() as selector, os.fdopen(read_end, "rb") as stream:
            selector.register(stream, selectors.EVENT_READ)
            buffer = b""
            while done is None:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(timeout=left):
                    error = f"over the notebook's budget of {options.notebook_timeout} s"
                    break
                chunk = os.read(read_end, 1 << 16)
                if not chunk:
                    break
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for line in complete:
                    try:
                        message = json.loads(line)
                    except ValueError:
                        continue  # not the worker's (it writes whole JSON lines)
                    if not isinstance(message, dict):
                        continue
                    if message.get("done"):
                        done = message
                    else:
                        lines.append(message)
        self._stop(worker, uid, marker)
        with self.lock:
            self.live.pop(worker.pid, None)
        if done is not None:
            error = done["error"]
        elif not error:
            error = f"the notebook's worker died ({_exit_reason(worker.returncode)})"
        results, ignored = verify(lines, checks, secret)
        return results, error, ignored

    def _stop(self, worker: subprocess.Popen, uid: int | None, marker: str) -> None:
        """Nothing of this notebook survives: its worker's session, its kernel user's processes,
        and whatever still carries its marker."""
        try:
            os.killpg(worker.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        worker.wait()
        if uid is not None:
            sandbox.kill_uid(uid)
        sandbox.kill_marked(marker)


def _exit_reason(code: int | None) -> str:
    return f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"


def verify(
    messages: list[dict[str, Any]], checks: dict[int, list[str]], secret: str
) -> tuple[dict[str, str], int]:
    """exercise id -> PASS / FAIL from the worker's per-cell records, and how many records were
    not accepted. A check cell's exercise counts when exactly one record in that cell's outputs
    carries a valid signature for it (more than one: FAIL)."""
    results: dict[str, str] = {}
    ignored = 0
    for message in messages:
        cell, records = message.get("cell"), message.get("records") or []
        accepted: dict[str, list[dict]] = {}
        for record in records:
            valid = (
                isinstance(record, dict)
                and cell in checks
                and record.get("cell") == cell
                and record.get("exercise") in checks[cell]
                and isinstance(record.get("signature"), str)
                and hmac.compare_digest(record["signature"], signature(secret, record))
            )
            if valid:
                accepted.setdefault(record["exercise"], []).append(record)
            else:
                ignored += 1
        for exercise, found in accepted.items():
            passed = len(found) == 1 and found[0].get("passed") is True
            skipped = len(found) == 1 and not passed and found[0].get("skipped")
            # A skip is neither a pass nor a failure: this machine could not run the check.
            results[exercise] = "PASS" if passed else f"SKIP: {skipped}" if skipped else "FAIL"
    return results, ignored


def grade_notebook(
    path: Path,
    *,
    timeout: int = 300,
    solutions: Path = SOLUTIONS,
    name: str | None = None,
    options: GradeOptions | None = None,
) -> Grade:
    """Grade one notebook file (see the module's docstring for how)."""
    options = options or GradeOptions(timeout=timeout)
    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    with Grader(options) as grader:
        return grader.grade(text, name or path.name, solution_of(path, solutions))


def _verdict(result: str) -> str:
    """A table cell: PASS, FAIL, SKIP (its reason goes under the table) or missing."""
    return "SKIP" if result.startswith("SKIP: ") else result


def table(grades: list[Grade]) -> str:
    """A plain-text table: one row per notebook, one column per exercise."""
    exercises: list[str] = []
    for grade in grades:
        exercises += [e for e in grade.results if e not in exercises]
    exercises.sort()
    header = ["notebook", *exercises, "passed"]
    rows = []
    for grade in grades:
        cells = [_verdict(grade.results.get(e, "")) for e in exercises]
        passed = sum(c == "PASS" for c in cells)
        total = sum(c != "" for c in cells)
        skipped = sum(c == "SKIP" for c in cells)
        summary = f"{passed}/{total}" + (f", {skipped} skipped" if skipped else "")
        rows.append([grade.notebook, *cells, summary + (" (error)" if grade.error else "")])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for grade in grades:
        for exercise, result in grade.results.items():
            if _verdict(result) == "SKIP":
                lines.append(f"{grade.notebook}: {exercise} skipped, not passed: {result[6:]}")
        if grade.error:
            lines.append(f"{grade.notebook}: could not run: {grade.error}")
        if grade.ignored:
            lines.append(
                f"{grade.notebook}: {grade.ignored} check result(s) not from the "
                "grader's check cells, ignored"
            )
    return "\n".join(lines)


def grade_folder(
    folder: Path,
    *,
    timeout: int = 300,
    solutions: Path = SOLUTIONS,
    options: GradeOptions | None = None,
    on_grade: Callable[[Grade, list[Grade]], None] | None = None,
) -> list[Grade]:
    """Grade every notebook under ``folder``, ``options.jobs`` at a time. Every submission is
    read before the first kernel starts (no notebook can change another's), and ``on_grade``
    is called with each grade as its notebook finishes (and those finished so far, in order)."""
    folder = Path(folder)
    options = options or GradeOptions(timeout=timeout)
    paths = sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    submissions = [
        (
            p.relative_to(folder).as_posix(),
            p.read_text(encoding="utf-8", errors="replace"),
            solution_of(p, solutions),
        )
        for p in paths
    ]
    grades: dict[int, Grade] = {}
    lock = threading.Lock()

    with Grader(options) as grader:

        def one(index: int) -> None:
            name, text, solution = submissions[index]
            grade = grader.grade(text, name, solution)
            with lock:
                grades[index] = grade
                if on_grade is not None:
                    on_grade(grade, [grades[i] for i in sorted(grades)])

        pool = ThreadPoolExecutor(max_workers=max(1, options.jobs))
        try:
            list(pool.map(one, range(len(submissions))))
        except BaseException:  # interrupted: stop the notebooks first, then their threads end
            grader.stop_all()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
    return [grades[i] for i in range(len(submissions))]


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a file beside it and a rename: readers see the old or
    the new file, never half of one."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def grades_json(grades: list[Grade]) -> str:
    return json.dumps([g.as_json() for g in grades], indent=1) + "\n"


__all__ = [
    "Grade",
    "GradeOptions",
    "Grader",
    "check_records",
    "clear_outputs",
    "execute_notebook",
    "expected_exercises",
    "grade_folder",
    "grade_notebook",
    "grades_json",
    "restore_check_cells",
    "solution_of",
    "table",
    "verify",
    "write_atomically",
]
