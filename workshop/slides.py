"""Generate workshop/slides/NN_topic.ipynb: one short deck per lesson, from the lesson's own
figures and the instructor's notes, for jupyterlab-rise (the workshop extra installs it; in
JupyterLab open a deck and press the slideshow button, or open ``/rise/<path to the deck>``;
``t`` opens the speaker view with the notes).

Each lesson is run top to bottom (nbclient, a fresh kernel, in notebooks/); every static figure
it draws becomes a slide under the heading of the section that drew it. A deck is: the
lesson's title and opening (with its first table, if its opening has one), the learning
objectives with speaker notes (what to say, what to ask) and any extra slides, both from
workshop/slides/instructor.md, the figures, and its exercises with a speaker note of where
learners get stuck (workshop/stuck.md: the checks' own messages and the hints to give). The
figures are embedded, scaled to fit a 1280 x 720 projector under their heading: a deck needs
no kernel.

    SLOTMAP_BACKEND=cpu .venv/bin/python workshop/slides.py          # a few minutes on 2 cores
    .venv/bin/python workshop/slides.py --from-decks                  # the notes only: reuses
                                                                      # the decks' figures
    .venv/bin/python workshop/slides.py --check                       # exit 1 if a deck is stale

``--lang zh`` builds the Chinese decks into workshop/slides/zh_CN/ from the built Chinese lessons
(notebooks/zh_CN/, run under ``SLOTMAP_LANG=zh`` so that their figures speak Chinese), the
Chinese instructor's notes (slides/instructor.zh-CN.md, built by ``slotmap translate build``)
and stuck.zh-CN.md (else stuck.md). With ``--from-decks`` and no Chinese decks yet, it takes
the English decks' figures, each under its section's Chinese heading (the lessons' cells share
ids across languages).
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "workshop" / "slides"
NOTES = OUT / "instructor.md"
STUCK = ROOT / "workshop" / "stuck.md"
# A figure's largest size, in pixels: under its heading on a 1280 x 720 slide (RISE scales a
# 960 x 700 slide to the screen).
WIDTH, HEIGHT = 900, 470
MAX_FIGURES = 4  # a short deck: the lesson's first figures
LANGUAGES = ("en", "zh")
# The words a deck adds around its lesson and notes, per language.
WORDS = {
    "en": {
        "objectives": "## What you will be able to do",
        "say": "**Say:** ",
        "ask": "**Ask:** ",
        "turn": "## Your turn: `my_work/{name}`",
        "stuck": "**Where learners get stuck** ({table}):",
        "row": '- `{id}`, {symptom}: the check says "{message}". Hint: {hint}',
    },
    "zh": {
        "objectives": "## 学完本课，你将能够",
        "say": "**讲：** ",
        "ask": "**问：** ",
        "turn": "## 轮到你了：`my_work/zh_CN/{name}`",
        "stuck": "**学员常卡在哪里**（{table}）：",
        "row": "- `{id}`，{symptom}：检查会说“{message}”。提示：{hint}",
    },
}


def paths(lang: str = "en") -> dict[str, Path]:
    """Where a language's decks come from and go: lessons, exercises, notes, stuck table, out."""
    if lang == "en":
        return {
            "lessons": ROOT / "notebooks",
            "exercises": ROOT / "exercises",
            "notes": NOTES,
            "stuck": STUCK,
            "out": OUT,
        }
    stuck = ROOT / "workshop" / "stuck.zh-CN.md"
    return {
        "lessons": ROOT / "notebooks" / "zh_CN",
        "exercises": ROOT / "exercises" / "zh_CN",
        "notes": OUT / "instructor.zh-CN.md",
        "stuck": stuck if stuck.exists() else STUCK,
        "out": OUT / "zh_CN",
    }


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def run_lesson(path: Path) -> dict:
    """The lesson notebook executed (outputs filled in), as nbformat's JSON."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    # A cell takes under a minute; nbclient can miss a finished cell until its timeout.
    client = NotebookClient(notebook, timeout=90, kernel_name="python3")
    client.execute(cwd=str(path.parent))
    return json.loads(nbformat.writes(notebook))


def _scaled(png_base64: str) -> str:
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(png_base64)))
    scale = min(1.0, WIDTH / image.width, HEIGHT / image.height)
    if scale < 1.0:
        size = (round(image.width * scale), round(image.height * scale))
        image = image.convert("RGB").resize(size, Image.LANCZOS)
    buffer = io.BytesIO()
    # A figure's few colours fit a palette: a quarter of the bytes of RGB.
    image.convert("RGB").quantize(colors=128).save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode()


def figures(notebook: dict) -> list[tuple[str, str]]:
    """(section heading, PNG as base64) for each static figure, in order."""
    heading, found = "", []
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            for line in _source(cell).splitlines():
                if line.startswith("## "):
                    heading = line[3:].strip()
        elif cell["cell_type"] == "code":
            for output in cell.get("outputs", []):
                png = output.get("data", {}).get("image/png")
                if png:
                    found.append((heading, png if isinstance(png, str) else "".join(png)))
    return found


def _slide(source: str, attachments: dict | None = None, kind: str = "slide") -> dict:
    cell = {
        "cell_type": "markdown",
        "id": "",
        "metadata": {"slideshow": {"slide_type": kind}},
        "source": source,
    }
    if attachments:
        cell["attachments"] = attachments
    return cell


def instructor_notes(text: str) -> dict[str, dict[str, str]]:
    """instructor.md by lesson: {"01": {"objectives": ..., "say": ..., "ask": ...,
    "slide: TITLE": ...}}."""
    notes: dict[str, dict[str, str]] = {}
    lesson, part = None, None
    for line in text.splitlines():
        if re.fullmatch(r"## \d\d", line):
            lesson, part = line[3:], None
            notes[lesson] = {}
        elif lesson and line.startswith("### "):
            part = line[4:].strip()
            notes[lesson][part] = ""
        elif lesson and part:
            notes[lesson][part] += line + "\n"
    return {k: {p: t.strip() for p, t in parts.items()} for k, parts in notes.items()}


def stuck_notes(text: str, exercises: list[str], lang: str = "en") -> str:
    """Where learners get stuck on ``exercises``: stuck.md's rows for them, as notes."""
    lines = []
    for row in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        if len(cells) == 4 and cells[0] in exercises:
            lines.append(
                WORDS[lang]["row"].format(
                    id=cells[0], symptom=cells[1], message=cells[2], hint=cells[3]
                )
            )
    return "\n".join(lines)


def deck(
    lesson: Path,
    found: list[tuple[str, str]],
    notes: dict[str, str],
    stuck: str,
    lang: str = "en",
) -> dict:
    """The deck of one lesson: title, objectives, extra slides, figures (``found``: section
    heading and PNG as base64), exercises; the notes of instructor.md and stuck.md."""
    words, where_from = WORDS[lang], paths(lang)
    first = _source(json.loads(lesson.read_text(encoding="utf-8"))["cells"][0])
    title = next((ln[2:] for ln in first.splitlines() if ln.startswith("# ")), lesson.stem)
    paragraphs = [p for p in first.split("\n\n") if p.strip() and not p.startswith("#")]
    opening = paragraphs[:1]
    if len(paragraphs) > 1 and paragraphs[1].startswith("|"):
        opening.append(paragraphs[1])  # the opening's table (lesson 00: the backends)
    cells = [_slide(f"# {title}\n\n" + "\n\n".join(opening))]
    if notes.get("objectives"):
        cells.append(_slide(f"{words['objectives']}\n\n{notes['objectives']}"))
    spoken = [
        f"{words['say']}{notes['say']}" if notes.get("say") else "",
        f"{words['ask']}{notes['ask']}" if notes.get("ask") else "",
    ]
    if any(spoken):
        cells.append(_slide("\n\n".join(t for t in spoken if t), kind="notes"))
    for part, text in notes.items():
        if part.startswith("slide: "):
            cells.append(_slide(f"## {part[len('slide: ') :]}\n\n{text}"))
    for index, (heading, png) in enumerate(found[:MAX_FIGURES]):
        name = f"figure{index}.png"
        attachment = {name: {"image/png": _scaled(png)}}
        cells.append(_slide(f"## {heading or title}\n\n![](attachment:{name})", attachment))
    exercise = where_from["exercises"] / lesson.name
    if exercise.exists():
        ids = list(
            dict.fromkeys(
                re.findall(r"check\(\\?[\"'](\d\d\.\w+)", exercise.read_text(encoding="utf-8"))
            )
        )
        listing = "\n".join(f"- `{i}`" for i in ids)
        cells.append(_slide(f"{words['turn'].format(name=lesson.name)}\n\n{listing}"))
        where = stuck_notes(stuck, ids, lang)
        if where:
            heading = words["stuck"].format(table=where_from["stuck"].name)
            cells.append(_slide(f"{heading}\n\n{where}", kind="notes"))
    # Decks carry a fixed id per cell: a rebuild changes nothing that did not change.
    for number, cell in enumerate(cells):
        cell["id"] = f"{lesson.stem[:2]}-slide-{number}"
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "rise": {"scroll": True, "transition": "none"},
            "slotmap": {"generated_from": str(lesson.relative_to(ROOT))},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def deck_figures(path: Path) -> list[tuple[str, str]]:
    """The figures of a deck already built: (slide heading, PNG as base64)."""
    found = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for attachment in cell.get("attachments", {}).values():
            heading = _source(cell).splitlines()[0].removeprefix("## ")
            found.append((heading, attachment["image/png"]))
    return found


def section_headings(english: Path, translated: Path) -> dict[str, str]:
    """Each ``## `` heading of the English lesson -> the same cell's heading in translation."""

    def headings(path: Path) -> dict[str, list[str]]:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return {
            cell["id"]: [
                ln[3:].strip() for ln in _source(cell).splitlines() if ln.startswith("## ")
            ]
            for cell in cells
            if cell["cell_type"] == "markdown"
        }

    theirs = headings(translated)
    return {
        mine: other
        for cell_id, found in headings(english).items()
        for mine, other in zip(found, theirs.get(cell_id, []), strict=False)
    }


def built_figures(lesson: Path, target: Path, lang: str) -> list[tuple[str, str]]:
    """The figures of the deck already built; a translated deck not yet built takes the English
    deck's, under its sections' translated headings."""
    if target.exists() or lang == "en":
        return deck_figures(target)
    english = ROOT / "notebooks" / lesson.name
    translated = section_headings(english, lesson)
    titles = {_title(english): _title(lesson)}
    return [
        (translated.get(heading, titles.get(heading, heading)), png)
        for heading, png in deck_figures(OUT / lesson.name)
    ]


def _title(lesson: Path) -> str:
    first = _source(json.loads(lesson.read_text(encoding="utf-8"))["cells"][0])
    return next((ln[2:] for ln in first.splitlines() if ln.startswith("# ")), lesson.stem)


def build(lang: str, from_decks: bool, only: set[str], check: bool = False) -> list[str]:
    """Write (or, with ``check``, compare) the decks of ``lang``; returns the stale ones."""
    where = paths(lang)
    where["out"].mkdir(parents=True, exist_ok=True)
    notes = instructor_notes(where["notes"].read_text(encoding="utf-8"))
    stuck = where["stuck"].read_text(encoding="utf-8")
    stale = []
    for lesson in sorted(where["lessons"].glob("[0-9][0-9]_*.ipynb")):
        if only and lesson.stem[:2] not in only:
            continue
        target = where["out"] / lesson.name
        if from_decks or check:
            found = built_figures(lesson, target, lang)
        else:
            found = figures(run_lesson(lesson))
        built = deck(lesson, found, notes.get(lesson.stem[:2], {}), stuck, lang)
        text = json.dumps(built, indent=1, ensure_ascii=False) + "\n"
        if target.exists() and target.read_text(encoding="utf-8") == text:
            continue
        stale.append(str(target.relative_to(ROOT)))
        if not check:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target}: {len(built['cells'])} cells", file=sys.stderr)
    return stale


def main() -> int:
    arguments = sys.argv[1:]
    lang = "en"
    if "--lang" in arguments:
        at = arguments.index("--lang")
        lang = arguments[at + 1].split("_")[0].lower()
        del arguments[at : at + 2]
        if lang not in LANGUAGES:
            print(f"slides.py: no decks in {lang!r} (one of {LANGUAGES})", file=sys.stderr)
            return 2
    os.environ.setdefault("SLOTMAP_BACKEND", "cpu")
    if lang != "en":
        os.environ["SLOTMAP_LANG"] = lang  # the lessons' figures and messages in that language
    flags = {"--from-decks", "--check"}
    only = set(arguments) - flags
    check = "--check" in arguments
    stale = build(lang, "--from-decks" in arguments, only, check)
    if check:
        print("\n".join(stale) or f"the {lang} decks are up to date", file=sys.stderr)
        if stale:
            print(f"run: workshop/slides.py --from-decks --lang {lang}", file=sys.stderr)
        return 1 if stale else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
