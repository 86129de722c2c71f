"""The course's runtime messages in Chinese: slotmap.i18n's language choice, the gettext catalog
(complete, nothing fuzzy or obsolete, compiled), and `slotmap lab --lang`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slotmap import i18n

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("environ", "lang"),
    [
        ({}, "en"),
        ({"SLOTMAP_LANG": "zh"}, "zh_CN"),
        ({"SLOTMAP_LANG": "zh-CN"}, "zh_CN"),
        ({"SLOTMAP_LANG": "en", "LANG": "zh_CN.UTF-8"}, "en"),  # the course's own variable wins
        ({"LANG": "zh_CN.UTF-8"}, "zh_CN"),  # a zh locale chooses Chinese
        ({"LANGUAGE": "zh_CN:en", "LANG": "en_US.UTF-8"}, "zh_CN"),
        ({"LC_ALL": "C.UTF-8", "LANG": "zh_CN.UTF-8"}, "en"),
        ({"LANG": "de_DE.UTF-8"}, "en"),
    ],
)
def test_the_language_comes_from_slotmap_lang_else_the_locale(environ, lang):
    assert i18n.from_environment(environ) == lang


def test_a_language_the_course_does_not_speak_is_refused():
    with pytest.raises(ValueError, match="'fr'"):
        i18n.normalize("fr")


def course_line(**environ: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("LANG", "LANGUAGE", "LC_ALL")}
    env.pop("SLOTMAP_LANG", None)
    env.update(environ, SLOTMAP_BACKEND="cpu")
    done = subprocess.run(
        [sys.executable, "-c", "import slotmap.course"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_course_names_its_backend_in_chinese_under_the_chinese_setting():
    assert (
        course_line()
        == "slotmap: backend cpu (Triton interpreter on the CPU; SLOTMAP_BACKEND=cpu)"
    )
    assert course_line(SLOTMAP_LANG="zh") == (
        "slotmap：后端 cpu（CPU 上的 Triton 解释器；SLOTMAP_BACKEND=cpu）"
    )


def test_every_reason_the_backend_gives_reads_in_chinese():
    from slotmap.backend import _cuda_available, _npu_available

    def reasons() -> list[str]:
        return [_npu_available()[1], _cuda_available()[1]]

    english = reasons()
    i18n.use("zh")
    try:
        chinese = reasons()
    finally:
        i18n.use("en")
    assert english == reasons()
    for en, zh in zip(english, chinese, strict=True):
        assert zh != en and any("\u4e00" <= c <= "\u9fff" for c in zh), (en, zh)


def test_the_catalog_says_everything_the_source_says():
    """What CI runs (slotmap translate messages --check): every wrapped message translated,
    nothing fuzzy or obsolete, the same placeholders, the glossary's terms, a current .mo."""
    pytest.importorskip("babel")
    from slotmap.translate.messages import message_problems

    assert message_problems() == []


@pytest.fixture
def tiny_source(tmp_path: Path) -> Path:
    """A package of two messages, its babel.cfg, and a complete Chinese catalog for it."""
    pytest.importorskip("babel")
    from slotmap.translate import messages

    root = tmp_path / "src"
    (root / "slotmap").mkdir(parents=True)
    (root / "babel.cfg").write_text("[python: slotmap/**.py]\n")
    (root / "slotmap" / "m.py").write_text(
        "from slotmap.i18n import _\n"
        "A = _('the block table has {rows} rows')\n"
        "B = _('Triton interpreter on the CPU')\n"
    )
    locale = root / "locale"
    messages.update("zh_CN", root, locale)
    catalog = messages.read("zh_CN", locale)
    catalog.get("the block table has {rows} rows").string = "块表有 {rows} 行"
    catalog.get("Triton interpreter on the CPU").string = "CPU 上的 Triton 解释器"
    write(catalog, locale)
    messages.update("zh_CN", root, locale)
    assert messages.message_problems("zh_CN", root, locale) == []
    return root


def write(catalog, locale: Path) -> None:
    from babel.messages.pofile import write_po

    with (locale / "zh_CN/LC_MESSAGES/slotmap.po").open("wb") as handle:
        write_po(handle, catalog)


def test_the_check_names_a_new_message_missing_from_the_catalog(tiny_source):
    from slotmap.translate.messages import message_problems

    source = tiny_source / "slotmap" / "m.py"
    source.write_text(source.read_text() + "C = _('the slot mapping is ready')\n")
    problems = message_problems("zh_CN", tiny_source, tiny_source / "locale")
    assert len(problems) == 1 and "missing 'the slot mapping is ready'" in problems[0]


def test_the_check_names_a_changed_message_as_fuzzy_then_its_old_one_as_obsolete(tiny_source):
    from slotmap.translate import messages

    locale = tiny_source / "locale"
    source = tiny_source / "slotmap" / "m.py"
    source.write_text(source.read_text().replace("{rows} rows", "{rows} rows and a stride"))
    problems = messages.message_problems("zh_CN", tiny_source, locale)
    assert any("missing 'the block table has {rows} rows and a stride'" in p for p in problems)
    assert any("obsolete 'the block table has {rows} rows'" in p for p in problems)
    messages.update("zh_CN", tiny_source, locale)  # Babel matches the old translation: fuzzy
    problems = messages.message_problems("zh_CN", tiny_source, locale)
    assert problems == [
        "locale/zh_CN/LC_MESSAGES/slotmap.po: fuzzy 'the block table has {rows} rows and a "
        "stride' (the English changed): review it"
    ]
    # A message the source no longer says at all is kept as obsolete (#~) until deleted.
    source.write_text(source.read_text().replace("B = _('Triton interpreter on the CPU')", ""))
    messages.update("zh_CN", tiny_source, locale)
    problems = messages.message_problems("zh_CN", tiny_source, locale)
    assert any("obsolete #~ 'Triton interpreter on the CPU'" in p for p in problems), problems


def test_the_check_names_wrong_placeholders_a_missing_term_and_a_stale_mo(tiny_source):
    from slotmap.translate import messages

    locale = tiny_source / "locale"
    catalog = messages.read("zh_CN", locale)
    catalog.get("the block table has {rows} rows").string = "页表有 {row} 行"
    write(catalog, locale)
    problems = messages.message_problems("zh_CN", tiny_source, locale)
    assert any("has placeholders ['row'], not ['rows']" in p for p in problems)
    assert any(
        "the English says 'block table', the translation lacks 「块表」" in p for p in problems
    )
    assert any("slotmap.mo is not the .po compiled" in p for p in problems)


def test_lab_in_chinese_opens_the_english_lessons_until_chinese_ones_are_built(
    tmp_path, monkeypatch, capsys
):
    from slotmap.cli import main

    course = tmp_path / "course"
    (course / "notebooks").mkdir(parents=True)
    (course / ".slotmap-course").write_text("the course's root\n")
    monkeypatch.chdir(course)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    try:
        assert main(["lab", "--dry-run", "--lang", "zh"]) == 0
        out, err = capsys.readouterr()
        assert "--LabApp.default_url=/lab/tree/notebooks " in out
        assert "课程尚未翻译" in err
        (course / "notebooks" / "zh_CN").mkdir()
        (course / "notebooks" / "zh_CN" / "01_x.ipynb").write_text("{}")
        assert main(["lab", "--dry-run", "--lang", "zh"]) == 0
        out, err = capsys.readouterr()
        assert "--LabApp.default_url=/lab/tree/notebooks/zh_CN " in out
        settings = tmp_path / "cache" / "slotmap" / "lab-settings" / "zh_CN"
        assert f"--LabApp.app_settings_dir={settings}" in out.split()
        overrides = json.loads((settings / "overrides.json").read_text())
        assert overrides["@jupyterlab/translation-extension:plugin"]["locale"] == "zh_CN"
        assert main(["lab", "--dry-run", "--lang", "en"]) == 0
        out, _ = capsys.readouterr()
        assert "app_settings_dir" not in out and "default_url=/lab/tree/notebooks " in out
        assert main(["lab", "--dry-run", "--lang", "fr"]) == 2
        assert "slotmap lab: --lang 'fr'" in capsys.readouterr().err
        i18n.use("zh")  # the refusal speaks the language the course spoke until then
        assert main(["lab", "--dry-run", "--lang", "fr"]) == 2
        assert capsys.readouterr().err == (
            "slotmap lab: --lang 'fr'：课程只支持 en（English）和 zh（简体中文）\n"
        )
    finally:
        i18n.use("en")


def test_each_language_keeps_its_own_exercise_copies(tmp_path, monkeypatch):
    """Switching language never touches the other language's work."""
    from slotmap import cli
    from slotmap.exercises import build

    course = tmp_path / "course"
    (course / "notebooks").mkdir(parents=True)
    (course / "exercises").mkdir()
    (course / ".slotmap-course").write_text("the course's root\n")
    exercises = tmp_path / "shipped"
    (exercises / "zh_CN").mkdir(parents=True)
    one = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (exercises / "01_x.ipynb").write_text(json.dumps(one))
    (exercises / "zh_CN" / "01_x.ipynb").write_text(json.dumps(dict(one, metadata={"zh": 1})))
    monkeypatch.setattr(build, "EXERCISES", exercises)
    monkeypatch.chdir(course)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # slotmap lab sets $SLOTMAP_LANG for JupyterLab's kernels: monkeypatch restores it after.
    monkeypatch.setenv("SLOTMAP_LANG", "en")
    started = []
    monkeypatch.setattr(os, "execv", lambda *args: started.append(args))
    try:
        assert cli.main(["lab", "--no-browser", "--lang", "zh"]) == 0
        assert os.environ["SLOTMAP_LANG"] == "zh_CN"  # the kernels speak Chinese too
        mine_en, mine_zh = course / "my_work" / "01_x.ipynb", course / "my_work/zh_CN/01_x.ipynb"
        assert json.loads(mine_zh.read_text())["metadata"] == {"zh": 1}
        mine_en.write_text("my English work")
        mine_zh.write_text("我的中文练习")
        assert cli.main(["lab", "--no-browser", "--lang", "en"]) == 0
        assert cli.main(["lab", "--no-browser", "--lang", "zh"]) == 0
        assert mine_en.read_text() == "my English work"
        assert mine_zh.read_text() == "我的中文练习"
        assert len(started) == 3
    finally:
        i18n.use("en")


def test_jupyterlab_serves_its_interface_in_chinese_under_lab_lang_zh(tmp_path, monkeypatch):
    """The real server: the language pack is installed and the locale setting says zh_CN."""
    import socket
    import time
    import urllib.request

    pytest.importorskip("jupyterlab")
    pytest.importorskip("jupyterlab_language_pack_zh_CN")
    from slotmap.lab import lab_command

    course = tmp_path / "course"
    (course / "notebooks").mkdir(parents=True)
    (course / ".slotmap-course").write_text("the course's root\n")
    monkeypatch.chdir(course)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dirs = ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR")
    env = dict(os.environ, JUPYTER_PLATFORM_DIRS="1", **{d: str(tmp_path / d) for d in dirs})
    env["JUPYTERLAB_SETTINGS_DIR"] = str(tmp_path / "user-settings")
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(tmp_path / "workspaces")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    server = subprocess.Popen(
        lab_command(port=port, no_browser=True, token="t", lang="zh_CN"),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def get(path: str) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}", headers={"Authorization": "token t"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    try:
        for _ in range(600):
            try:
                get("/api/status")
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()
                time.sleep(0.1)
        setting = get("/lab/api/settings/@jupyterlab/translation-extension:plugin")
        # The language is the default the learner sees until they pick one in Settings.
        assert setting["schema"]["properties"]["locale"]["default"] == "zh_CN"
        assert "locale" not in setting["settings"]
        bundle = get("/lab/api/translations/zh_CN")["data"]["jupyterlab"]
        assert bundle["Restart Kernel"] == ["重启内核"]
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_n_marks_a_message_that_tr_translates_when_it_is_shown():
    """A message defined at import time (N_) keeps its English and follows the language of the
    moment it is shown (tr), not of the moment it was defined."""
    title = i18n.N_("Triton interpreter on the CPU")  # a message the catalog translates
    assert title == "Triton interpreter on the CPU"
    before = i18n.language()
    try:
        i18n.use("zh")
        assert i18n.tr(title) == i18n._("Triton interpreter on the CPU") != title
        assert i18n.tr("") == ""  # gettext("") would be the catalog's header
        i18n.use("en")
        assert i18n.tr(title) == "Triton interpreter on the CPU"
    finally:
        i18n.use(before)


def test_the_catalog_extracts_messages_marked_with_n(tiny_source):
    from slotmap.translate.messages import message_problems

    source = tiny_source / "slotmap" / "m.py"
    source.write_text(source.read_text() + "C = N_('a title defined at import time')\n")
    problems = message_problems("zh_CN", tiny_source, tiny_source / "locale")
    assert len(problems) == 1 and "missing 'a title defined at import time'" in problems[0]
