"""Translated notebooks: built from the English ones plus per-cell translations, and a check that
names every stale or missing cell (slotmap.translate.notebooks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("babel")

from slotmap.translate import notebooks  # noqa: E402
from slotmap.translate.notebooks import (  # noqa: E402
    build_translations,
    carried_over,
    carry_over_problems,
    po_path,
    read_catalog,
    status,
    translation_problems,
    update_translations,
    write_catalog,
)

LESSON = "notebooks/01_x.ipynb"
SOLUTION = "solutions/01_x.ipynb"
ZH = {
    "intro": "# 01 · 分页 KV 缓存\n\n每个 token 的槽位号由块表决定。",
    "predict": "**先预测：** 位置 `5` 落在哪个逻辑块？",
    "answer": "答案：<!-- BEGIN SOLUTION -->逻辑块 1。<!-- END SOLUTION -->",
}


def cell(kind: str, cell_id: str, source: str) -> dict:
    made = {"cell_type": kind, "id": cell_id, "metadata": {}, "source": source}
    if kind == "code":
        made.update(outputs=[], execution_count=None)
    return made


def notebook(*cells: dict) -> str:
    data = {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(data, indent=1)


def a_course(root: Path) -> Path:
    """A course with one lesson and one solution, in English only."""
    (root / "notebooks").mkdir(parents=True)
    (root / "solutions").mkdir()
    (root / LESSON).write_text(
        notebook(
            cell(
                "markdown",
                "intro",
                "# 01 · The paged KV cache\n\nEach token's slot id comes from the block table.",
            ),
            cell("code", "setup", "import slotmap.course  # the backend line\nx = 5 // 4"),
            cell("markdown", "predict", "**Predict:** which logical block holds position `5`?"),
        )
    )
    (root / SOLUTION).write_text(
        notebook(
            cell(
                "markdown",
                "answer",
                "Answer: <!-- BEGIN SOLUTION -->logical block 1.<!-- END SOLUTION -->",
            ),
            cell("code", "work", "### BEGIN SOLUTION\nblock = 5 // 4\n### END SOLUTION"),
        )
    )
    return root


def translate(root: Path, notebook_name: str, **cells: str) -> None:
    path = po_path(notebook_name, root=root)
    catalog = read_catalog(path)
    for message in catalog:
        if message.context in cells:
            message.string = cells[message.context]
    write_catalog(path, catalog)


def mark_complete(root: Path, *names: str) -> None:
    (root / "translations" / "zh_CN" / "complete.txt").write_text("\n".join(names) + "\n")


@pytest.fixture
def course(tmp_path: Path) -> Path:
    root = a_course(tmp_path / "course")
    update_translations(root=root)
    return root


def test_update_gives_every_markdown_cell_an_entry_keyed_by_its_id_and_english(course):
    catalog = read_catalog(po_path(LESSON, root=course))
    entries = {m.context: m for m in catalog if m.id}
    assert sorted(entries) == ["intro", "predict"]  # code cells are never translated
    assert entries["predict"].id == "**Predict:** which logical block holds position `5`?"
    assert status(LESSON, root=course).missing == ["intro", "predict"]
    # Nothing claims to be complete, nothing is stale: the check passes and nothing is built.
    assert translation_problems(root=course) == []
    assert build_translations(root=course) == []


def test_a_complete_translation_builds_a_notebook_whose_code_is_the_english_code(course):
    translate(course, LESSON, intro=ZH["intro"], predict=ZH["predict"])
    translate(course, SOLUTION, answer=ZH["answer"])
    mark_complete(course, LESSON, SOLUTION)
    assert translation_problems(root=course) == [
        "notebooks/zh_CN/01_x.ipynb is missing (slotmap translate build)",
        "solutions/zh_CN/01_x.ipynb is missing (slotmap translate build)",
    ]
    build_translations(root=course)
    assert translation_problems(root=course) == []
    english = json.loads((course / LESSON).read_text())["cells"]
    chinese = json.loads((course / "notebooks/zh_CN/01_x.ipynb").read_text())["cells"]
    assert [c["id"] for c in chinese] == [c["id"] for c in english]
    assert chinese[1] == english[1]  # the code cell, exactly
    assert "".join(chinese[0]["source"]) == ZH["intro"]
    assert "".join(chinese[2]["source"]) == ZH["predict"]
    # The exercises in Chinese are cut from the solutions in Chinese, by the exercises' rule.
    exercise = json.loads((course / "exercises/zh_CN/01_x.ipynb").read_text())
    texts = ["".join(c["source"]) for c in exercise["cells"]]
    assert "答案：*在这里写下你的答案。*" in texts  # the stub in the notebook's language
    assert "# YOUR CODE HERE\nraise NotImplementedError()" in texts


def test_a_changed_english_cell_makes_its_translation_stale_and_the_check_names_it(course):
    translate(course, LESSON, intro=ZH["intro"], predict=ZH["predict"])
    mark_complete(course, LESSON)
    build_translations(root=course)
    lesson = json.loads((course / LESSON).read_text())
    lesson["cells"][2]["source"] = "**Predict:** which logical block holds position `9`?"
    (course / LESSON).write_text(json.dumps(lesson))
    problems = translation_problems(root=course)
    assert "notebooks/01_x.ipynb, cell predict: stale (the English changed)" in problems
    assert "notebooks/zh_CN/01_x.ipynb differs from what its translation builds" not in problems
    assert "notebooks/zh_CN/01_x.ipynb is built, but its translation is not complete" in problems
    with pytest.raises(ValueError, match="listed complete but not: notebooks/01_x.ipynb"):
        build_translations(root=course)
    # update keeps the translation for the translator, marked fuzzy with the old English: still
    # stale until someone mends it.
    update_translations(root=course)
    message = {m.context: m for m in read_catalog(po_path(LESSON, root=course))}["predict"]
    assert message.fuzzy and message.string == ZH["predict"]
    # The reviewer sees the English it was translated from (Babel writes it, does not read it).
    assert '#| msgid "**Predict:** which logical block holds position `5`?"' in (
        po_path(LESSON, root=course).read_text()
    )
    assert status(LESSON, root=course).stale == ["predict"]
    translate(course, LESSON, predict="**先预测：** 位置 `9` 落在哪个逻辑块？")
    catalog = read_catalog(po_path(LESSON, root=course))
    for m in catalog:
        m.flags.discard("fuzzy")
    write_catalog(po_path(LESSON, root=course), catalog)
    build_translations(root=course)
    assert translation_problems(root=course) == []


def test_a_stale_translation_fails_the_check_even_in_a_notebook_not_yet_complete(course):
    translate(course, LESSON, intro=ZH["intro"])
    lesson = json.loads((course / LESSON).read_text())
    lesson["cells"][0]["source"] += " It is an int32."
    (course / LESSON).write_text(json.dumps(lesson))
    assert translation_problems(root=course) == [
        "notebooks/01_x.ipynb, cell intro: stale (the English changed)"
    ]


def test_a_new_english_cell_in_a_complete_notebook_is_named_missing(course):
    translate(course, LESSON, intro=ZH["intro"], predict=ZH["predict"])
    mark_complete(course, LESSON)
    build_translations(root=course)
    lesson = json.loads((course / LESSON).read_text())
    lesson["cells"].append(cell("markdown", "takeaways", "## Takeaways"))
    (course / LESSON).write_text(json.dumps(lesson))
    problems = translation_problems(root=course)
    assert "notebooks/01_x.ipynb, cell takeaways: missing (listed complete)" in problems


def test_a_translation_whose_english_cell_is_gone_is_named(course):
    translate(course, LESSON, intro=ZH["intro"])
    lesson = json.loads((course / LESSON).read_text())
    lesson["cells"][0]["id"] = "intro-2"
    (course / LESSON).write_text(json.dumps(lesson))
    assert "notebooks/01_x.ipynb, cell intro: translated, but no such English cell" in (
        translation_problems(root=course)
    )


def test_update_follows_a_cell_whose_id_changed_but_whose_english_did_not(course):
    translate(course, LESSON, intro=ZH["intro"])
    lesson = json.loads((course / LESSON).read_text())
    lesson["cells"][0]["id"] = "intro-2"
    (course / LESSON).write_text(json.dumps(lesson))
    update_translations(root=course)
    assert status(LESSON, root=course).translated == ["intro-2"]
    assert translation_problems(root=course) == []


def test_a_built_notebook_edited_by_hand_is_named(course):
    translate(course, LESSON, intro=ZH["intro"], predict=ZH["predict"])
    mark_complete(course, LESSON)
    build_translations(root=course)
    built = course / "notebooks/zh_CN/01_x.ipynb"
    built.write_text(built.read_text().replace("块表", "页表"))
    assert translation_problems(root=course) == [
        "notebooks/zh_CN/01_x.ipynb differs from what its translation builds"
    ]


@pytest.mark.parametrize(
    ("chinese", "complaint"),
    [
        ("**先预测：** 位置 5 落在哪个逻辑块？", "code, math, links or markers differ"),
        ("**先预测：** 位置 `5` 落在哪个逻辑块？$p$", "code, math, links or markers differ"),
        ("答案：逻辑块 1。", "code, math, links or markers differ"),
        ("每个 token 有 8 个槽位。", "numbers of the English missing: ['16']"),
    ],
)
def test_a_translation_must_keep_the_code_math_markers_and_numbers_of_its_english(
    chinese, complaint
):
    english = {
        "**先预测：** 位置 5 落在哪个逻辑块？": "**Predict:** which logical block holds `5`?",
        "**先预测：** 位置 `5` 落在哪个逻辑块？$p$": "**Predict:** which block holds `5`?",
        "答案：逻辑块 1。": "Answer: <!-- BEGIN SOLUTION -->block 1.<!-- END SOLUTION -->",
        "每个 token 有 8 个槽位。": "Each token has 16 slots.",
    }[chinese]
    problems = carry_over_problems("here", english, chinese)
    assert len(problems) == 1 and complaint in problems[0], problems
    assert carry_over_problems("here", english, english) == []


def test_a_code_span_or_math_that_wraps_onto_the_next_line_is_kept_whole():
    """Markdown lets an inline span wrap at a line break (not a blank line): the check must
    read it whole, or it pairs the wrong backticks and compares English prose."""
    english = "Call `slotmap.token_slot(\n    pos)` on $j = b\n\\bmod W$ twice.\n\nAnd `x`."
    chinese = (
        "调用 `slotmap.token_slot(\n    pos)`，作用于 $j = b\n\\bmod W$，两次。\n\n以及 `x`。"
    )
    assert carry_over_problems("here", english, chinese) == []
    kept, _ = carried_over(english)
    assert kept == ["`slotmap.token_slot(\n    pos)`", "$j = b\n\\bmod W$", "`x`"]
    # A blank line ends a paragraph: a lone backtick there does not swallow the next one.
    assert carried_over("a ` b\n\nc `d` e")[0] == ["`d`"]


def test_a_course_notebook_may_be_named_in_the_translations_own_folder():
    english = "Do `exercises/01_x.ipynb` (your copy: `my_work/01_x.ipynb`)."
    chinese = "做 `exercises/zh_CN/01_x.ipynb`（你的副本：`my_work/zh_CN/01_x.ipynb`）。"
    assert carry_over_problems("here", english, chinese) == []
    moved = "做 `exercises/zh_CN/02_y.ipynb`（你的副本：`my_work/zh_CN/01_x.ipynb`）。"
    assert carry_over_problems("here", english, moved) != []


def test_the_chinese_lessons_send_the_learner_to_the_chinese_exercises_and_copies():
    """A Chinese lesson's exercise is the Chinese one, and the learner's copy of it is the one
    `slotmap lab --lang zh` made, in my_work/zh_CN/."""
    import re

    named = [
        (where, path)
        for where, _, chinese in notebooks.translated_texts()
        if where.startswith("notebooks/")
        for path in re.findall(r"`((?:exercises|my_work)/[^`]*\.ipynb)`", chinese)
    ]
    assert named, "no lesson names its exercise"
    english = [(where, path) for where, path in named if "/zh_CN/" not in path]
    assert english == []


def test_the_repository_translations_are_current_and_keep_what_they_must():
    """The check CI runs: every translation current, every notebook listed complete built
    from it (the list says which are complete: none yet is honest), nothing dropped."""
    assert translation_problems() == []
    listed = notebooks.complete_list()
    for notebook in listed:
        assert status(notebook).complete, notebook
    print("complete in zh_CN:", listed or "none yet")
    kept = [
        problem
        for where, english, chinese in notebooks.translated_texts()
        for problem in carry_over_problems(where, english, chinese)
    ]
    assert kept == []


def test_the_translate_command_checks_the_repository(capsys):
    pytest.importorskip("babel")
    from slotmap.cli import main

    assert main(["translate", "build", "--check"]) == 0
    out = capsys.readouterr().out
    assert "notebooks/01_paged_kv_cache.ipynb" in out and "translated" in out
    assert main(["translate", "messages", "--check", "--lang", "zh"]) == 0
    assert "the zh_CN catalog says everything the source says" in capsys.readouterr().out
