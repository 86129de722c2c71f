"""The course in a real browser, the way a learner uses it.

A headless executor (test_notebooks.py) proves the kernel side only: a widget whose frontend
never loads, a frontend/kernel version mismatch ("model not found") or a figure that does
not follow its slider all pass there. Here ``slotmap lab`` (the command ``make lab`` runs)
serves a temporary copy of the course on loopback, and Debian's Chromium, driven by
Playwright, opens lessons 01, 03 and 07 and the learner's copy of exercise 01, runs all cells
from the Run menu, waits for every widget and figure to render, moves sliders and checks that
the figure changed, and that no cell shows an error. The exercise is filled in by pasting the
solution's code into its cells, and its checks must then pass.

On a failure the viewport is saved at each figure, with the server's log, under
``tests/artifacts/`` (or ``$SLOTMAP_BROWSER_ARTIFACTS``); ``SLOTMAP_BROWSER_SCREENSHOTS=always``
saves them on success too, and ``SLOTMAP_BROWSER_VIEWPORT=WxH`` sets the window (1280x900).

Needs Debian's ``chromium`` (``make test`` installs it) and the ``playwright`` package (the
test extra). Without them the tests skip, except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import pytest
from browser_lab import (
    LabServer,
    NotebookPage,
    artifacts_dir,
    chromium_context,
    png_pixels,
)

ROOT = Path(__file__).resolve().parents[1]
UNDER_CI = bool(os.environ.get("CI"))
# A whole lesson runs in 10-40 s on two CPU cores through Triton's interpreter.
RUN_ALL_MS = 180_000
pytestmark = pytest.mark.timeout(300)


def _missing(reason: str):
    if UNDER_CI:
        pytest.fail(f"{reason} (CI is set: the browser test must run in CI)", pytrace=False)
    pytest.skip(reason)


def _viewport() -> tuple[int, int]:
    width, height = os.environ.get("SLOTMAP_BROWSER_VIEWPORT", "1280x900").lower().split("x")
    return int(width), int(height)


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium")
    with chromium_context(profile, _viewport(), 60_000, _missing) as context:
        yield context


@contextlib.contextmanager
def _lab(base: Path, lang: str):
    server = LabServer(base, lang)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def lab(browser_context, tmp_path_factory):
    with _lab(tmp_path_factory.mktemp("lab"), "en") as server:
        yield server


@pytest.fixture(scope="module")
def lab_zh(browser_context, tmp_path_factory):
    """``slotmap lab --lang zh``: the Chinese lessons, exercises and menus."""
    with _lab(tmp_path_factory.mktemp("lab-zh"), "zh") as server:
        yield server


@contextlib.contextmanager
def _learner(browser_context, server: LabServer, request):
    """A fresh tab; on a failure (or with SLOTMAP_BROWSER_SCREENSHOTS=always) the viewport at
    each figure and the server's log are saved."""
    page = browser_context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    page.page_errors = page_errors
    notebooks: list[NotebookPage] = []

    def open_notebook(path: str) -> NotebookPage:
        notebook = NotebookPage(page, server, path)
        notebooks.append(notebook)
        notebook.open()
        return notebook

    page.open_notebook = open_notebook
    failures_before = request.session.testsfailed
    try:
        yield page
    finally:
        # The test's own report is logged before its fixtures are torn down.
        failed = request.session.testsfailed > failures_before
        if failed or os.environ.get("SLOTMAP_BROWSER_SCREENSHOTS") == "always":
            save_screenshots(page, notebooks, server, request.node.name, failed)
        page.close()
        server.shutdown_kernels()  # the next notebook gets the CPU to itself


@pytest.fixture
def learner(browser_context, lab, request):
    with _learner(browser_context, lab, request) as page:
        yield page


@pytest.fixture
def learner_zh(browser_context, lab_zh, request):
    with _learner(browser_context, lab_zh, request) as page:
        yield page


def save_screenshots(page, notebooks, lab, name: str, failed: bool) -> None:
    folder = artifacts_dir()
    stem = re.sub(r"[^\w.-]+", "_", name) + f"-{'x'.join(map(str, _viewport()))}"
    with contextlib.suppress(Exception):
        page.screenshot(path=str(folder / f"{stem}.png"), timeout=10_000)
    for notebook in notebooks[-1:]:  # the one on screen
        notebook.screenshot_outputs(folder, stem)
    if failed:
        (folder / f"{stem}-lab.log").write_text(lab.log_tail(20_000))
        print(f"\nbrowser test failed: screenshots and the server's log in {folder}")


def assert_no_errors(page, notebook: NotebookPage) -> None:
    assert notebook.error_outputs() == []
    # What a broken widget frontend shows instead of the widget.
    for text in ("Error displaying widget", "model not found", "Failed to load model class"):
        assert notebook.panel.get_by_text(text).count() == 0, f"the page shows {text!r}"
    assert page.page_errors == []


def assert_widgets_rendered(page, notebook: NotebookPage, count: int) -> None:
    """``count`` widgets rendered by the widget manager, each with its controls and a figure,
    and every figure decoded by the browser at a readable size."""
    views = notebook.widget_views()
    try:
        views.nth(count - 1).wait_for(state="attached", timeout=30_000)
    except Exception as error:  # playwright's TimeoutError
        raise AssertionError(
            f"{views.count()} of {count} widgets rendered: the others show as text (is the "
            "widgets extension loaded, and does it match ipywidgets? `slotmap doctor` says)"
        ) from error
    assert views.count() == count
    for index in range(count):
        view = views.nth(index)
        view.locator(".widget-output img").wait_for(state="attached")
        assert view.locator(".widget-slider").count() >= 1
    notebook.wait_figures_decoded(notebook.figures())
    for index in range(count):
        box = views.nth(index).locator(".widget-output img").bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 60, box


def assert_static_figures(notebook: NotebookPage, count: int) -> None:
    figures = notebook.static_figures()
    assert figures.count() == count
    for index in range(count):
        figures.nth(index).scroll_into_view_if_needed()
        box = figures.nth(index).bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 60, box


def assert_slider_redraws(notebook: NotebookPage, view, label: str, before: str, after: str):
    was, now, old, new = notebook.move_slider(view, label)
    assert (was, now) == (before, after)
    assert png_pixels(new) != png_pixels(old), "the figure did not change with its slider"


def test_lesson_01_renders_and_follows_its_sliders(learner):
    notebook = learner.open_notebook("notebooks/01_paged_kv_cache.ipynb")
    assert not notebook.is_dirty(), "lesson 01 shows unsaved changes right after opening"
    notebook.run_all(RUN_ALL_MS)
    assert_widgets_rendered(learner, notebook, 1)
    assert_static_figures(notebook, 2)  # the batch, the decode step
    # The check section shows one failing report and one passing one, rendered.
    for report in ("FAIL 01.slot_of on the named case", "PASS 01.slot_of"):
        notebook.reports(report).first.wait_for(state="attached")
    view = notebook.widget_views().nth(0)
    assert_slider_redraws(notebook, view, "block size", "4", "5")
    assert_slider_redraws(notebook, view, "request 1", "11", "12")
    assert_no_errors(learner, notebook)


def test_lesson_03_renders_and_follows_its_sliders(learner):
    notebook = learner.open_notebook("notebooks/03_window_gather.ipynb")
    notebook.run_all(RUN_ALL_MS)
    assert_widgets_rendered(learner, notebook, 2)
    assert_static_figures(notebook, 2)  # the windows, the failure
    windows, failure = notebook.widget_views().nth(0), notebook.widget_views().nth(1)
    assert_slider_redraws(notebook, windows, "block size", "4", "5")
    assert_slider_redraws(notebook, failure, "first position", "3", "4")
    assert_no_errors(learner, notebook)


def test_lesson_07_runs_its_ranks_from_the_lab_kernel_and_follows_its_sliders(learner):
    # Lesson 07 spawns one process per rank from the kernel the lab started (gloo on the CPU):
    # the multi-process cell must work there too, not only under a headless executor.
    notebook = learner.open_notebook("notebooks/07_end_to_end.ipynb")
    notebook.run_all(RUN_ALL_MS)
    assert_widgets_rendered(learner, notebook, 2)
    assert_static_figures(notebook, 4)  # the cache, two corruptions, the CP picture
    assert notebook.panel.get_by_text(re.compile(r"max \|merged - dense\| = \d")).count() == 1
    paged, cp = notebook.widget_views().nth(0), notebook.widget_views().nth(1)
    assert_slider_redraws(notebook, paged, "block size B", "4", "5")
    assert_slider_redraws(notebook, cp, "sequence length", "13", "14")
    assert_no_errors(learner, notebook)


def _exercise_answers() -> dict[int, str]:
    """Cell index -> the cell as a learner fills it (the workshop driver's ``solved_cells``)."""
    from slotmap.workshop.drive import solved_cells

    answers = solved_cells(ROOT)
    assert len(answers) == 2
    return answers


def test_exercise_01_in_my_work_fails_then_passes_once_filled_in(learner, lab):
    path = "my_work/01_paged_kv_cache.ipynb"
    assert (lab.course / path).exists(), "slotmap lab did not copy the exercises to my_work/"
    notebook = learner.open_notebook(path)
    # As shipped: both checks say "not done yet", and no cell shows a Python error.
    notebook.run_all(RUN_ALL_MS)
    assert notebook.check_records() == {"01.slot_of": False, "01.slot_mapping": False}
    reports = notebook.reports("not done yet")
    reports.nth(1).wait_for(state="attached")
    assert reports.count() == 2
    assert_no_errors(learner, notebook)

    # The learner writes the answers into the stubs' cells and runs everything again.
    for index, answer in _exercise_answers().items():
        notebook.replace_source(index, answer)
        assert notebook.source(index) == answer
    notebook.run_all(RUN_ALL_MS)
    assert notebook.check_records() == {"01.slot_of": True, "01.slot_mapping": True}
    for exercise in ("01.slot_of", "01.slot_mapping"):
        notebook.reports(f"PASS {exercise}:").wait_for(state="attached")
    assert notebook.reports("FAIL").count() == 0
    assert_no_errors(learner, notebook)

    # Saved, the learner's copy keeps the answers and the results (my_work/ is theirs).
    learner.keyboard.press("Control+s")
    learner.wait_for_function(
        "(path) => !window.jupyterapp.shell.currentWidget.context.model.dirty", arg=path
    )
    saved = json.loads((lab.course / path).read_text())
    text = json.dumps(saved)
    assert "PASS 01.slot_of" in text and "PASS 01.slot_mapping" in text
    assert "logical_block = position // block_size" in text


def _zh(message: str) -> str:
    """``message`` as the course's Chinese catalog says it (English where it has none yet)."""
    from slotmap import i18n

    return i18n.tr(message, "zh")


CJK = re.compile(r"[\u4e00-\u9fff]")


def _report_texts(notebook: NotebookPage) -> list[str]:
    """The text of every check report the notebook shows (the outputs that carry a record)."""
    texts = []
    for outputs in notebook.outputs():
        for output in outputs or []:
            if output.get("data", {}).get("application/vnd.slotmap.check+json"):
                texts.append(output["data"].get("text/plain", ""))
    return texts


def _assert_chinese_reports(notebook: NotebookPage, count: int) -> None:
    texts = _report_texts(notebook)
    assert len(texts) == count, texts
    for text in texts:
        assert CJK.search(text), f"a check report in English under --lang zh: {text!r}"
        for english in ("PASS", "FAIL", "not done yet", "agrees with", "the reference"):
            assert english not in text, f"{english!r} left in English: {text!r}"


def test_chinese_lesson_01_and_exercise_01_with_chinese_menus_and_checks(learner_zh, lab_zh):
    # slotmap lab --lang zh: JupyterLab's menus in Chinese, on the Chinese lesson.
    notebook = learner_zh.open_notebook("notebooks/zh_CN/01_paged_kv_cache.ipynb")
    menus = learner_zh.locator(".lm-MenuBar-itemLabel")
    assert "文件" in menus.all_text_contents(), menus.all_text_contents()
    assert notebook.panel.get_by_text("分页 KV 缓存与槽位号").count() >= 1
    notebook.run_all(RUN_ALL_MS)
    assert_widgets_rendered(learner_zh, notebook, 1)
    assert_static_figures(notebook, 2)
    assert notebook.check_records() == {"01.slot_of": True}
    view = notebook.widget_views().nth(0)
    assert_slider_redraws(notebook, view, _zh("block size"), "4", "5")
    assert_no_errors(learner_zh, notebook)

    # The learner's Chinese copy of exercise 01: Chinese "not done yet", then a Chinese pass.
    path = "my_work/zh_CN/01_paged_kv_cache.ipynb"
    assert (lab_zh.course / path).exists(), "slotmap lab --lang zh made no Chinese copies"
    notebook = learner_zh.open_notebook(path)
    notebook.run_all(RUN_ALL_MS)
    assert notebook.check_records() == {"01.slot_of": False, "01.slot_mapping": False}
    _assert_chinese_reports(notebook, 2)
    from slotmap.workshop.drive import solved_cells

    for index, answer in solved_cells(ROOT, "zh_CN/01_paged_kv_cache.ipynb").items():
        notebook.replace_source(index, answer)
    notebook.run_all(RUN_ALL_MS)
    assert notebook.check_records() == {"01.slot_of": True, "01.slot_mapping": True}
    _assert_chinese_reports(notebook, 2)
    assert_no_errors(learner_zh, notebook)
