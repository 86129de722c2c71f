"""How an exercise is checked: named cases first, then random ones shrunk to the smallest input
that fails, and a failure reported as the invariant it broke.

An exercise is registered by the module of its lesson (``slotmap/exercises/lessonNN.py``)::

    register(Exercise(
        id="01.slot_of",
        title="the base formula",
        cases=named_cases,        # () -> [(name, case), ...]: fixed cases, run first
        strategy=random_cases,    # () -> hypothesis strategy of cases
        judge=judge,              # (candidate, case) -> None; raises Wrong when it is wrong
        hint="slot = block_table[position // block_size] * block_size + ...",
    ))

and a notebook checks the learner's work with ``check("01.slot_of", slot_of)``. A check
never raises: it prints one line on a pass and a report on a failure, and returns a
``CheckResult`` (true when it passed). A judge that this machine cannot run (a GPU timing on
the CPU, two ranks on one device) raises ``Skipped``: the check reports SKIP with the reason,
which is neither a pass nor a failure. In a notebook it also leaves a machine-readable
output (``CHECK_MIME``) that ``slotmap grade`` reads.
"""

from __future__ import annotations

import html
import importlib
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st

from slotmap.i18n import N_, _, columns, language, ngettext, tr

CHECK_MIME = "application/vnd.slotmap.check+json"


class Wrong(AssertionError):
    """Raised by a judge: which invariant broke, in words, expected vs got, and a hint."""

    def __init__(
        self, invariant: str, expected: Any = "", got: Any = "", hint: str = "", kind: str = ""
    ):
        super().__init__(invariant)
        self.invariant = invariant
        self.expected = expected
        self.got = got
        self.hint = hint
        # What broke, for a judge that refines the report: the words are translated, this is not.
        self.kind = kind


class Skipped(Exception):
    """Raised by a judge that cannot check the exercise on this machine, with the reason: the
    check is skipped, neither passed nor failed (a learner's own code cannot raise it)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class RemoteError(Exception):
    """An exception the candidate raised in another process (``slotmap grade``'s kernel): its
    type's name, message and the line of the learner's code it came from (``where``)."""

    message = ""
    where = ""

    def __str__(self) -> str:
        return self.message


def plural(count: int, noun: str, many: str = "") -> str:
    """``count`` and ``noun``, the noun in the plural unless ``count`` is 1: "1 entry",
    "2 entries", "3 cases"; ``many`` gives an irregular plural.

    The noun is English, marked with ``N_`` where it is written (``plural(n, N_("entry"))``):
    in a language without plurals it is translated (its measure word included: "个条目")
    and follows the count."""
    if language() != "en":
        return f"{count} {tr(noun)}"
    if count == 1:
        return f"{count} {noun}"
    if not many:
        if noun.endswith("y") and noun[-2:-1] not in tuple("aeiou"):
            many = noun[:-1] + "ies"
        elif noun.endswith(("s", "sh", "ch", "x", "z")):
            many = noun + "es"
        else:
            many = noun + "s"
    return f"{count} {many}"


@dataclass(frozen=True)
class Exercise:
    id: str  # "NN.name": NN is the lesson
    title: str
    cases: Callable[[], list[tuple[str, Any]]]
    strategy: Callable[[], st.SearchStrategy] | None  # None: the named cases are all
    judge: Callable[[Any, Any], None]
    hint: str = ""
    max_examples: int = 40


EXERCISES: dict[str, Exercise] = {}


def register(exercise: Exercise) -> Exercise:
    if not exercise.id[:2].isdigit() or exercise.id[2:3] != ".":
        raise ValueError(f"exercise ids look like '01.slot_of', got {exercise.id!r}")
    EXERCISES[exercise.id] = exercise
    return exercise


def get_exercise(exercise_id: str) -> Exercise:
    """The exercise with this id, importing its lesson's module on first use."""
    if exercise_id not in EXERCISES:
        try:
            importlib.import_module(f"slotmap.exercises.lesson{exercise_id[:2]}")
        except ModuleNotFoundError:
            pass
    if exercise_id not in EXERCISES:
        known = ", ".join(sorted(EXERCISES)) or "none loaded"
        raise KeyError(f"no exercise {exercise_id!r} (known: {known})")
    return EXERCISES[exercise_id]


@dataclass
class Failure:
    invariant: str
    case_name: str  # "named case 'two requests'" or "smallest random case"
    case: str  # the input, printed
    expected: str
    got: str
    hint: str


@dataclass
class CheckResult:
    exercise: str
    passed: bool
    named: int = 0  # named cases that passed
    random: int = 0  # random cases tried (all passed when ``passed``)
    failure: Failure | None = None
    skipped: str = ""  # why this machine could not check it (then not passed, not failed)

    def __bool__(self) -> bool:
        return self.passed

    def report(self) -> str:
        """The verdict, in the course's language (``slotmap.i18n``)."""
        if self.skipped:
            return _("{label} {exercise}: {reason}").format(
                label=_("SKIP"), exercise=self.exercise, reason=self.skipped
            )
        if self.passed:
            if not self.random:
                return ngettext(
                    "{label} {exercise}: {named} named case agrees with the reference.",
                    "{label} {exercise}: {named} named cases agree with the reference.",
                    self.named,
                ).format(label=_("PASS"), exercise=self.exercise, named=self.named)
            return _("{label} {exercise}: {named} and {random} agree with the reference.").format(
                label=_("PASS"),
                exercise=self.exercise,
                named=plural(self.named, N_("named case")),
                random=plural(self.random, N_("random one")),
            )
        f = self.failure
        assert f is not None
        lines = [
            _("{label} {exercise} on the {case}").format(
                label=_("FAIL"), exercise=self.exercise, case=f.case_name
            ),
            _("  broken:   {invariant}").format(invariant=f.invariant),
        ]
        lines += [_("  input:    {case}").format(case=f.case)] if f.case else []
        lines += (
            [_("  expected: {expected}").format(expected=f.expected)] if f.expected != "" else []
        )
        lines += [_("  got:      {got}").format(got=f.got)] if f.got != "" else []
        lines += [_("  hint:     {hint}").format(hint=f.hint)] if f.hint else []
        return "\n".join(lines)

    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"exercise": self.exercise, "passed": self.passed}
        if self.skipped:
            record["skipped"] = self.skipped
        return record

    def _ipython_display_(self) -> None:
        # ``check`` has shown the report already; a result left as a cell's value shows nothing.
        pass


def _show(result: CheckResult, record: dict[str, Any] | None = None) -> None:
    """Show the report; ``record`` (default ``result.record()``) is what the grader reads."""
    text = result.report()
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        print(text)
        return
    if get_ipython() is None:
        print(text)
        return
    colour, background = (
        ("#8a6d00", "#fdf8e6")
        if result.skipped
        else ("#1b7f3b", "#eef7f0")
        if result.passed
        else ("#b3261e", "#fdeeee")
    )
    # One block per line with a hanging indent: a long line wraps under its own text
    # ("  hint:     ..." continues at the hint's column), not at the report's left edge.
    lines = []
    for line in text.splitlines():
        label = re.match(r"\s*(?:[a-z]+:|[\u4e00-\u9fff]+\uff1a)\s+", line)
        indent = columns(label.group()) if label else 4
        lines.append(
            f'<span style="display: block; padding-left: {indent}ch; '
            f'text-indent: -{indent}ch">{html.escape(line)}</span>'
        )
    markup = (
        f'<pre style="border-left: 4px solid {colour}; background: {background}; '
        f"padding: 6px 10px; white-space: pre-wrap; word-break: normal; "
        f'overflow-wrap: break-word">{"".join(lines)}</pre>'
    )
    display(
        {"text/plain": text, "text/html": markup, CHECK_MIME: record or result.record()},
        raw=True,
    )


def _is_library_frame(filename: str) -> bool:
    path = filename.replace("\\", "/")
    return "/site-packages/" in path or "/lib/python" in path or path.startswith(_PACKAGE_DIR)


_PACKAGE_DIR = str(Path(__file__).resolve().parents[1]).replace("\\", "/")


def _is_stub(error: BaseException | None) -> bool:
    """An unfinished exercise: NotImplementedError, also wrapped by Triton's interpreter (which
    raises its own error from the one raised inside a kernel) or quoted by Triton's compiler
    (whose error shows the kernel's source up to the stub's ``raise``, which it cannot
    compile)."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, NotImplementedError) or "raise NotImplementedError" in str(error):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _crash(error: BaseException, hint: str) -> tuple[str, str, str, str]:
    """A candidate that raised: the exception and the line of the learner's code it came from."""
    if _is_stub(error):
        # No exercise hint yet: it would give the answer away before the first attempt.
        return (
            _("not done yet: the exercise's code still raises NotImplementedError"),
            "",
            "",
            _(
                "replace `# YOUR CODE HERE` and the `raise NotImplementedError()` under it with "
                "your code, run that cell, then this one"
            ),
        )
    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if not _is_library_frame(frame.filename):
            where = _(" in {function}, line {line}: {code}").format(
                function=frame.name, line=frame.lineno, code=(frame.line or "").strip()
            )
            break
    if isinstance(error, RemoteError):  # raised in the learner's kernel: its line is there
        where = error.where
    raised = _("your code raised {error}: {message}{where}").format(
        error=type(error).__name__, message=error, where=where
    )
    return raised, "", "", hint


def _skip_reason(error: BaseException) -> str:
    """The reason of a ``Skipped`` raised by slotmap's own code (a judge), else "": one that a
    learner's code raised is a crash like any other."""
    if not isinstance(error, Skipped):
        return ""
    frames = traceback.extract_tb(error.__traceback__)
    raised_here = frames and frames[-1].filename.replace("\\", "/").startswith(_PACKAGE_DIR)
    return error.reason if raised_here else ""


def _failure(error: BaseException, exercise: Exercise, case_name: str, case: Any) -> Failure:
    if isinstance(error, Wrong):
        # A message defined at import time (N_) is translated here; a translated one is kept.
        hint = tr(error.hint) or tr(exercise.hint)
        parts = (tr(error.invariant), str(error.expected), str(error.got), hint)
    else:
        parts = _crash(error, tr(exercise.hint))
    invariant, expected, got, hint = parts
    return Failure(invariant, case_name, str(case), expected, got, hint)


def run_check(
    exercise: Exercise, candidate: Any, *, max_examples: int | None = None
) -> CheckResult:
    """Grade ``candidate`` without printing anything."""
    result = CheckResult(exercise.id, passed=False)
    for name, case in exercise.cases():
        try:
            exercise.judge(candidate, case)
        except Exception as error:  # a learner's code can raise anything
            result.skipped = _skip_reason(error)
            if not result.skipped:
                case_name = _("named case '{name}'").format(name=tr(name))
                result.failure = _failure(error, exercise, case_name, case)
            return result
        result.named += 1

    if exercise.strategy is None:
        result.passed = True
        return result
    last: dict[str, Any] = {}

    @settings(
        max_examples=max_examples or exercise.max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )
    @given(exercise.strategy())
    def random_case(case: Any) -> None:
        last["case"] = case
        result.random += 1
        exercise.judge(candidate, case)

    try:
        random_case()
    except Exception as error:
        result.skipped = _skip_reason(error)
        if not result.skipped:
            # Hypothesis re-raises the error of the smallest failing case, and runs it last.
            smallest = _("smallest random case")
            result.failure = _failure(error, exercise, smallest, last.get("case"))
        return result
    result.passed = True
    return result


def check(exercise_id: str, candidate: Any, *, max_examples: int | None = None) -> CheckResult:
    """Check a learner's ``candidate`` for exercise ``exercise_id`` and show the verdict."""
    result = run_check(get_exercise(exercise_id), candidate, max_examples=max_examples)
    _show(result)
    # The check ran: the learner's own progress record (kept only inside their my_work/).
    from slotmap.exercises.progress import record

    record(result)
    return result
