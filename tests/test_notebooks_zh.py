"""The course in Chinese as a learner runs it, headless: every built Chinese lesson, solution and
exercise (``slotmap translate build``) runs top to bottom on a fresh kernel under
``SLOTMAP_LANG=zh``, exactly as tests/test_notebooks.py runs the English ones, and speaks
Chinese at run time."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from test_notebooks import (  # noqa: E402
    errors,
    frozen_figures,
    ids,
    run_as_a_learner,
    run_plainly,
    skipped_checks,
    skipped_here,
)

from slotmap.exercises.core import CHECK_MIME  # noqa: E402
from slotmap.exercises.grade import check_records, expected_exercises  # noqa: E402
from slotmap.translate.notebooks import complete_list  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LANG = "zh_CN"
LESSONS = sorted((ROOT / "notebooks" / LANG).glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions" / LANG).glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted((ROOT / "exercises" / LANG).glob("[0-9][0-9]_*.ipynb"))


def in_chinese(monkeypatch: pytest.MonkeyPatch) -> None:
    """The learner's setting: ``slotmap lab --lang zh`` sets it for the kernels."""
    monkeypatch.setenv("SLOTMAP_LANG", "zh")


def test_every_notebook_listed_complete_is_built_and_tested():
    built = {str(p.relative_to(ROOT)).replace(f"/{LANG}/", "/") for p in LESSONS + SOLUTIONS}
    assert built == set(complete_list(LANG))
    assert [p.name for p in EXERCISES] == [p.name for p in SOLUTIONS]


@pytest.mark.parametrize("path", LESSONS, ids=ids(LESSONS))
def test_chinese_lesson_runs_top_to_bottom(path, monkeypatch):
    in_chinese(monkeypatch)
    notebook, sent = run_plainly(path, monkeypatch)
    assert set(sent) <= {"execute_request"}, sorted(set(sent))
    assert errors(notebook) == []
    assert frozen_figures(notebook) == []
    failed = [e for e, passed in check_records(notebook).items() if not passed]
    assert failed == [], f"checks failed in the lesson: {failed}"


@pytest.mark.parametrize("path", SOLUTIONS, ids=ids(SOLUTIONS))
def test_chinese_solution_passes_every_check(path, monkeypatch):
    in_chinese(monkeypatch)
    notebook = run_as_a_learner(path, monkeypatch)
    assert errors(notebook) == []
    expected = expected_exercises(path)
    assert expected == expected_exercises(ROOT / "solutions" / path.name)  # the same checks
    skipped = skipped_checks(notebook)
    assert set(skipped) == skipped_here() & set(expected), skipped
    assert check_records(notebook) == {exercise: exercise not in skipped for exercise in expected}


@pytest.mark.parametrize("path", EXERCISES, ids=ids(EXERCISES))
def test_chinese_exercise_runs_and_its_checks_fail(path, monkeypatch):
    in_chinese(monkeypatch)
    notebook = run_as_a_learner(path, monkeypatch)
    assert errors(notebook) == [], "an exercise must run to the end with its stubs in place"
    records = check_records(notebook)
    assert records == {exercise: False for exercise in expected_exercises(path)}
    reports = [
        output["data"]["text/plain"]
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if CHECK_MIME in output.get("data", {})
    ]
    assert reports
    # ... and says why in Chinese: the learner's stubs untouched, each check reports them.
    assert all(report.startswith("未通过 ") for report in reports), reports
    assert any("还没做完：练习的代码仍然抛出 NotImplementedError" in r for r in reports), reports
