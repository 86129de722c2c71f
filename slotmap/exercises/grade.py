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
* judges each restored check cell in the worker, a process the learner's code does not share:
  the kernel only runs the candidate on the inputs the judge sends and sends back what came
  out (``gradecheck``); the verdict is the worker's, and no output of the kernel counts.

The exercises a notebook is expected to contain are those its solution (``solutions/<same
name>``) checks, so a deleted check cell shows up as "missing" rather than vanishing.
"""

from __future__ import annotations

import copy
import json
import os
import re
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
from slotmap.i18n import N_, _, columns, language, tr

CHECK_CALL = re.compile(r"""\bcheck\(\s*["'](\d\d\.[\w.-]+)["']""")
PACKAGE = Path(__file__).resolve().parents[1]  # the slotmap package the kernels check with
# What a restored check cell runs in the kernel: the thin runner that serves the judge.
RUNNER = (
    "# slotmap grade: the solution's check cell; the judge runs in the grader's own process\n"
    '__import__("slotmap.exercises.gradecheck", fromlist=["serve"]).serve(\n'
    "    address={address!r}, cell={cell}, source={source!r}, namespace=globals(),\n)\n"
)
# The only environment variables a kernel gets (locale, search paths, the accelerator's and
# the course's settings), and of those none that looks like a credential.
KERNEL_ENV = re.compile(
    r"PATH|LD_LIBRARY_PATH|LANG|LANGUAGE|LC_[A-Z]+|TZ|TERM|VIRTUAL_ENV|CONDA_PREFIX"
    r"|SLOTMAP_(BACKEND|LAUNCH_POLICY|QUIET)|TRITON_[A-Z_]+|TORCH_[A-Z_]+|PYTORCH_[A-Z_]+"
    r"|CUDA_[A-Z_]+|NVIDIA_[A-Z_]+|ASCEND_[A-Z_]+|NPU_[A-Z_]+|(OMP|MKL|OPENBLAS)_NUM_THREADS"
)
PRIVATE_ENV = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH|PAT$|PWD$", re.IGNORECASE)
URL_WITH_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]*@")
# The kernel's private temporary folders, inside its notebook's folder.
PRIVATE_TEMP = ("tmp",)
FOLDER_PREFIX = "slotmap-grade-"  # then the grader's pid: a dead run's folder is found by it
MARKER = "SLOTMAP_GRADE_SANDBOX"  # NAME=<grader pid>-<notebook>, in every kernel's environment
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


def skipped_checks(notebook) -> dict[str, str]:  # noqa: ANN001
    """exercise id -> why, for the checks an executed notebook says this machine could not run
    (a timing off an NVIDIA GPU, ranks without two devices). Trusts the notebook, as
    ``check_records`` does."""
    return {
        record["exercise"]: record["skipped"]
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if (record := output.get("data", {}).get(CHECK_MIME)) and record.get("skipped")
    }


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


NOT_ATTEMPTED = "not attempted"


def untouched(notebook: dict, solution: dict | None) -> set[str]:
    """The exercises whose answer the learner has not touched: every cell between the
    solution's previous check cell and this exercise's that has an answer region is, in the
    submission (the cell with the same id), still the built exercise's stub."""
    from slotmap.exercises.build import cut_code

    if solution is None:
        return set()
    mine = {c.get("id"): _text(c) for c in notebook.get("cells", []) if isinstance(c, dict)}
    found: set[str] = set()
    answers: list[dict] = []
    stubs: list[tuple[str | None, str]] = []
    for cell in solution.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        ids, source = _check_ids(cell), _text(cell)
        if ids:
            # A check with no answer of its own (a timing of the kernel checked above) goes
            # with the answer before it.
            stubs = [(a.get("id"), cut_code(_text(a), "")) for a in answers] or stubs
            if stubs and all(i in mine and _same_source(mine[i], stub) for i, stub in stubs):
                found.update(ids)
            answers = []
        elif cut_code(source, "") != source:
            answers.append(cell)
    return found


@dataclass
class Grade:
    notebook: str
    # exercise id -> PASS / FAIL / missing / not attempted (the stub as the exercise has it),
    # or "SKIP: <why>" (this machine could not check it)
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
        sandbox.clean_stale(Path(tempfile.gettempdir()), FOLDER_PREFIX, MARKER)
        self.folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
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
        stubs: set[str] = set()
        try:
            notebook = json.loads(text)
            stubs = untouched(notebook, solution_nb)
            for key, default in (("cells", []), ("metadata", {}), ("nbformat", 4)):
                notebook.setdefault(key, default)
            notebook.setdefault("nbformat_minor", 5)
            clear_outputs(notebook)
            checks = restore_check_cells(notebook, solution_nb)
        except Exception as error:  # anything a hand-edited file can be
            notebook = None
            grade.error = _("{error}: not a notebook").format(error=type(error).__name__)
        expected: list[str] = []
        for cell in (solution_nb or notebook or {"cells": []})["cells"]:
            expected += [i for i in _check_ids(cell) if i not in expected]
        records: dict[str, str] = {}
        if notebook is not None:
            records, grade.error, grade.ignored = self._run(notebook, checks, slot, number)
        for exercise in expected + [i for i in records if i not in expected]:
            result = records.get(exercise, "missing")
            # A stub fails its check; left as the exercise gave it, it was never attempted.
            grade.results[exercise] = (
                NOT_ATTEMPTED if result == "FAIL" and exercise in stubs else result
            )
        return grade

    def _run(
        self, notebook: dict, checks: dict[int, list[str]], slot: int, number: int
    ) -> tuple[dict[str, str], str, int]:
        options, uid = self.options, self._uid(slot)
        home = self.folder / f"nb-{number}"
        home.mkdir()
        (home / "runtime").mkdir()
        for name in PRIVATE_TEMP:
            (home / name).mkdir()
        for path in (home / "runtime", *(home / n for n in PRIVATE_TEMP), home):
            sandbox.give(path, uid)
        address = str(home / "judge.sock")
        job_notebook = copy.deepcopy(notebook)
        for index in checks:
            cell = job_notebook["cells"][index]
            cell["source"] = RUNNER.format(address=address, cell=index, source=_text(cell))
        marker = f"{MARKER}={os.getpid()}-{number}"
        env = {k: v for k, v in os.environ.items() if not PRIVATE_ENV.search(k)}
        env.pop("PYTHONPATH", None)
        kernel_env = kernel_environment(os.environ)
        kernel_env.update(
            PYTHONPATH=str(self.snapshot),
            HOME=str(home),
            IPYTHONDIR=str(home / ".ipython"),
            MPLCONFIGDIR=str(home / ".matplotlib"),
            JUPYTER_RUNTIME_DIR=str(home / "runtime"),
            PYTHONDONTWRITEBYTECODE="1",
        )
        for name in ("TMPDIR", "TEMP", "TMP"):
            kernel_env[name] = str(home / "tmp")
        key, value = marker.split("=", 1)
        kernel_env[key] = value
        nproc = options.nproc
        if uid is None:  # the limit counts every thread of this user, the grader's included
            nproc += sandbox.count_tasks(os.getuid())
        job = {
            "notebook": job_notebook,
            "checks": {str(i): ids for i, ids in checks.items()},
            "check_mime": CHECK_MIME,
            "snapshot": str(self.snapshot),
            "judge": address,
            "grader": os.getpid(),
            "timeout": options.timeout,
            "notebook_timeout": options.notebook_timeout,
            "max_output": options.max_output,
            "nproc": nproc,
            "uid": uid,
            "cwd": str(home),
            "ipc": str(home / "k"),
            "connection_file": str(home / "runtime" / "kernel.json"),
            "kernel_name": self._kernel_name(slot),
            "env": kernel_env,
            "lang": language(),
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
                    error = _("over the notebook's budget of {seconds} s").format(
                        seconds=options.notebook_timeout
                    )
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
            error = _("the notebook's worker died ({reason})").format(
                reason=_exit_reason(worker.returncode)
            )
        results, ignored = verify(lines, checks)
        sandbox.remove_tree(home)  # its private temporary folders with it
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
            sandbox.remove_owned(uid)
        sandbox.kill_marked(marker)


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return _("killed by signal {signal}").format(signal=-code)
    return _("exit {code}").format(code=code)


def verify(
    messages: list[dict[str, Any]], checks: dict[int, list[str]]
) -> tuple[dict[str, str], int]:
    """exercise id -> PASS / FAIL / SKIP from the worker's per-cell messages, and how many check
    results the kernel displayed (none of which counts). Only the worker's judge gives a verdict
    (``judged``): one per exercise of a check cell; more than one is a FAIL."""
    results: dict[str, str] = {}
    ignored = 0
    for message in messages:
        cell = message.get("cell")
        ignored += len(message.get("records") or [])
        found: dict[str, list[dict]] = {}
        for record in message.get("judged") or []:
            if (
                cell in checks
                and record.get("cell") == cell
                and record.get("exercise") in checks[cell]
            ):
                found.setdefault(record["exercise"], []).append(record)
        for exercise, records in found.items():
            passed = len(records) == 1 and records[0].get("passed") is True
            skipped = len(records) == 1 and not passed and records[0].get("skipped")
            # A skip is neither a pass nor a failure: this machine could not run the check.
            results[exercise] = "PASS" if passed else f"SKIP: {skipped}" if skipped else "FAIL"
    return results, ignored


def kernel_environment(environ: dict[str, str]) -> dict[str, str]:
    """The variables of ``environ`` a graded kernel gets: an allowlist (``KERNEL_ENV``), less
    any whose name looks like a credential or whose value is a URL with a password."""
    return {
        k: v
        for k, v in environ.items()
        if KERNEL_ENV.fullmatch(k)
        and not PRIVATE_ENV.search(k)
        and not URL_WITH_PASSWORD.search(v)
    }


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
    """PASS, FAIL, SKIP (its reason goes under the table) or missing."""
    return "SKIP" if result.startswith("SKIP: ") else result


# A verdict as the table shows it, in the course's language.
LABELS = {
    "PASS": N_("PASS"),
    "FAIL": N_("FAIL"),
    "SKIP": N_("SKIP"),
    "missing": N_("missing"),
    NOT_ATTEMPTED: N_("not attempted"),
}


def _cell(result: str) -> str:
    verdict = _verdict(result)
    return tr(LABELS[verdict]) if verdict in LABELS else verdict


def result_label(result: str) -> str:
    """A result as the progress lines show it, in the course's language: its verdict, and a
    skip's reason after it."""
    if _verdict(result) == "SKIP":
        return _("SKIP: {reason}").format(reason=result[6:])
    return _cell(result)


def _columns(rows: list[list[str]]) -> list[str]:
    """Rows as left-aligned columns, a rule under the first."""
    widths = [max(columns(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c + " " * (w - columns(c)) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _summary(grade: Grade) -> str:
    cells = [_verdict(r) for r in grade.results.values()]
    passed, skipped = sum(c == "PASS" for c in cells), sum(c == "SKIP" for c in cells)
    summary = f"{passed}/{len(cells)}"
    if skipped:
        summary += _(", {skipped} skipped").format(skipped=skipped)
    return summary + (_(" (error)") if grade.error else "")


def table(grades: list[Grade], width: int | None = None) -> str:
    """A plain-text table that fits ``width`` columns (the terminal's by default): a row per
    notebook and a column per exercise; when that is too wide, a row per exercise and a column
    per notebook; when that is too, a line per notebook and exercise. Then the notes."""
    width = width or shutil.get_terminal_size().columns
    exercises: list[str] = []
    for grade in grades:
        exercises += [e for e in grade.results if e not in exercises]
    exercises.sort()
    notebook, exercise, passed = _("notebook"), _("exercise"), _("passed")
    wide = _columns(
        [[notebook, *exercises, passed]]
        + [
            [g.notebook, *(_cell(g.results.get(e, "")) for e in exercises), _summary(g)]
            for g in grades
        ]
    )
    tall = _columns(
        [[exercise, *(g.notebook for g in grades)]]
        + [[e, *(_cell(g.results.get(e, "")) for g in grades)] for e in exercises]
        + [[passed, *(_summary(g) for g in grades)]]
    )
    long = _columns(
        [[notebook, exercise, _("result")]]
        + [
            row
            for g in grades
            for row in [*([g.notebook, e, _cell(r)] for e, r in g.results.items())]
            + [[g.notebook, passed, _summary(g)]]
        ]
    )
    lines = next((t for t in (wide, tall) if max(columns(line) for line in t) <= width), long)
    for grade in grades:
        for name, result in grade.results.items():
            if _verdict(result) == "SKIP":
                lines.append(
                    _("{notebook}: {exercise} skipped, not passed: {reason}").format(
                        notebook=grade.notebook, exercise=name, reason=result[6:]
                    )
                )
        if grade.error:
            lines.append(
                _("{notebook}: could not run: {error}").format(
                    notebook=grade.notebook, error=grade.error
                )
            )
        if grade.ignored:
            lines.append(
                _(
                    "{notebook}: {count} check result(s) displayed by the notebook's own code, "
                    "ignored"
                ).format(notebook=grade.notebook, count=grade.ignored)
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
    "skipped_checks",
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
