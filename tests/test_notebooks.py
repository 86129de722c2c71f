"""The course as a learner runs it, headless: every lesson and every solution runs top to
bottom on a fresh kernel with all its checks passing; every shipped exercise runs without
crashing and its checks report failure; nothing is committed with outputs.

Every notebook runs on a kernel without ``TRITON_INTERPRET`` in its environment, as in VS Code
or a plain ``jupyter lab``: slotmap must set it before triton builds anything."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import slotmap

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from test_lesson_prose import answered_before_asked  # noqa: E402

from slotmap.exercises.core import CHECK_MIME  # noqa: E402
from slotmap.exercises.grade import (  # noqa: E402
    check_records,
    execute_notebook,
    expected_exercises,
    skipped_checks,
)

ROOT = Path(__file__).resolve().parents[1]
# Seconds a cell may take. A whole notebook takes at most about 17 s (lesson 08's live bench
# on a GPU, compilation included); a cell that a missed wake-up stalls (docs/headless-stall.md)
# waits out the whole limit, so a short limit bounds what a regression costs.
CELL_TIMEOUT = 60
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))
CAPSTONE = "09_capstone.ipynb"


def run_as_a_learner(path: Path, monkeypatch: pytest.MonkeyPatch):
    """Execute ``path`` as ``execute_notebook`` does, on a kernel whose environment lacks
    ``TRITON_INTERPRET`` (importing slotmap in this process set it)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return execute_notebook(path, timeout=CELL_TIMEOUT, allow_errors=True)


def ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def errors(notebook) -> list[str]:
    return [
        f"{output.get('ename')}: {output.get('evalue')}"
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]


def with_outputs(cell) -> str:  # noqa: ANN001
    """A cell's source, then the text its outputs show (streams and plain-text data)."""
    shown = [cell.source]
    for output in cell.get("outputs", []):
        shown.append(output.get("text") or output.get("data", {}).get("text/plain", ""))
    return "\n".join(shown)


def test_the_course_has_its_lessons_and_exercises():
    assert LESSONS and LESSONS[0].name.startswith("00_")
    lesson_numbers = {p.name[:2] for p in LESSONS}
    for solution in SOLUTIONS:
        # The capstone exercises the whole course: it has no lesson of its own.
        has_lesson = solution.name[:2] in lesson_numbers or solution.name == CAPSTONE
        assert has_lesson, f"{solution.name} has no lesson"
        assert expected_exercises(solution), f"{solution.name} checks no exercise"
    assert [p.name for p in EXERCISES] == [p.name for p in SOLUTIONS]


def frozen_figures(notebook) -> list[int]:
    """Cells that show a widget and, beside it, a static image: a figure the widget left open,
    which the inline backend shows again under the live one, and which never changes."""
    frozen = []
    for index, cell in enumerate(notebook.cells):
        kinds = [set(o.get("data", {})) for o in cell.get("outputs", [])]
        widget = any(WIDGET in k for k in kinds)
        if widget and any("image/png" in k for k in kinds):
            frozen.append(index)
    return frozen


WIDGET = "application/vnd.jupyter.widget-view+json"


def run_plainly(path: Path, monkeypatch: pytest.MonkeyPatch):
    """Execute ``path`` with nbclient's own ``NotebookClient``, as ``jupyter nbconvert
    --execute`` does (no sliced waits), on a kernel without ``TRITON_INTERPRET``. Returns the
    notebook and the type of every message the client sent on the kernel's shell channel."""
    import nbclient
    import nbformat

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    notebook = nbformat.read(path, as_version=4)
    sent: list[str] = []

    def record_shell_messages(**_):  # on_cell_execute: the client and its channels exist
        channel = client.kc.shell_channel
        if not hasattr(channel, "recorded"):
            send = channel.send

            def recording(message):  # noqa: ANN001, ANN202
                sent.append(message["header"]["msg_type"])
                return send(message)

            channel.send, channel.recorded = recording, True

    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}},
        on_cell_execute=record_shell_messages,
    )
    client.execute()
    return notebook, sent


@pytest.mark.parametrize("path", LESSONS, ids=ids(LESSONS))
def test_lesson_runs_top_to_bottom(path, monkeypatch):
    """With plain nbclient, as ``jupyter nbconvert --execute`` runs it. The client sends the
    kernel nothing but the cells while they run: nbclient echoes output that a widget's Output
    captured back on the shell socket it is waiting on, and that send can swallow the wake-up of
    the cell's reply, stalling a finished cell for the whole timeout (docs/headless-stall.md)."""
    notebook, sent = run_plainly(path, monkeypatch)
    assert set(sent) <= {"execute_request"}, sorted(set(sent))
    assert errors(notebook) == []
    # What a cell prints before a prediction does not answer it either.
    assert answered_before_asked([(c.cell_type, with_outputs(c)) for c in notebook.cells]) == []
    assert frozen_figures(notebook) == []
    failed = [e for e, passed in check_records(notebook).items() if not passed]
    assert failed == [], f"checks failed in the lesson: {failed}"


def skipped_here() -> set[str]:
    """The checks that skip on this machine: the timing off an NVIDIA GPU, and the rank
    function where fewer than two devices can each hold a rank."""
    from slotmap.cp import max_ranks

    skipped = set() if slotmap.BACKEND.name == "cuda" else {"09.fused_groups_time"}
    return skipped | ({"05.rank_fn"} if max_ranks() < 2 else set())


@pytest.mark.parametrize("path", SOLUTIONS, ids=ids(SOLUTIONS))
def test_solution_passes_every_check(path, monkeypatch):
    notebook = run_as_a_learner(path, monkeypatch)
    assert errors(notebook) == []
    expected = expected_exercises(path)
    skipped = skipped_checks(notebook)
    assert set(skipped) == skipped_here() & set(expected), skipped
    assert check_records(notebook) == {exercise: exercise not in skipped for exercise in expected}


@pytest.mark.parametrize("path", EXERCISES, ids=ids(EXERCISES))
def test_shipped_exercise_runs_and_its_checks_fail(path, monkeypatch):
    notebook = run_as_a_learner(path, monkeypatch)
    assert errors(notebook) == [], "an exercise must run to the end with its stubs in place"
    records = check_records(notebook)
    assert records == {exercise: False for exercise in expected_exercises(path)}
    # Each check blames the stub, not the learner's algorithm or a crash of its own.
    reports = [
        output["data"]["text/plain"]
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if CHECK_MIME in output.get("data", {})
    ]
    assert reports and all("not done yet" in report for report in reports), reports


ALL = LESSONS + SOLUTIONS + EXERCISES


@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_committed_without_outputs(path):
    import nbformat

    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None


def test_the_learners_kernel_lacks_triton_interpret(tmp_path, monkeypatch):
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("import os\nos.environ.get('TRITON_INTERPRET')")]
    path = tmp_path / "probe.ipynb"
    nbformat.write(notebook, path)
    assert "TRITON_INTERPRET" in __import__("os").environ  # set by importing slotmap here
    executed = run_as_a_learner(path, monkeypatch)
    assert [o.get("data", {}).get("text/plain") for o in executed.cells[0].outputs] == []


@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_slotmap_is_imported_before_triton(path):
    """slotmap.course sets TRITON_INTERPRET=1 on a CPU; triton must not build anything before
    that. The course's import comes first (a plain ``import slotmap`` sets nothing)."""
    import nbformat

    first: dict[str, tuple[int, int]] = {}
    for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
        code = cell.source.splitlines() if cell.cell_type == "code" else []
        if code[:1] and code[0].startswith("%%writefile"):
            continue  # a file the notebook writes for its ranks, not the notebook's own code
        for number, line in enumerate(code):
            module = re.match(r"\s*(?:import|from)\s+(slotmap\.course|slotmap|triton)\b", line)
            if module:
                first.setdefault(module.group(1), (index, number))
    if "slotmap" in first or "triton" in first:
        course = first.get("slotmap.course", (len(first),))
        assert course <= min(first.get("slotmap", course), first.get("triton", course))


TRITON_FIRST = """
import sys
import triton
import triton.language as tl


@triton.jit
def before(x_ptr):
    tl.store(x_ptr, 1)


import torch
import slotmap
from slotmap import compute_slot_mapping


@triton.jit
def after(x_ptr, N: tl.constexpr):
    lanes = tl.arange(0, N)
    values = tl.load(x_ptr + lanes)
    tl.store(x_ptr + lanes, values - tl.min(values, axis=0) + tl.cdiv(values.max(axis=0), 2))


x = torch.tensor([5, 3, 9, 4])
after[(1,)](x, 4)
print(x.tolist())
qsl = torch.tensor([0, 3], dtype=torch.int32)
table = torch.tensor([[5, 6]], dtype=torch.int32)
print(compute_slot_mapping(qsl, torch.arange(3), table, 4).tolist())
"""


def test_triton_imported_before_slotmap_still_interprets(tmp_path):
    """VS Code or a plain jupyter lab: no TRITON_INTERPRET, and triton imported first. slotmap
    decorates triton.language's own helpers again, and names a kernel it cannot save."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(SLOTMAP_BACKEND="cpu", PYTHONPATH=str(ROOT))
    script = tmp_path / "triton_first.py"  # @triton.jit needs the source in a file
    script.write_text(TRITON_FIRST)
    run = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines()[-2:] == ["[7, 5, 11, 6]", "[20, 21, 22]"]
    warnings = [line for line in run.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "slotmap: warning: __main__.before was decorated before slotmap chose the CPU "
        "interpreter and cannot run: restart the kernel and import slotmap before triton"
    ]
