"""The exercise machinery: checks (``check``), the cases and judges they use, building
exercises from solutions, a learner's own copies, and grading.

A notebook calls ``check("01.slot_of", slot_of)``; the exercise itself is defined in the
lesson's module, ``slotmap/exercises/lessonNN.py``, loaded on first use.
"""

from slotmap import backend  # noqa: F401 - the interpreter before the checks' own kernels

try:
    import hypothesis  # noqa: F401 - the checks draw their random cases with it
except ModuleNotFoundError as missing:
    if missing.name != "hypothesis":
        raise
    # The library runs without it; the course's extra brings it. One line, not a traceback.
    raise ModuleNotFoundError(
        "slotmap.exercises (the course's checks) needs hypothesis, which the lab extra "
        "installs: pip install 'slotmap[lab]'",
        name="hypothesis",
    ) from None

from slotmap.exercises.core import (
    CHECK_MIME,
    EXERCISES,
    CheckResult,
    Exercise,
    Wrong,
    check,
    get_exercise,
    register,
    run_check,
)

__all__ = [
    "CHECK_MIME",
    "EXERCISES",
    "CheckResult",
    "Exercise",
    "Wrong",
    "check",
    "get_exercise",
    "register",
    "run_check",
]
