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


def stuck_notes(text: str, exercises: list[str]) -> str:
    """Where learners get stuck on ``exercises``: stuck.md's rows for them, as notes."""
    lines = []
    for row in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        if len(cells) == 4 and cells[0] in exercises:
            lines.append(
                f'- `{cells[0]}`, {cells[1]}: the check says "{cells[2]}". Hint: {cells[3]}'
            )
    return "\n".join(lines)


def deck(lesson: Path, found: list[tuple[str, str]], notes: dict[str, str], stuck: str) -> dict:
    """The deck of one lesson: title, objectives, extra slides, figures (``found``: section
    heading and PNG as base64), exercises; the notes of instructor.md and stuck.md."""
    first = _source(json.loads(lesson.read_text(encoding="utf-8"))["cells"][0])
    title = next((ln[2:] for ln in first.splitlines() if ln.startswith("# ")), lesson.stem)
    paragraphs = [p for p in first.split("\n\n") if p.strip() and not p.startswith("#")]
    opening = paragraphs[:1]
    if len(paragraphs) > 1 and paragraphs[1].startswith("|"):
        opening.append(paragraphs[1])  # the opening's table (lesson 00: the backends)
    cells = [_slide(f"# {title}\n\n" + "\n\n".join(opening))]
    if notes.get("objectives"):
        cells.append(_slide(f"## What you will be able to do\n\n{notes['objectives']}"))
    spoken = [
        f"**Say:** {notes['say']}" if notes.get("say") else "",
        f"**Ask:** {notes['ask']}" if notes.get("ask") else "",
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
    exercise = ROOT / "exercises" / lesson.name
    if exercise.exists():
        ids = list(
            dict.fromkeys(
                re.findall(r"check\(\\?[\"'](\d\d\.\w+)", exercise.read_text(encoding="utf-8"))
            )
        )
        listing = "\n".join(f"- `{i}`" for i in ids)
        cells.append(_slide(f"## Your turn: `my_work/{lesson.name}`\n\n{listing}"))
        where = stuck_notes(stuck, ids)
        if where:
            cells.append(
                _slide(f"**Where learners get stuck** (stuck.md):\n\n{where}", kind="notes")
            )
    # Decks carry a fixed id per cell: a rebuild changes nothing that did not change.
    for number, cell in enumerate(cells):
        cell["id"] = f"{lesson.stem[:2]}-slide-{number}"
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "rise": {"scroll": True, "transition": "none"},
            "slotmap": {"generated_from": f"notebooks/{lesson.name}"},
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


def main() -> int:
    os.environ.setdefault("SLOTMAP_BACKEND", "cpu")
    OUT.mkdir(parents=True, exist_ok=True)
    lessons = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    from_decks = "--from-decks" in sys.argv[1:]
    only = set(sys.argv[1:]) - {"--from-decks"}
    notes = instructor_notes(NOTES.read_text(encoding="utf-8"))
    stuck = STUCK.read_text(encoding="utf-8")
    for lesson in lessons:
        if only and lesson.stem[:2] not in only:
            continue
        target = OUT / lesson.name
        found = deck_figures(target) if from_decks else figures(run_lesson(lesson))
        built = deck(lesson, found, notes.get(lesson.stem[:2], {}), stuck)
        target.write_text(json.dumps(built, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {target}: {len(built['cells'])} cells", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
