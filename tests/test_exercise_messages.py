"""What the exercises say at run time, in the learner's language: a wrong answer's check message
and the grade summary in Chinese under ``i18n.use("zh")`` and in English under ``"en"``, and the
Chinese exercise notebooks' banner and stubs in Chinese."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import slotmap
from slotmap import i18n
from slotmap.exercises import get_exercise, run_check
from slotmap.exercises.build import (
    BANNER,
    MY_BANNER,
    STUB_ANSWER,
    copy_to_workspace,
    exercise_notebook,
)
from slotmap.exercises.grade import Grade, table
from slotmap.i18n import columns

ROOT = Path(__file__).resolve().parents[1]
CJK = re.compile(r"[\u4e00-\u9fff]")
# One exercise of each lesson that a plain function answers: a wrong answer fails on the first
# named case, without launching a kernel.
ONE_A_LESSON = (
    "01.slot_of",
    "02.first_kernel",
    "03.window_size",
    "04.ring_slot",
    "05.is_local",
    "06.expand_block_table",
    "07.lse_merge",
    "08.bytes_moved",
    "09.group_window",
)


@pytest.fixture
def speak():
    """``speak(lang)`` switches the course's language; the one before comes back afterwards."""
    before = i18n.language()
    yield i18n.use
    i18n.use(before)


def wrong_answer(*args: object, **kwargs: object) -> str:
    return "not an answer"


def failure_report(exercise_id: str) -> str:
    result = run_check(get_exercise(exercise_id), wrong_answer, max_examples=1)
    assert not result.passed and result.failure is not None and not result.skipped
    return result.report()


@pytest.mark.parametrize("exercise_id", ONE_A_LESSON)
def test_a_wrong_answer_is_explained_in_chinese(speak, exercise_id):
    speak("zh")
    report = failure_report(exercise_id)
    first, broken = report.splitlines()[:2]
    assert first.startswith(f"未通过 {exercise_id}，出错的是具名用例「"), report
    assert CJK.search(first.partition("「")[2]), report  # the case's name, translated
    assert broken.startswith("  问题：    ") and CJK.search(broken), report


@pytest.mark.parametrize("exercise_id", ONE_A_LESSON)
def test_a_wrong_answer_is_explained_in_english(speak, exercise_id):
    speak("en")
    report = failure_report(exercise_id)
    assert report.startswith(f"FAIL {exercise_id} on the named case '"), report
    assert "\n  broken:   " in report and not CJK.search(report), report


def test_an_input_the_learner_built_is_described_in_chinese(speak):
    from english_left import KEPT, english_words

    speak("zh")
    report = failure_report("03.break_window")
    (shown,) = [line for line in report.splitlines() if line.startswith("  输入：")]
    assert english_words(shown, KEPT) == [], report


def test_a_pass_and_a_stub_read_in_chinese(speak):
    speak("zh")
    passed = run_check(get_exercise("01.slot_of"), lambda p, row, b: row[p // b] * b + p % b)
    assert re.fullmatch(
        r"通过 01\.slot_of：\d+ 个具名用例和 \d+ 个随机用例都与参考实现一致。", passed.report()
    )

    def stub(*args: object) -> int:
        raise NotImplementedError()

    report = run_check(get_exercise("01.slot_of"), stub).report()
    assert "  问题：    还没做完：练习的代码仍然抛出 NotImplementedError" in report
    assert "  提示：    把 `# YOUR CODE HERE`" in report


def test_the_grade_summary_in_chinese_and_in_english(speak):
    grades = [
        Grade("ada.ipynb", {"01.slot_of": "PASS", "01.slot_mapping": "FAIL"}),
        Grade("bob.ipynb", {"01.slot_of": "SKIP: no GPU here", "01.slot_mapping": "PASS"}),
    ]
    speak("zh")
    chinese = table(grades, width=200).splitlines()
    assert chinese[0].split() == ["笔记本", "01.slot_mapping", "01.slot_of", "通过"]
    assert chinese[2].split() == ["ada.ipynb", "未通过", "通过", "1/2"]
    assert chinese[3].split() == ["bob.ipynb", "通过", "跳过", "1/2，跳过", "1", "个"]
    assert chinese[4] == "bob.ipynb：01.slot_of 被跳过，不算通过：no GPU here"
    # The columns line up on the screen: a Chinese character takes two columns.
    for header, cell in (("01.slot_mapping", "未通过"), ("通过", "1/2")):
        column = columns(chinese[0][: chinese[0].index(header)])
        assert columns(chinese[2][: chinese[2].index(cell)]) == column
    speak("en")
    english = table(grades, width=200).splitlines()
    assert english[0].split() == ["notebook", "01.slot_mapping", "01.slot_of", "passed"]
    assert english[3].split() == ["bob.ipynb", "PASS", "SKIP", "1/2,", "1", "skipped"]
    assert english[4] == "bob.ipynb: 01.slot_of skipped, not passed: no GPU here"


def test_a_chinese_exercise_notebook_has_its_banner_and_stubs_in_chinese(speak, tmp_path):
    """The notebook's own language decides (its metadata), not the language of the build."""
    speak("en")
    solution = ROOT / "solutions" / "zh_CN" / "01_paged_kv_cache.ipynb"
    notebook = exercise_notebook(solution)
    assert notebook["metadata"]["slotmap"]["language"] == "zh_CN"
    banner = "".join(notebook["cells"][0]["source"])
    assert banner == i18n.tr(BANNER, "zh").format(name=f"zh_CN/{solution.name}") != BANNER
    assert banner.startswith("> **练习笔记本**")
    # The Chinese notebooks' own folders: where the solution is, where the learner's copy is.
    assert f"`solutions/zh_CN/{solution.name}`" in banner
    assert f"`my_work/zh_CN/{solution.name}`" in banner
    assert notebook["metadata"]["slotmap"]["generated_from"] == f"solutions/zh_CN/{solution.name}"
    markdown = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown"]
    assert any(i18n.tr(STUB_ANSWER, "zh") in text for text in markdown)
    assert not any(STUB_ANSWER in text for text in markdown)
    # The committed one is what the build makes, and the learner's copy says it in Chinese too.
    shipped = ROOT / "exercises" / "zh_CN" / solution.name
    assert json.loads(shipped.read_text(encoding="utf-8")) == notebook
    copy_to_workspace(shipped.parent, tmp_path)
    mine = json.loads((tmp_path / solution.name).read_text(encoding="utf-8"))
    assert "".join(mine["cells"][0]["source"]) == i18n.tr(MY_BANNER, "zh").format(
        name=f"zh_CN/{solution.name}"
    )
    assert "".join(mine["cells"][0]["source"]).startswith(
        f"> 这是 `exercises/zh_CN/{solution.name}`"
    )


def test_an_english_exercise_notebook_stays_english_under_chinese(speak):
    speak("zh")
    solution = ROOT / "solutions" / "01_paged_kv_cache.ipynb"
    notebook = exercise_notebook(solution)
    assert "".join(notebook["cells"][0]["source"]) == BANNER.format(name=solution.name)
    assert "language" not in notebook["metadata"]["slotmap"]


def test_the_break_window_hint_states_the_lessons_tile(speak):
    """A message is a literal: the hint's number is written out, and must stay TILE's."""
    from slotmap.exercises.core import plural
    from slotmap.exercises.lesson03 import TILE

    speak("en")
    hint = get_exercise("03.break_window").hint
    assert hint.startswith(f"Tiles hold {plural(TILE, 'token')}: ")


# A judge that refines a report (which part of the window went wrong, which % the kernel used,
# a sentinel left as the window's base) decides from what broke, never from the words: in
# Chinese it finds the same mistake as in English.
def test_a_refined_diagnosis_is_made_in_chinese_too(speak):
    import test_lesson03
    import test_lesson04
    from lesson_helpers import failure

    speak("zh")
    sentinel = failure("03.window_kernel", test_lesson03.Variant(SENTINEL=0)).invariant
    assert sentinel.startswith("token 8（请求 0，位置 28）应在槽位 88，实际是 60：")
    assert "就好像窗口从逻辑块 0 开始：tile 的最后 5 个 lane 越过了请求末尾" in sentinel
    truncating = failure("04.circular_kernel", test_lesson04.Variant(test_lesson04.TRUNCATING_MOD))
    assert "（C 风格向零截断的 % 留下了负偏移 -3：那是前一个块的槽位）" in truncating.invariant


@pytest.mark.skipif(not slotmap.BACKEND.interpreted, reason="loads are checked interpreted")
def test_a_window_base_left_at_int32_max_is_named_in_chinese(speak):
    import test_lesson09
    from lesson_helpers import failure

    speak("zh")
    found = failure("09.fused_groups", test_lesson09.Variant(test_lesson09.NO_BASE_RESET))
    assert found.invariant.startswith("load（第 ")
    assert found.invariant.endswith(
        "：请求 1 的 tile 中没有一个 lane 有槽位（每个位置都是负的），所以窗口的起点停在了 "
        "INT32_MAX 哨兵值上，而 INT32_MAX + 1 溢出绕回成了 -2^31"
    )


def test_a_read_out_of_bounds_in_a_graded_kernel_keeps_what_broke():
    """Under ``slotmap grade`` a kernel's out-of-bounds read is seen where the kernel runs and
    comes back to the judge as data: with its kind and index, which the judge reads (lesson
    09's sentinel diagnosis) instead of the words; anything else the kernel sends is dropped."""
    import socket
    import threading

    from slotmap.exercises import Wrong, gradecheck

    def read_far_away(read_index: object) -> None:
        wrong = Wrong("lane 1 of the load reads block_table[-2147483648]", "in bounds", "", "")
        wrong.kind, wrong.read_index = "out_of_bounds", read_index
        raise wrong

    def judge_side(read_index: object) -> Wrong:
        ours, theirs = socket.socketpair()
        kernel = threading.Thread(
            target=gradecheck._serve_one, args=(theirs, "09.fused_groups", read_far_away, {})
        )
        kernel.start()
        try:
            gradecheck._receive(ours, trusted=False)  # the candidate's description
            with pytest.raises(Wrong) as raised:
                gradecheck._Channel(ours).request("call", None, (read_index,), {})
            gradecheck._send(ours, {"op": "done", "target": "FAIL"})
        finally:
            kernel.join(10)
            ours.close()
            theirs.close()
        return raised.value

    wrong = judge_side(-(2**31))
    assert (wrong.kind, wrong.read_index) == ("out_of_bounds", -(2**31))
    assert wrong.invariant == "lane 1 of the load reads block_table[-2147483648]"

    # A kernel is untrusted: what it sends is data, and a read_index that is no int is dropped.
    ours, theirs = socket.socketpair()
    forged = {"invariant": "x", "kind": "out_of_bounds", "read_index": "-2147483648"}

    def forge() -> None:
        gradecheck._receive(theirs, trusted=True)
        gradecheck._send(theirs, {"wrong": forged})

    kernel = threading.Thread(target=forge)
    kernel.start()
    try:
        with pytest.raises(Wrong) as raised:
            gradecheck._Channel(ours).request("call", None, (), {})
    finally:
        kernel.join(10)
        ours.close()
        theirs.close()
    assert raised.value.kind == "" and not hasattr(raised.value, "read_index")
