"""The workshop's tracks, recomputed from the notebooks as they are now: every track fits its
slot, workshop/README.md's track table is what the notebooks give (their word counts, and the
run times and exercise estimates of their headers), and so is README.md's summary of them."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from slotmap.workshop.track import (
    BEGIN,
    EN_WORDS_PER_MINUTE,
    END,
    LOGIN_MINUTES,
    TRACKS,
    Track,
    lesson,
    lessons,
    main,
    plan,
    reading_units,
    table,
    with_table,
)

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "python -m slotmap.workshop.track --write writes it again"


@pytest.fixture(scope="module")
def course():
    return lessons(ROOT / "notebooks")


def test_every_track_fits_its_slot(course):
    assert [item.number for item in course] == [f"{n:02d}" for n in range(9)]
    for track in TRACKS:
        parts = plan(track, course)
        assert parts["total"] <= track.slot_minutes, (track.name, parts)
        assert parts["login"] == LOGIN_MINUTES and parts["questions"] > 0


def test_the_three_hour_track_teaches_01_to_03_in_depth_and_shows_07():
    short = next(t for t in TRACKS if t.name == "3h")
    assert short.slot_minutes == 180
    assert [n for n, how in short.taught.items() if how == "depth"] == ["01", "02", "03"]
    assert short.taught["07"] == 10


def test_the_workshop_readme_table_is_the_one_the_notebooks_give(course):
    readme = (ROOT / "workshop" / "README.md").read_text(encoding="utf-8")
    assert BEGIN in readme and END in readme
    assert with_table(readme, table(course)) == readme, f"the track table is stale: {REGENERATE}"


def test_each_row_of_the_table_carries_its_headers_numbers(course):
    rendered = table(course)
    for item in course:
        row = next(line for line in rendered.splitlines() if line.startswith(f"| {item.number} "))
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        header = "".join(
            json.loads((next((ROOT / "notebooks").glob(f"{item.number}_*.ipynb"))).read_text())[
                "cells"
            ][0]["source"]
        )
        assert f"runs top to bottom in about {cells[2].removesuffix(' s')} s" in header
        if cells[4] == "none":
            assert "has no exercises" in header
        else:
            assert f"exercises take about {cells[4].removesuffix(' min')} minutes" in header


def test_reading_time_follows_the_words_of_the_notebook(tmp_path, course):
    original = ROOT / "notebooks" / "02_first_kernel.ipynb"
    longer = tmp_path / original.name
    shutil.copy(original, longer)
    notebook = json.loads(longer.read_text(encoding="utf-8"))
    notebook["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "word " * 700})
    longer.write_text(json.dumps(notebook), encoding="utf-8")
    before, after = lesson(original), lesson(longer)
    assert after.words == before.words + 700
    assert after.reading_minutes == pytest.approx(before.reading_minutes + 10)
    assert before.reading_minutes == before.words / EN_WORDS_PER_MINUTE
    # A track built on it goes over a slot that held it before: the check catches it.
    tight = Track("t", "tight", 0, {"02": "depth"}, 0, 0)
    fits = plan(tight, [before])["total"]
    slot = Track("t", "tight", fits, {"02": "depth"}, 0, 0)
    assert plan(slot, [before])["total"] <= slot.slot_minutes < plan(slot, [after])["total"]
    assert plan(slot, [after])["02"] == math.ceil(
        after.reading_minutes + after.run_seconds / 60 + after.exercise_minutes
    )


def test_a_header_without_its_times_is_named(tmp_path):
    notebook = {"cells": [{"cell_type": "markdown", "source": "# 05 · Something\n\nNo times."}]}
    path = tmp_path / "05_something.ipynb"
    path.write_text(json.dumps(notebook), encoding="utf-8")
    with pytest.raises(ValueError, match="05_something.ipynb: its header must say"):
        lesson(path)


def test_chinese_counts_characters_and_the_latin_words_among_them():
    assert reading_units("分页的块表 block_table 和 slot", "zh") == 5 + 1 + 2 + 1
    assert reading_units("the block table's slot", "en") == 4


def test_the_command_says_when_a_track_is_over(tmp_path, capsys):
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        shutil.copy(path, tmp_path / path.name)
    assert main(["--notebooks", str(tmp_path)]) == 0
    bloated = tmp_path / "03_window_gather.ipynb"
    notebook = json.loads(bloated.read_text(encoding="utf-8"))
    notebook["cells"].append({"cell_type": "markdown", "source": "word " * 70 * 120})
    bloated.write_text(json.dumps(notebook), encoding="utf-8")
    assert main(["--notebooks", str(tmp_path)]) == 1
    assert "track 3h exceeds its slot" in capsys.readouterr().err


def test_the_readme_summary_of_the_lessons_holds_to_their_headers(course):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    runs = [item.run_seconds for item in course]
    exercises = [item.exercise_minutes for item in course if item.exercise_minutes]
    found = re.search(r"runs top to bottom in (\d+) to (\d+) s on the CPU interpreter", readme)
    assert found and (int(found[1]), int(found[2])) == (min(runs), max(runs))
    found = re.search(r"\((\d+) to (\d+) minutes a lesson", readme)
    assert found and (int(found[1]), int(found[2])) == (min(exercises), max(exercises))
