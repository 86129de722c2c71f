"""The room's dashboard against its own learners' files, and for a room of 30: a record it
cannot trust, a FIFO, a link or a huge file in place of a progress file never fails or hangs the
room; the track filter, the per-exercise totals, the stuck highlight and its stuck.md link.
tests/test_workshop_hub.py runs the dashboard on a real hub."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from slotmap.exercises.progress import PROGRESS_FILE
from slotmap.workshop.dashboard import (
    PROGRESS_CAP,
    _ago,
    exercise_ids,
    render,
    render_stuck,
    room,
    stuck_anchor,
    stuck_rows,
    track_exercises,
)

ROOT = Path(__file__).resolve().parents[1]
NOW = 1_800_000_000.0
EXERCISES = ["01.slot_of", "01.slot_mapping"]


def _line(exercise: str, state: str, message: str = "", at: float = NOW - 120) -> str:
    return json.dumps({"exercise": exercise, "state": state, "message": message, "time": at})


def _homes(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    homes = {}
    for name, text in files.items():
        homes[name] = tmp_path / name
        homes[name].mkdir()
        (homes[name] / PROGRESS_FILE).write_text(text, encoding="utf-8")
    return homes


def _users(*names: str) -> list[dict]:
    return [{"name": name, "admin": False, "last_activity": None} for name in names]


def _room_holds(table: dict) -> None:
    """What the page and the API do with a table: neither may fail."""
    page = render(table)
    assert page.startswith("<!doctype html>")
    json.loads(json.dumps(table, allow_nan=False))  # the API: strict JSON, no NaN or Infinity


# Records a check never writes: each is skipped and counted, never shown, never fatal.
BAD_RECORDS = [
    '{"exercise": "01.slot_mapping", "state": "pass", "message": "", "time": Infinity}',
    '{"exercise": "01.slot_mapping", "state": "pass", "message": "", "time": -Infinity}',
    '{"exercise": "01.slot_mapping", "state": "pass", "message": "", "time": NaN}',
    _line("01.slot_mapping", "pass", at=-5),
    _line("01.slot_mapping", "pass", at=1e300),
    _line("01.slot_mapping", "pass", at=0),
    '{"exercise": "01.slot_mapping", "state": "pass", "message": "", "time": "soon"}',
    '{"exercise": "01.slot_mapping", "state": "pass", "message": "", "time": true}',
    '{"exercise": "01.slot_mapping", "state": "pass", "message": "", "time": ' + "9" * 400 + "}",
    '{"exercise": "01.slot_mapping", "state": "pass", "message": "", "time": ' + "9" * 5000 + "}",
    '{"exercise": "01.slot_mapping", "state": "pass", "message": {"x": 1}, "time": 1.8e9}',
    '{"exercise": "01.slot_mapping", "state": "won", "message": "", "time": 1.8e9}',
    '{"exercise": 5, "state": "pass", "message": "", "time": 1.8e9}',
    '{"exercise": "' + "0" * 100 + '", "state": "pass", "message": "", "time": 1.8e9}',
    '["01.slot_mapping", "pass"]',
    "[" * 200_000,  # nested past the parser's recursion limit
    "not json at all",
]


def test_records_out_of_range_or_of_the_wrong_type_are_skipped_and_shown_unreadable(tmp_path):
    good = _line("01.slot_of", "pass")
    homes = _homes(
        tmp_path,
        {"ada": "\n".join([good, *BAD_RECORDS]) + "\n", "bob": _line("01.slot_of", "fail", "x")},
    )
    table = room(_users("ada", "bob"), homes.__getitem__, EXERCISES, now=NOW)
    ada, bob = table["learners"]
    assert ada["cells"] == {
        "01.slot_of": {"state": "pass", "message": ""},
        "01.slot_mapping": {"state": "none", "message": ""},
    }
    assert ada["unreadable"] == f"{len(BAD_RECORDS)} records skipped"
    assert ada["idle_seconds"] == 120
    assert (
        bob["cells"]["01.slot_of"] == {"state": "fail", "message": "x"} and not bob["unreadable"]
    )
    _room_holds(table)
    assert f"unreadable: {len(BAD_RECORDS)} records skipped" in render(table)


@pytest.mark.parametrize("record", BAD_RECORDS[:6], ids=lambda r: r[60:80])
def test_one_bad_record_alone_never_fails_the_room(tmp_path, record):
    homes = _homes(tmp_path, {"ada": record + "\n"})
    table = room(_users("ada"), homes.__getitem__, EXERCISES, now=NOW)
    assert table["learners"][0]["unreadable"] == "1 record skipped"
    assert table["learners"][0]["idle_seconds"] is None
    _room_holds(table)


def _room_in_a_thread(users: list[dict], homes: dict[str, Path]) -> dict:
    """room() in a thread: a dashboard that blocks on a FIFO's open or read never returns, and
    the test then fails instead of hanging (the FIFO is opened for writing, which frees it)."""
    result: dict = {}
    worker = threading.Thread(
        target=lambda: result.update(room(users, homes.__getitem__, EXERCISES, now=NOW)),
        daemon=True,
    )
    worker.start()
    worker.join(timeout=120)
    if worker.is_alive():
        for home in homes.values():
            fifo = home / PROGRESS_FILE
            if fifo.is_fifo():
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a writer came and went
        worker.join(timeout=30)
        pytest.fail("the dashboard blocked on a learner's FIFO")
    return result


def test_a_fifo_for_a_progress_file_neither_hangs_nor_fails_the_room(tmp_path):
    homes = _homes(tmp_path, {"bob": _line("01.slot_of", "pass")})
    homes["ada"] = tmp_path / "ada"
    homes["ada"].mkdir()
    os.mkfifo(homes["ada"] / PROGRESS_FILE)
    table = _room_in_a_thread(_users("ada", "bob"), homes)
    ada, bob = table["learners"]
    assert ada["unreadable"] == "its progress file is not a regular file"
    assert set(cell["state"] for cell in ada["cells"].values()) == {"none"}
    assert bob["cells"]["01.slot_of"]["state"] == "pass"
    _room_holds(table)


def test_a_progress_file_or_a_workspace_that_is_a_link_is_not_followed(tmp_path):
    # A learner's link to a file of passes (a classmate's, or any file of that name).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / PROGRESS_FILE).write_text(_line("01.slot_of", "pass"), encoding="utf-8")
    homes = {name: tmp_path / name for name in ("ada", "bob")}
    homes["ada"].mkdir()
    (homes["ada"] / PROGRESS_FILE).symlink_to(elsewhere / PROGRESS_FILE)
    homes["bob"].symlink_to(elsewhere, target_is_directory=True)
    table = room(_users("ada", "bob"), homes.__getitem__, EXERCISES, now=NOW)
    for row in table["learners"]:
        assert row["cells"]["01.slot_of"]["state"] == "none", row["learner"]
    assert [row["unreadable"] for row in table["learners"]] == [
        "its progress file is a link",
        "its workspace is a link or not a folder",
    ]
    _room_holds(table)


def test_a_huge_progress_file_is_read_from_its_end_up_to_the_cap(tmp_path):
    filler = _line("01.slot_mapping", "fail", "old", at=NOW - 3000) + "\n"
    text = filler * (3 * PROGRESS_CAP // len(filler)) + _line("01.slot_of", "pass") + "\n"
    homes = _homes(tmp_path, {"ada": text})
    row = room(_users("ada"), homes.__getitem__, EXERCISES, now=NOW)["learners"][0]
    assert row["cells"]["01.slot_of"]["state"] == "pass"
    assert row["cells"]["01.slot_mapping"] == {"state": "fail", "message": "old"}
    assert row["unreadable"] == f"only its last {PROGRESS_CAP // 1024} KiB read"


def test_no_workspace_or_no_progress_file_yet_is_no_problem(tmp_path):
    homes = {"ada": tmp_path / "ada", "bob": tmp_path / "bob"}
    homes["bob"].mkdir()
    table = room(_users("ada", "bob"), homes.__getitem__, EXERCISES, now=NOW)
    assert [row["unreadable"] for row in table["learners"]] == ["", ""]


def test_the_track_filter_shows_the_exercises_the_room_does():
    every = exercise_ids(ROOT)
    short = track_exercises(every, "3h")
    assert short == [e for e in every if e[:2] in ("01", "02", "03")]
    assert "03.window_kernel" in short and "04.ring_slot" in every
    day = track_exercises(every, "day")
    assert set(short) < set(day) < set(every) and not [e for e in day if e[:2] in ("06", "08")]
    assert track_exercises(every, "all") == every
    with pytest.raises(KeyError, match="no track 'week'"):
        track_exercises(every, "week")


def test_the_room_of_thirty_totals_stuck_learners_and_last_active(tmp_path):
    exercises = ["03.window_size", "03.window_kernel"]
    minute = 60
    homes = _homes(
        tmp_path,
        {
            # Failing 03.window_kernel for 15 minutes: stuck.
            "ada": "\n".join(
                [
                    _line("03.window_size", "pass", at=NOW - 20 * minute),
                    _line("03.window_kernel", "fail", "first", at=NOW - 15 * minute),
                    _line(
                        "03.window_kernel",
                        "fail",
                        "a lane past the request's end wrote slot 12 at out[7], past the end "
                        "of the output (7 entries)",
                        at=NOW - 2 * minute,
                    ),
                ]
            ),
            # Passed it 12 minutes ago, failing again for 5: not stuck.
            "bob": "\n".join(
                [
                    _line("03.window_kernel", "fail", at=NOW - 15 * minute),
                    _line("03.window_kernel", "pass", at=NOW - 12 * minute),
                    _line("03.window_kernel", "fail", at=NOW - 5 * minute),
                ]
            ),
            # Failed it 15 minutes ago, then moved on: not stuck on it.
            "cy": "\n".join(
                [
                    _line("03.window_kernel", "fail", at=NOW - 15 * minute),
                    _line("03.window_size", "pass", at=NOW - 3 * minute),
                ]
            ),
            "dee": "",
        },
    )
    users = _users("ada", "bob", "cy", "dee")
    users[3]["last_activity"] = time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - 2 * 3600 - 5 * minute - 30)
    )
    table = room(users, homes.__getitem__, exercises, now=NOW)
    stuck = {row["learner"]: row["stuck"] for row in table["learners"]}
    assert stuck["ada"]["exercise"] == "03.window_kernel" and stuck["ada"]["minutes"] == 15
    assert stuck["bob"] is None and stuck["cy"] is None and stuck["dee"] is None
    assert table["totals"] == {
        "03.window_size": {"pass": 2, "fail": 0, "skip": 0, "none": 2},
        "03.window_kernel": {"pass": 0, "fail": 3, "skip": 0, "none": 1},
    }
    rows = stuck_rows((ROOT / "workshop" / "stuck.md").read_text(encoding="utf-8"))
    mask = [
        i
        for i, row in enumerate(rows)
        if row["exercise"] == "03.window_kernel" and row["symptom"] == "missing store mask"
    ]
    assert len(mask) == 1, "stuck.md lost its 03.window_kernel 'missing store mask' row"
    anchor = f"stuck-03.window_kernel-{mask[0]}"
    assert stuck_anchor(rows, "03.window_kernel", stuck["ada"]["message"]) == anchor
    page = render(table, "3h", rows)
    assert f'<a href="stuck#{anchor}">stuck on 03.window_kernel for 15 min' in page
    assert f'<tr id="{anchor}">' in render_stuck(rows)
    assert page.count("stuck on ") == 1
    assert "<td><small>2 pass, 0 FAIL, 0 skip, 2 -</small></td>" in page
    idle = {row["learner"]: _ago(row["idle_seconds"]) for row in table["learners"]}
    assert idle == {
        "ada": "2 min ago",
        "bob": "5 min ago",
        "cy": "3 min ago",
        "dee": "2 h 05 min ago",
    }


def test_a_failure_without_a_matching_row_links_the_exercises_first_row():
    rows = [
        {"exercise": "01.a", "symptom": "s", "message": "tokens 2 and 3 collide", "hint": "h"},
        {"exercise": "01.b", "symptom": "s", "message": "position 4 got slot 9", "hint": "h"},
        {"exercise": "01.b", "symptom": "t", "message": "tokens 2 and 3 collide", "hint": "h"},
    ]
    assert stuck_anchor(rows, "01.b", "tokens 8 and 9 collide in slot 7") == "stuck-01.b-2"
    assert stuck_anchor(rows, "01.b", "something else entirely") == "stuck-01.b-1"
    assert stuck_anchor(rows, "01.c", "tokens 8 and 9 collide") == ""


def test_last_active_to_the_minute():
    assert [_ago(s) for s in (None, 0, 59, 60, 719, 3599, 3600, 7530)] == [
        "never",
        "this minute",
        "this minute",
        "1 min ago",
        "11 min ago",
        "59 min ago",
        "1 h 00 min ago",
        "2 h 05 min ago",
    ]


def test_the_page_escapes_every_learner_string(tmp_path):
    hostile = '<img src=x onerror="alert(1)">'
    homes = _homes(
        tmp_path,
        {
            hostile: _line("01.slot_of", "fail", hostile, at=NOW - 20 * 60)
            + "\n"
            + _line("01.slot_of", "fail", hostile, at=NOW - 60)
        },
    )
    table = room(_users(hostile), homes.__getitem__, EXERCISES, now=NOW)
    assert table["learners"][0]["stuck"]["exercise"] == "01.slot_of"
    rows = [{"exercise": "01.slot_of", "symptom": hostile, "message": hostile, "hint": hostile}]
    for page in (render(table, "all", rows), render_stuck(rows)):
        assert "<img" not in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page


@pytest.fixture
def service_language():
    """The service's language, restored after the test."""
    from slotmap import i18n

    before = i18n.language()
    yield i18n
    i18n.use(before)


ENGLISH_WORDS = ("The room", "learner", "last active", "passed", "min ago", "stuck on", "Track:")


def _stuck_room(tmp_path: Path, lang: str | None) -> tuple[dict, list[dict[str, str]]]:
    homes = _homes(
        tmp_path,
        {
            "ada": _line("01.slot_of", "fail", "first", at=NOW - 15 * 60)
            + "\n"
            + _line("01.slot_of", "fail", "again", at=NOW - 2 * 60)
            + "\nnot json\n",
            "bob": _line("01.slot_of", "pass"),
        },
    )
    table = room(_users("ada", "bob"), homes.__getitem__, EXERCISES, now=NOW, lang=lang)
    rows = [{"exercise": "01.slot_of", "symptom": "s", "message": "first", "hint": "h"}]
    return table, rows


def test_the_room_speaks_the_language_its_address_asks_for(tmp_path, service_language):
    service_language.use("en")
    table, rows = _stuck_room(tmp_path, "zh")
    assert table["learners"][0]["unreadable"] == "跳过了 1 条记录"
    page = render(table, "3h", rows, lang="zh")
    assert '<html lang="zh-CN">' in page and "<h1>全场进度</h1>" in page
    assert "<th>学员</th><th>最近活动</th><th>通过</th>" in page
    assert "2 分钟前" in page and ">未通过<br>" in page and "1 通过, 1 未通过" in page
    # Every link keeps the language: the tracks', the stuck learner's, stuck.md's.
    assert '<a href="stuck?lang=zh#stuck-01.slot_of-0">卡在 01.slot_of 已 15 分钟' in page
    assert '<a href="?track=day&amp;lang=zh">一天（9:00 到 17:00）</a>' in page
    assert '<a href="stuck?lang=zh">该怎么提示</a>' in page
    assert not [word for word in ENGLISH_WORDS if word in page]
    stuck = render_stuck(rows, "zh")
    assert "<h1>学员卡住时</h1>" in stuck and "<th>下一条提示</th>" in stuck
    english = render(table, "3h", rows, lang="en")
    assert "<h1>The room</h1>" in english and "跳过了" in english  # the table's own words


def test_without_lang_the_room_speaks_the_services_language(tmp_path, service_language):
    service_language.use("zh")
    table, rows = _stuck_room(tmp_path, None)
    assert table["learners"][0]["unreadable"] == "跳过了 1 条记录"
    assert "<h1>全场进度</h1>" in render(table, "3h", rows)
    assert '<a href="stuck#stuck-01.slot_of-0">' in render(table, "3h", rows)
    assert [_ago(s) for s in (None, 30, 60, 7530)] == [
        "从未",
        "本分钟内",
        "1 分钟前",
        "2 小时 05 分钟前",
    ]
    (tmp_path / "en").mkdir()
    table, rows = _stuck_room(tmp_path / "en", "en")
    assert table["learners"][0]["unreadable"] == "1 record skipped"
    assert "<h1>The room</h1>" in render(table, "3h", rows, lang="en")
    with pytest.raises(ValueError, match="课程只支持 en"):  # refused in the service's language
        render(table, lang="fr")
