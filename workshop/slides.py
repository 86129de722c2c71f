"""Generate workshop/slides/NN_topic.ipynb: one short deck per lesson, from the lesson's own
figures, for jupyterlab-rise (the workshop extra installs it; in JupyterLab open a deck and
press the slideshow button, or open ``/rise/<path to the deck>``).

Each lesson is run top to bottom (nbclient, a fresh kernel, in notebooks/); every static figure
it draws becomes a slide under the heading of the section that drew it, the lesson's title
and opening paragraph the first slide, and its exercises the last. The figures are embedded
(scaled to 960 pixels wide): a deck needs no kernel.

    SLOTMAP_BACKEND=cpu .venv/bin/python workshop/slides.py   # a few minutes on 2 cores
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
WIDTH = 960
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
    if image.width > WIDTH:
        image = image.resize((WIDTH, round(image.height * WIDTH / image.width)))
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


def _slide(source: str, attachments: dict | None = None) -> dict:
    cell = {
        "cell_type": "markdown",
        "id": "",
        "metadata": {"slideshow": {"slide_type": "slide"}},
        "source": source,
    }
    if attachments:
        cell["attachments"] = attachments
    return cell


def deck(lesson: Path, executed: dict) -> dict:
    """The deck of one lesson: title, its figures, its exercises."""
    first = _source(executed["cells"][0])
    title = next((ln[2:] for ln in first.splitlines() if ln.startswith("# ")), lesson.stem)
    paragraphs = [p for p in first.split("\n\n") if p.strip() and not p.startswith("#")]
    cells = [_slide(f"# {title}\n\n" + (paragraphs[0] if paragraphs else ""))]
    for index, (heading, png) in enumerate(figures(executed)[:MAX_FIGURES]):
        name = f"figure{index}.png"
        attachment = {name: {"image/png": _scaled(png)}}
        cells.append(_slide(f"## {heading or title}\n\n![](attachment:{name})", attachment))
    exercise = ROOT / "exercises" / lesson.name
    if exercise.exists():
        ids = re.findall(r"check\(\\?[\"'](\d\d\.\w+)", exercise.read_text(encoding="utf-8"))
        listing = "\n".join(f"- `{i}`" for i in dict.fromkeys(ids))
        cells.append(_slide(f"## Your turn: `my_work/{lesson.name}`\n\n{listing}"))
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


def main() -> int:
    os.environ.setdefault("SLOTMAP_BACKEND", "cpu")
    OUT.mkdir(parents=True, exist_ok=True)
    lessons = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    only = set(sys.argv[1:])
    for lesson in lessons:
        if only and lesson.stem[:2] not in only:
            continue
        built = deck(lesson, run_lesson(lesson))
        target = OUT / lesson.name
        target.write_text(json.dumps(built, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {target}: {len(built['cells'])} slides", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
