"""Grade a folder of learner notebooks headless: notebook x exercise, pass or fail.

Each notebook runs top to bottom on a fresh kernel (errors do not stop it). Every
``check(...)`` call leaves a ``CHECK_MIME`` output; the grader collects them. The exercises a
notebook is expected to contain are those its solution (``solutions/<same name>``) checks, so
a deleted check cell shows up as "missing" rather than vanishing from the table.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from slotmap.exercises.build import ROOT, SOLUTIONS
from slotmap.exercises.core import CHECK_MIME

CHECK_CALL = re.compile(r"""\bcheck\(\s*["'](\d\d\.[\w.-]+)["']""")


def execute_notebook(path: Path, *, timeout: int = 300, allow_errors: bool = False):
    """Run a notebook top to bottom on a fresh python3 kernel, in its own folder, with this
    checkout importable. Returns the executed nbformat notebook.

    Per-cell ``timeout``: ipykernel 7 can stall a finished cell until the timeout (slotmap
    pins ipykernel<7, where it does not happen).
    """
    import nbclient
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(path.parent)}},
    )
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    client.execute(env=dict(os.environ, PYTHONPATH=pythonpath))
    return notebook


def solution_of(path: Path, solutions: Path = SOLUTIONS) -> Path | None:
    """The solution a submitted notebook answers: same file name, or a name that ends with a
    solution's (``alice_01_paged_kv_cache.ipynb``, ``alice/01_paged_kv_cache.ipynb``)."""
    names = sorted(solutions.glob("*.ipynb"), key=lambda s: -len(s.name))
    return next((s for s in names if path.name.endswith(s.name)), None)


def expected_exercises(path: Path, solutions: Path = SOLUTIONS) -> list[str]:
    """The exercise ids that this notebook's solution checks (or, without one, that the
    notebook itself checks), in order."""
    source = solution_of(path, solutions) or path
    notebook = json.loads(source.read_text(encoding="utf-8"))
    ids: list[str] = []
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            ids += [i for i in CHECK_CALL.findall(text) if i not in ids]
    return ids


def check_records(notebook) -> dict[str, bool]:
    """exercise id -> passed, from an executed notebook's outputs (the last check wins)."""
    results: dict[str, bool] = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            record = output.get("data", {}).get(CHECK_MIME)
            if record:
                results[record["exercise"]] = bool(record["passed"])
    return results


@dataclass
class Grade:
    notebook: str
    results: dict[str, str] = field(default_factory=dict)  # id -> PASS / FAIL / missing
    error: str = ""  # a notebook that could not run at all


def grade_notebook(
    path: Path, *, timeout: int = 300, solutions: Path = SOLUTIONS, name: str | None = None
) -> Grade:
    grade = Grade(name or path.name)
    expected = expected_exercises(path, solutions)
    try:
        records = check_records(execute_notebook(path, timeout=timeout, allow_errors=True))
    except Exception as error:  # a broken notebook file, a dead kernel, a timeout
        grade.error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        records = {}
    for exercise in expected + [i for i in records if i not in expected]:
        if exercise in records:
            grade.results[exercise] = "PASS" if records[exercise] else "FAIL"
        else:
            grade.results[exercise] = "missing"
    return grade


def table(grades: list[Grade]) -> str:
    """A plain-text table: one row per notebook, one column per exercise."""
    exercises: list[str] = []
    for grade in grades:
        exercises += [e for e in grade.results if e not in exercises]
    exercises.sort()
    header = ["notebook", *exercises, "passed"]
    rows = []
    for grade in grades:
        cells = [grade.results.get(e, "") for e in exercises]
        passed = sum(c == "PASS" for c in cells)
        total = sum(c != "" for c in cells)
        rows.append(
            [grade.notebook, *cells, f"{passed}/{total}" + (" (error)" if grade.error else "")]
        )
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for grade in grades:
        if grade.error:
            lines.append(f"{grade.notebook}: could not run: {grade.error}")
    return "\n".join(lines)


def grade_folder(folder: Path, *, timeout: int = 300, solutions: Path = SOLUTIONS) -> list[Grade]:
    folder = Path(folder)
    notebooks = sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    return [
        grade_notebook(path, timeout=timeout, solutions=solutions,
                       name=path.relative_to(folder).as_posix())
        for path in notebooks
    ]  # fmt: skip
