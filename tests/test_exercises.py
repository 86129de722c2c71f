"""The exercise machinery: checks report the broken invariant on the smallest input, exercises
are generated from solutions and never drift, a learner's copy is never overwritten, and the
grader's table says who passed what."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from lesson_helpers import TRITON_IMPORTS, code_cells, import_source

import slotmap
from slotmap.exercises import Exercise, Wrong, get_exercise, register, run_check
from slotmap.exercises.build import (
    BEGIN,
    END,
    MD_BEGIN,
    MD_END,
    SolutionRegionError,
    build_exercises,
    copy_to_workspace,
    cut_code,
    cut_markdown,
    stale_exercises,
)
from slotmap.exercises.cases import (
    GUARD,
    POISON,
    SlotCase,
    explain_slot_mapping,
    judge_slot_mapping,
    slot_cases,
)
from slotmap.exercises.core import CheckResult, plural

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------
TWO_REQUESTS = SlotCase([0, 3, 5], [0, 1, 2, 2, 3], [[7, 2], [3, 9]], 2, max_num_tokens=7)

DEMO = register(
    Exercise(
        id="99.launcher",
        title="a launcher, judged like the lessons judge theirs",
        cases=lambda: [("two requests", TWO_REQUESTS)],
        strategy=lambda: slot_cases(max_requests=2, max_length=12),
        judge=judge_slot_mapping,
        hint="the demo hint",
        max_examples=25,
    )
)


def oracle_launcher(query_start_loc, positions, block_table, block_size, *, out, **options):
    return slotmap.slot_mapping_oracle(
        query_start_loc, positions, block_table, block_size, out=out, **options
    )


def test_the_reference_itself_passes():
    result = run_check(DEMO, oracle_launcher)
    assert result.passed, result.report()
    assert result.report().startswith("PASS 99.launcher: 1 named case and 25 random ones agree")
    assert "\n" not in result.report()


def test_the_production_kernel_passes():
    result = run_check(DEMO, slotmap.compute_slot_mapping)
    assert result.passed, result.report()


def test_a_wrong_named_case_is_reported_with_its_name_and_hint():
    def colliding(query_start_loc, positions, block_table, block_size, *, out, **options):
        oracle_launcher(query_start_loc, positions, block_table, block_size, out=out, **options)
        out[4] = out[3]
        return out

    result = run_check(DEMO, colliding)
    assert not result.passed
    failure = result.failure
    assert failure.case_name == "named case 'two requests'"
    assert failure.invariant == (
        "tokens 3 and 4 collide in slot 18: position 3 landed at block offset 0 inside its "
        "block, expected block offset 1 = 3 % 2"
    )
    assert failure.expected == "[14, 15, 4, 18, 19, -1, -1]"
    assert failure.got == "[14, 15, 4, 18, 18, -1, -1]"
    assert "remainder of position divided by block_size" in failure.hint
    report = result.report()
    assert report.startswith("FAIL 99.launcher on the named case 'two requests'")
    assert "broken:   tokens 3 and 4 collide in slot 18" in report


def test_random_failures_are_shrunk_to_the_smallest_input():
    # Wrong only from position 10 on: the smallest failing batch is one token at position 10
    # in blocks of one token.
    def wrong_from_ten(query_start_loc, positions, block_table, block_size, *, out, **options):
        oracle_launcher(query_start_loc, positions, block_table, block_size, out=out, **options)
        late = positions[: out.numel()] >= 10
        out[: late.numel()][late[: out.numel()]] += 1
        return out

    result = run_check(DEMO, wrong_from_ten)
    failure = result.failure
    assert failure.case_name == "smallest random case"
    assert failure.case.startswith("query_start_loc=[0, 1], positions=[10], ")
    assert "block_size=1" in failure.case
    assert "should be in slot" in failure.invariant


def test_unfinished_and_crashing_code_is_reported_not_raised():
    def unfinished(*args, **kwargs):
        raise NotImplementedError()

    result = run_check(DEMO, unfinished)
    assert not result.passed and "not done yet" in result.failure.invariant

    def typo(query_start_loc, *args, **kwargs):
        return query_start_loc.no_such_thing

    failure = run_check(DEMO, typo).failure
    assert failure.invariant.startswith("your code raised AttributeError")
    assert "in typo, line" in failure.invariant and "no_such_thing" in failure.invariant


@pytest.mark.parametrize(
    ("notebook", "kernel", "exercise_id"),
    [
        ("02_first_kernel.ipynb", "first_kernel", "02.first_kernel"),
        ("03_window_gather.ipynb", "window_kernel", "03.window_kernel"),
        ("04_circular.ipynb", "circular_kernel", "04.circular_kernel"),
    ],
)
def test_an_untouched_kernel_stub_is_reported_not_done(tmp_path, notebook, kernel, exercise_id):
    # Triton wraps the NotImplementedError raised inside a kernel in an error of its own.
    (source,) = [c for c in code_cells(ROOT / "exercises" / notebook) if f"def {kernel}(" in c]
    stub = getattr(import_source(tmp_path / f"{kernel}.py", TRITON_IMPORTS + source), kernel)
    result = run_check(get_exercise(exercise_id), stub)
    assert not result.passed and "not done yet" in result.failure.invariant, result.report()


def test_a_new_tensor_instead_of_out_is_refused():
    def fresh(query_start_loc, positions, block_table, block_size, *, out, **options):
        return slotmap.slot_mapping_oracle(
            query_start_loc, positions, block_table, block_size, **options
        )

    assert "returned a new tensor" in run_check(DEMO, fresh).failure.invariant


def test_check_prints_one_line_on_a_pass(capsys):
    assert slotmap.exercises.check("99.launcher", oracle_launcher, max_examples=3)
    assert capsys.readouterr().out.strip().count("\n") == 0


def test_unknown_exercise_names_the_known_ones():
    with pytest.raises(KeyError, match="99.launcher"):
        slotmap.exercises.get_exercise("98.nothing")


# ---------------------------------------------------------------------------------------------
# explain_slot_mapping: every invariant, in words
# ---------------------------------------------------------------------------------------------
CASE = SlotCase([0, 2, 3], [0, 1, 5], [[4, 0, 0], [1, 6, 5]], 4, max_num_tokens=5)
EXPECTED = [16, 17, 25, -1, -1]


def guarded(values, before=None, after=None):
    head = [POISON] * GUARD
    tail = [POISON] * GUARD
    if before is not None:
        head[-1] = before
    if after is not None:
        tail[0] = after
    return head + list(values) + tail


BROKEN = {
    "correct": (guarded(EXPECTED), None),
    "before": (guarded(EXPECTED, before=3), "a lane wrote slot 3 before the output"),
    "past-end": (
        guarded(EXPECTED, after=16),
        "a lane past the request's end wrote slot 16 at out[5], past the end of the output",
    ),
    "token-unwritten": (
        guarded([16, POISON, 25, -1, -1]),
        "slot_mapping[1] was never written: token 1 (request 0)",
    ),
    "padding-unwritten": (
        guarded([16, 17, 25, -1, POISON]),
        "slot_mapping[4] was never written: padding entry 4",
    ),
    "padding-wrong": (
        guarded([16, 17, 25, 0, -1]),
        "padding entry 3 holds 0 instead of PAD_ID -1",
    ),
    "collision": (guarded([16, 16, 25, -1, -1]), "tokens 0 and 1 collide in slot 16"),
    "wrong-slot": (
        guarded([16, 17, 26, -1, -1]),
        "token 2 (request 1, position 5) should be in slot 25, got 26: position 5 landed at "
        "block offset 2 inside its block, expected block offset 1 = 5 % 4",
    ),
    "off-by-one-block-index": (
        guarded([16, 17, 21, -1, -1]),
        "token 2 (request 1, position 5) should be in slot 25, got 21: position 5 landed in "
        "physical block 5 = block_table[1][2]: the logical block index is off by one",
    ),
    "unmasked-padding-store": (
        guarded(EXPECTED, after=-1),
        "the padding program wrote PAD_ID -1 at out[5], past the end of the output (5 entries)",
    ),
}


@pytest.mark.parametrize(("buffer", "invariant"), BROKEN.values(), ids=BROKEN.keys())
def test_each_broken_invariant_is_named(buffer, invariant):
    wrong = explain_slot_mapping(CASE, EXPECTED, buffer)
    if invariant is None:
        assert wrong is None
    else:
        assert isinstance(wrong, Wrong) and wrong.invariant.startswith(invariant), wrong


def test_a_one_entry_output_is_one_entry():
    case = SlotCase([0, 1], [0], [[4]], 4)
    wrong = explain_slot_mapping(case, [16], guarded([16], after=16))
    assert wrong.invariant.endswith("past the end of the output (1 entry)")


@pytest.mark.parametrize(
    ("count", "noun", "words"),
    [
        (1, "entry", "1 entry"),
        (2, "entry", "2 entries"),
        (0, "named case", "0 named cases"),
        (1, "named case", "1 named case"),
        (3, "key", "3 keys"),
        (2, "pass", "2 passes"),
    ],
)
def test_plural(count, noun, words):
    assert plural(count, noun) == words


@pytest.mark.parametrize(
    ("named", "random", "words"),
    [
        (1, 0, "1 named case agrees with"),
        (2, 0, "2 named cases agree with"),
        (1, 1, "1 named case and 1 random one agree with"),
        (0, 25, "0 named cases and 25 random ones agree with"),
    ],
)
def test_a_pass_report_is_grammatical(named, random, words):
    result = CheckResult("99.x", passed=True, named=named, random=random)
    assert result.report() == f"PASS 99.x: {words} the reference."


# ---------------------------------------------------------------------------------------------
# Building exercises from solutions
# ---------------------------------------------------------------------------------------------
def test_code_regions_become_indented_stubs():
    source = f"def f(x):\n    {BEGIN}\n    y = x + 1\n    return y\n    {END}\n\ncheck('01.f', f)"
    assert cut_code(source, "here") == (
        "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n\ncheck('01.f', f)"
    )


@pytest.mark.parametrize(
    "source",
    [f"{BEGIN}\nx = 1", f"x = 1\n{END}", f"{BEGIN}\n{BEGIN}\n{END}\n{END}"],
    ids=["unclosed", "unopened", "nested"],
)
def test_broken_code_regions_are_refused(source):
    with pytest.raises(SolutionRegionError):
        cut_code(source, "here")


def test_markdown_regions_become_placeholders():
    source = f"Why?\n{MD_BEGIN}Because.{MD_END}\nMore."
    assert cut_markdown(source, "here") == "Why?\n*Your answer here.*\nMore."
    with pytest.raises(SolutionRegionError):
        cut_markdown(f"{MD_BEGIN} never closed", "here")


def notebook(*cells: tuple[str, str]) -> dict:
    return {
        "cells": [
            {
                "cell_type": kind,
                "id": f"c{i}",
                "metadata": {},
                "source": text,
                **(
                    {
                        "outputs": [{"output_type": "stream", "name": "stdout", "text": "old"}],
                        "execution_count": 3,
                    }
                    if kind == "code"
                    else {}
                ),
            }
            for i, (kind, text) in enumerate(cells)
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def write(path: Path, nb: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))
    return path


def test_build_strips_outputs_cuts_answers_and_detects_drift(tmp_path):
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    source = write(
        solutions / "01_demo.ipynb",
        notebook(
            ("markdown", "# Demo"), ("code", f"def f():\n    {BEGIN}\n    return 1\n    {END}")
        ),
    )
    assert stale_exercises(solutions, exercises) == ["exercises/01_demo.ipynb is missing"]
    assert build_exercises(solutions, exercises) == [exercises / "01_demo.ipynb"]
    assert stale_exercises(solutions, exercises) == []
    assert build_exercises(solutions, exercises) == []  # idempotent
    built = json.loads((exercises / "01_demo.ipynb").read_text())
    assert "Exercise notebook" in "".join(built["cells"][0]["source"])
    code = built["cells"][2]
    assert code["outputs"] == [] and code["execution_count"] is None
    assert "raise NotImplementedError()" in "".join(code["source"])
    assert "return 1" not in json.dumps(built)
    # The solution changes: the exercise is now stale; an orphan is reported too.
    write(source, notebook(("code", f"def f():\n    {BEGIN}\n    return 2\n    {END}")))
    write(exercises / "02_orphan.ipynb", notebook())
    assert stale_exercises(solutions, exercises) == [
        "exercises/01_demo.ipynb differs from what solutions/01_demo.ipynb generates",
        "exercises/02_orphan.ipynb has no solutions/02_orphan.ipynb",
    ]


def test_a_solution_without_answer_regions_is_refused(tmp_path):
    write(tmp_path / "solutions" / "01_demo.ipynb", notebook(("code", "x = 1")))
    with pytest.raises(SolutionRegionError, match="no ### BEGIN SOLUTION"):
        build_exercises(tmp_path / "solutions", tmp_path / "exercises")


def test_the_shipped_exercises_are_up_to_date_with_the_solutions():
    assert stale_exercises() == [], "run: slotmap exercises build"


def test_a_learners_copy_is_never_overwritten(tmp_path):
    exercises, mine = tmp_path / "exercises", tmp_path / "my_work"
    write(exercises / "01_demo.ipynb", notebook(("code", "stub")))
    assert copy_to_workspace(exercises, mine) == [f"new  {mine / '01_demo.ipynb'}"]
    (mine / "01_demo.ipynb").write_text("my answer")
    # An update of the exercise after the learner's edit keeps the learner's work.
    later = time.time() + 10
    write(exercises / "01_demo.ipynb", notebook(("code", "a better stub")))
    os.utime(exercises / "01_demo.ipynb", (later, later))
    messages = copy_to_workspace(exercises, mine)
    assert (mine / "01_demo.ipynb").read_text() == "my answer"
    assert messages and messages[0].startswith("kept")
    write(exercises / "02_next.ipynb", notebook(("code", "stub")))
    assert copy_to_workspace(exercises, mine)[-1] == f"new  {mine / '02_next.ipynb'}"


def test_the_learners_copy_says_it_is_theirs(tmp_path):
    solutions, exercises, mine = (tmp_path / d for d in ("solutions", "exercises", "my_work"))
    write(solutions / "01_demo.ipynb", notebook(("code", f"{BEGIN}\nx = 1\n{END}")))
    build_exercises(solutions, exercises)
    copy_to_workspace(exercises, mine)
    shipped = json.loads((exercises / "01_demo.ipynb").read_text())["cells"][0]["source"]
    copied = json.loads((mine / "01_demo.ipynb").read_text())["cells"]
    assert "do not edit it here" in "".join(shipped)
    assert "".join(copied[0]["source"]).startswith("> **Your copy** of `exercises/01_demo.ipynb`")
    assert "raise NotImplementedError()" in "".join(copied[1]["source"])


# ---------------------------------------------------------------------------------------------
# Grading a folder
# ---------------------------------------------------------------------------------------------
SLOT_OF = "def slot_of(p, row, size):\n    return row[p // size] * size + p % size"
TIMES_TWO = "def slot_of(p, row, size):\n    return 2 * p"
IMPORT = (
    "from slotmap.exercises import check\nf = None  # not a slot mapping: fails 01.slot_mapping"
)


def test_grade_prints_a_notebook_by_exercise_table(tmp_path, capsys):
    pytest.importorskip("nbclient")
    from slotmap.cli import main

    # The grader checks with the course's own exercises (a pristine copy): exercise 01's.
    folder = tmp_path / "submissions"
    check_slot_of, check_batch = "check('01.slot_of', slot_of)", "check('01.slot_mapping', f)"
    write(
        folder / "alice_demo.ipynb",
        notebook(
            ("code", IMPORT),
            ("code", SLOT_OF),
            ("code", check_slot_of),
            ("code", check_batch),
        ),
    )
    write(
        folder / "bob_demo.ipynb",
        notebook(
            ("code", IMPORT),
            ("code", TIMES_TWO),
            ("code", "raise RuntimeError('bob broke a cell')"),
            ("code", check_slot_of),
            ("code", check_batch),
        ),
    )
    # Carol hands in her copy of demo.ipynb in a folder of her own, without the batch check.
    write(
        folder / "carol" / "demo.ipynb",
        notebook(("code", IMPORT), ("code", SLOT_OF), ("code", check_slot_of)),
    )
    # demo.ipynb's solution checks both exercises: the one Carol deleted shows as missing.
    solutions = tmp_path / "solutions"
    write(solutions / "demo.ipynb", notebook(("code", check_slot_of), ("code", check_batch)))
    report = tmp_path / "grades.json"
    arguments = ["--timeout", "120", "--json", str(report), "--solutions", str(solutions)]
    assert main(["grade", str(folder), *arguments]) == 0
    grades = {g["notebook"]: g["results"] for g in json.loads(report.read_text())}
    assert grades == {
        "alice_demo.ipynb": {"01.slot_of": "PASS", "01.slot_mapping": "FAIL"},
        "bob_demo.ipynb": {"01.slot_of": "FAIL", "01.slot_mapping": "FAIL"},
        "carol/demo.ipynb": {"01.slot_of": "PASS", "01.slot_mapping": "missing"},
    }
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["notebook", "01.slot_mapping", "01.slot_of", "passed"]
    assert table.splitlines()[3].split() == ["bob_demo.ipynb", "FAIL", "FAIL", "0/2"]


# ---------------------------------------------------------------------------------------------
# Skipped checks: this machine cannot check it; neither a pass nor a failure
# ---------------------------------------------------------------------------------------------
def test_the_rank_function_check_skips_on_a_machine_short_of_ranks(monkeypatch):
    from slotmap import cp

    # One GPU: run_ranks puts one rank on each device and would refuse two ranks.
    monkeypatch.setattr(cp, "max_ranks", lambda: 1)

    def rank_fn(ctx, batch):
        raise AssertionError("no rank may start")

    result = run_check(get_exercise("05.rank_fn"), rank_fn)
    assert not result and not result.passed and result.failure is None, result.report()
    assert result.skipped == (
        f"the check runs 2 ranks, one per {slotmap.BACKEND.name} device, and this machine has "
        "1 device; it runs on a machine with 2 or more, or on the CPU (SLOTMAP_BACKEND=cpu, "
        "where the ranks talk over gloo)"
    )
    assert result.report() == f"SKIP 05.rank_fn: {result.skipped}"
    assert result.record() == {
        "exercise": "05.rank_fn",
        "passed": False,
        "skipped": result.skipped,
    }


def test_a_skip_raised_by_the_learners_code_is_a_crash_not_a_skip():
    from slotmap.exercises.core import Skipped

    def sneaky(*args, **kwargs):
        raise Skipped("no GPU here, honest")

    result = run_check(DEMO, sneaky)
    assert not result.skipped and result.failure is not None, result.report()
    assert result.failure.invariant.startswith("your code raised Skipped: no GPU here, honest")


def test_a_skip_counts_in_a_grade_only_from_the_judge():
    from slotmap.exercises.grade import verify

    checks = {3: ["09.fused_groups_time"]}
    skip = {"exercise": "09.fused_groups_time", "passed": False, "cell": 3, "skipped": "no GPU"}
    verdict = verify([{"cell": 3, "judged": [skip]}], checks)
    assert verdict == ({"09.fused_groups_time": "SKIP: no GPU"}, 0)
    # The same record shown by the notebook's kernel is not the judge's: not accepted.
    assert verify([{"cell": 3, "records": [skip], "judged": []}], checks) == ({}, 1)


def test_a_skip_raised_in_the_learners_kernel_is_a_crash_not_a_skip():
    from slotmap.exercises.gradecheck import _remote_error

    # What the judge makes of a Skipped that the kernel reports, even as slotmap's own class.
    def remote(*args, **kwargs):
        raise _remote_error(
            {"type": "Skipped", "module": "slotmap.exercises.core", "message": "no GPU"}
        )

    result = run_check(DEMO, remote)
    assert not result.skipped and result.failure is not None, result.report()
    assert result.failure.invariant.startswith("your code raised Skipped: no GPU")


@pytest.mark.skipif(slotmap.BACKEND.name == "cuda", reason="a GPU times the kernel")
def test_grade_shows_a_skipped_check_apart_with_why_and_not_as_passed(tmp_path, capsys):
    pytest.importorskip("nbclient")
    from slotmap.cli import main
    from slotmap.exercises.lesson09 import NEEDS_GPU

    # The capstone's solution kernel; off a GPU its timing check runs it once, then skips.
    cells = code_cells(ROOT / "solutions" / "09_capstone.ipynb")
    kernel = next(cell for cell in cells if "def fused_slot_mappings_kernel(" in cell)
    check_time = 'check("09.fused_groups_time", fused_slot_mappings_kernel)'
    folder, solutions = tmp_path / "submissions", tmp_path / "solutions"
    write(
        folder / "dave_time.ipynb",
        notebook(("code", cells[0]), ("code", kernel), ("code", check_time)),
    )
    write(solutions / "time.ipynb", notebook(("code", check_time)))
    report = tmp_path / "grades.json"
    arguments = ["--timeout", "120", "--json", str(report), "--solutions", str(solutions)]
    assert main(["grade", str(folder), *arguments]) == 0
    why = NEEDS_GPU.format(slotmap.BACKEND.name)
    grades = {g["notebook"]: g["results"] for g in json.loads(report.read_text())}
    assert grades == {"dave_time.ipynb": {"09.fused_groups_time": f"SKIP: {why}"}}
    table = capsys.readouterr().out.splitlines()
    assert table[2].split() == ["dave_time.ipynb", "SKIP", "0/1,", "1", "skipped"]
    assert table[3] == f"dave_time.ipynb: 09.fused_groups_time skipped, not passed: {why}"


def test_an_untouched_stub_gets_no_hint_that_gives_the_answer_away():
    def unfinished(*args, **kwargs):
        raise NotImplementedError()

    failure = run_check(DEMO, unfinished).failure
    assert "the demo hint" not in failure.hint and "YOUR CODE HERE" in failure.hint
