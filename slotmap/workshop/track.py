"""The workshop's tracks, computed from the notebooks: what fits a 3-hour slot and a day.

Each lesson's time in the room is its reading time (the words of its markdown cells at a
stated reading speed), its run time (measured: the ``*Time:*`` line of its header) and, when
its exercises are done in the room, their estimate (the same header line). A track says, per
lesson, how it is taught: in depth (read, run, exercises), read (exercises as homework), a
demonstration of a stated length by the instructor, or homework; then adds login, breaks and a
buffer for questions. ``workshop/README.md``'s track table is ``table()``'s output
(``python -m slotmap.workshop.track --write`` writes it again), and a test recomputes every
track from the notebooks and fails when one exceeds its slot.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from slotmap.i18n import N_

# English read as a second language, with figures and widgets in between: a fair pace for
# engineers who read Chinese first.
EN_WORDS_PER_MINUTE = 70
# Technical Chinese read as a first language (an assumption, not yet measured): used once
# the Chinese notebooks exist (``--language zh --notebooks DIR``).
ZH_CHARACTERS_PER_MINUTE = 250
LOGIN_MINUTES = 15  # logging in, the first spawn, lesson 00's backend cell on the projector

_WORD = re.compile(r"[A-Za-z0-9]+(?:['’.-][A-Za-z0-9]+)*")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_RUN = re.compile(r"runs top to bottom in about (\d+) s\b")
_EXERCISES = re.compile(r"exercises take about (\d+) minutes")
_NO_EXERCISES = re.compile(r"has no exercises")


@dataclass(frozen=True)
class Lesson:
    """One lesson as the notebooks give it."""

    number: str  # "01"
    title: str
    words: int  # reading units: words (English) or characters plus Latin words (Chinese)
    run_seconds: int  # measured, from the header
    exercise_minutes: int  # estimated, from the header (0: no exercises)
    reading_minutes: float


def reading_units(text: str, language: str) -> int:
    """Words of English; in Chinese, each Han character plus each Latin word (identifiers)."""
    if language == "zh":
        return len(_HAN.findall(text)) + len(_WORD.findall(_HAN.sub(" ", text)))
    return len(_WORD.findall(text))


def reading_speed(language: str) -> int:
    """Reading units a minute for ``language`` ("en" or "zh")."""
    return {"en": EN_WORDS_PER_MINUTE, "zh": ZH_CHARACTERS_PER_MINUTE}[language]


def lesson(notebook: Path, language: str = "en") -> Lesson:
    """A lesson's reading units, run time and exercise estimate, read from its notebook."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    prose = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown"]
    header = prose[0] if prose else ""
    run = _RUN.search(header)
    exercises = _EXERCISES.search(header)
    if run is None or (exercises is None and not _NO_EXERCISES.search(header)):
        raise ValueError(
            f"{notebook.name}: its header must say 'runs top to bottom in about N s' and "
            "'exercises take about N minutes' (or 'has no exercises')"
        )
    words = sum(reading_units(text, language) for text in prose)
    first_line = header.splitlines()[0] if header else notebook.stem
    return Lesson(
        number=notebook.name[:2],
        title=first_line.lstrip("# ").split("·", 1)[-1].strip(),
        words=words,
        run_seconds=int(run.group(1)),
        exercise_minutes=int(exercises.group(1)) if exercises else 0,
        reading_minutes=words / reading_speed(language),
    )


def lessons(notebooks: Path, language: str = "en") -> list[Lesson]:
    """Every lesson of a notebooks folder, in order."""
    return [lesson(path, language) for path in sorted(notebooks.glob("[0-9][0-9]_*.ipynb"))]


@dataclass(frozen=True)
class Track:
    """How each lesson is taught in one slot. ``taught`` maps a lesson to "depth" (read,
    run, exercises), "read" (read and run; exercises are homework) or a number of minutes
    (the instructor shows it); a lesson not in it is homework."""

    name: str
    title: str
    slot_minutes: int
    taught: dict[str, str | int]
    breaks_minutes: int
    questions_minutes: int


TRACKS = (
    Track(
        name="3h",
        title=N_("3 hours"),
        slot_minutes=180,
        taught={"00": 0, "01": "depth", "02": "depth", "03": "depth", "07": 10},
        breaks_minutes=10,
        questions_minutes=15,
    ),
    Track(
        name="day",
        title=N_("a day (9:00 to 17:00)"),
        slot_minutes=480,
        taught={
            "00": 5,
            "01": "depth",
            "02": "depth",
            "03": "depth",
            "04": "depth",
            "05": "depth",
            "06": "read",
            "07": "depth",
            "08": 10,
        },
        breaks_minutes=60 + 2 * 15,  # lunch and two breaks
        questions_minutes=30,
    ),
)


def track(name: str) -> Track:
    """The track called ``name``."""
    for candidate in TRACKS:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no track {name!r}: the tracks are {', '.join(t.name for t in TRACKS)}")


def minutes_in_room(item: Lesson, how: str | int) -> int:
    """Whole minutes (rounded up) that ``item`` takes when taught ``how``."""
    if isinstance(how, int):
        return how
    minutes = item.reading_minutes + item.run_seconds / 60
    if how == "depth":
        minutes += item.exercise_minutes
    return math.ceil(minutes)


def plan(chosen: Track, course: list[Lesson]) -> dict[str, int]:
    """Minutes of each part of ``chosen`` (its lessons by number, then "login", "breaks",
    "questions") and "total"."""
    parts = {
        item.number: minutes_in_room(item, chosen.taught[item.number])
        for item in course
        if item.number in chosen.taught
    }
    missing = set(chosen.taught) - set(parts)
    if missing:
        raise ValueError(f"track {chosen.name}: no notebook for lesson(s) {sorted(missing)}")
    parts.update(
        login=LOGIN_MINUTES, breaks=chosen.breaks_minutes, questions=chosen.questions_minutes
    )
    parts["total"] = sum(parts.values())
    return parts


def exercise_lessons(chosen: Track) -> list[str]:
    """The lessons whose exercises the room does during ``chosen``."""
    return [number for number, how in chosen.taught.items() if how == "depth"]


def _clock(minutes: int) -> str:
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def _cell(item: Lesson, how: str | int | None) -> str:
    if how is None:
        return "homework"
    minutes = minutes_in_room(item, how)
    if isinstance(how, int):
        return f"{minutes} min, the instructor shows it" if minutes else "in the login slot"
    if how == "read" and item.exercise_minutes:
        return f"{minutes} min, exercises homework"
    return f"{minutes} min"


def table(course: list[Lesson], language: str = "en") -> str:
    """The tracks as a markdown table: one row per lesson, then login, breaks, questions and
    the total against each slot."""
    unit = "words" if language == "en" else "characters"
    head = (
        f"| lesson | {unit} | run (measured) | reading at {reading_speed(language)} {unit} a "
        "minute | exercises (estimate) | " + " | ".join(t.title for t in TRACKS) + " |"
    )
    lines = [head, "| --- " * (5 + len(TRACKS)) + "|"]
    for item in course:
        exercises = f"{item.exercise_minutes} min" if item.exercise_minutes else "none"
        cells = [_cell(item, t.taught.get(item.number)) for t in TRACKS]
        lines.append(
            f"| {item.number} {item.title} | {item.words:,} | {item.run_seconds} s | "
            f"{math.ceil(item.reading_minutes)} min | {exercises} | " + " | ".join(cells) + " |"
        )
    plans = [plan(t, course) for t in TRACKS]
    for part, label in (
        ("login", "login"),
        ("breaks", "breaks"),
        ("questions", "questions (a buffer)"),
    ):
        lines.append(f"| {label} | | | | | " + " | ".join(f"{p[part]} min" for p in plans) + " |")
    totals = [
        f"{_clock(p['total'])} of {_clock(t.slot_minutes)}"
        for p, t in zip(plans, TRACKS, strict=True)
    ]
    lines.append("| total | | | | | " + " | ".join(totals) + " |")
    return "\n".join(lines) + "\n"


BEGIN = "<!-- track table: python -m slotmap.workshop.track --write -->\n"
END = "<!-- end of track table -->\n"


def with_table(readme: str, rendered: str) -> str:
    """``readme`` with its track table (between BEGIN and END) replaced by ``rendered``."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + rendered + readme[end:]


def main(argv: list[str] | None = None) -> int:
    """Print the table (``--write``: into workshop/README.md); 1 when a track is over."""
    parser = argparse.ArgumentParser(prog="python -m slotmap.workshop.track")
    parser.add_argument("--language", choices=("en", "zh"), default="en")
    parser.add_argument("--notebooks", type=Path, help="the lessons (default: the checkout's)")
    parser.add_argument("--write", action="store_true", help="into workshop/README.md")
    args = parser.parse_args(argv)
    from slotmap.lab import CHECKOUT

    course = lessons(args.notebooks or CHECKOUT / "notebooks", args.language)
    rendered = table(course, args.language)
    if args.write:
        readme = CHECKOUT / "workshop" / "README.md"
        readme.write_text(with_table(readme.read_text(encoding="utf-8"), rendered), "utf-8")
    else:
        print(rendered, end="")
    over = [t.name for t in TRACKS if plan(t, course)["total"] > t.slot_minutes]
    for name in over:
        print(f"track {name} exceeds its slot", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
