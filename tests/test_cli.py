"""The backend choice and the ``slotmap`` command (doctor, lab), as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    # The banner test needs it printed: drop what the caller set to choose or silence it.
    environment = {
        k: v for k, v in os.environ.items() if k not in ("SLOTMAP_BACKEND", "SLOTMAP_QUIET")
    }
    environment.update(env)
    environment["PYTHONPATH"] = str(ROOT) + os.pathsep + environment.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=300,
    )


def test_the_course_names_the_backend_once_per_process():
    code = "import slotmap.course, slotmap.course; slotmap.backend.announce(); print('ok')"
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("slotmap: backend") == 1
    assert done.stdout.strip().endswith("ok")


def test_the_library_names_nothing():
    done = run_python("import slotmap, slotmap.backend; slotmap.compute_slot_mapping; print('ok')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_override_selects_the_cpu_interpreter_before_kernels_are_decorated():
    code = (
        "import os, slotmap, slotmap.kernels.slot_mapping as m\n"
        "print(slotmap.BACKEND.name, os.environ.get('TRITON_INTERPRET'),"
        " type(m._compute_slot_mapping_kernel).__name__)"
    )
    done = run_python(code, SLOTMAP_BACKEND="cpu")
    assert done.returncode == 0, done.stderr
    name, interpret, kernel_type = done.stdout.strip().splitlines()[-1].split()
    assert (name, interpret) == ("cpu", "1")
    assert kernel_type == "InterpretedFunction"


def test_unknown_backend_is_refused():
    done = run_python("import slotmap.course", SLOTMAP_BACKEND="tpu")
    assert done.returncode != 0
    assert "SLOTMAP_BACKEND='tpu'" in done.stderr and "npu, cuda, cpu" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_forcing_a_missing_accelerator_says_why():
    done = run_python("import slotmap.course", SLOTMAP_BACKEND="cuda")
    assert done.returncode != 0
    assert "SLOTMAP_BACKEND=cuda, but torch sees no CUDA device" in done.stderr


def test_doctor_reports_backend_versions_and_a_passing_canary():
    done = run_python("from slotmap.cli import main; raise SystemExit(main(['doctor']))")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    import slotmap

    assert f"backend      {slotmap.BACKEND.name}" in out
    assert f"torch        {torch.__version__.split('+')[0]}" in out
    assert "triton       " in out and "torch-npu" in out
    assert out.count("  PASS  ") == 5 and "FAIL" not in out
    from slotmap.cli import kernel_side_only, widget_stack

    if kernel_side_only(widget_stack()):  # a headless machine: ipywidgets, no JupyterLab
        assert "widgets      kernel side only: ipywidgets 8.1.9, no JupyterLab here" in out
    else:
        assert "widgets      match: ipywidgets 8.1.9, jupyterlab_widgets 3.0.17, " in out
    assert "doctor: all good" in out


def matching_stack(**changes):
    from slotmap.cli import WidgetStack

    stack = WidgetStack(
        versions={"jupyterlab": "4.6.6", "ipywidgets": "8.1.9", "jupyterlab_widgets": "3.0.17"},
        ipywidgets_requires=[
            "comm>=0.1.3",
            "widgetsnbextension~=4.0.16",
            "jupyterlab_widgets~=3.0.17",
            'ipykernel; extra == "test"',
        ],
        shipped_extension="5.0.16",
        loaded_extension=("5.0.16", "/venv/share/jupyter/labextensions"),
    )
    for name, value in changes.items():
        setattr(stack, name, value)
    return stack


def test_doctor_accepts_the_pinned_widget_stack():
    from slotmap.cli import widget_problems, widgets_report

    assert widget_problems(matching_stack()) == []
    assert widgets_report(matching_stack()) == (
        True,
        [
            "widgets      match: ipywidgets 8.1.9, jupyterlab_widgets 3.0.17, "
            "@jupyter-widgets/jupyterlab-manager 5.0.16 (/venv/share/jupyter/labextensions)"
        ],
    )


@pytest.mark.parametrize(
    "changes, problems",
    [
        pytest.param(
            {
                "versions": {
                    "jupyterlab": "4.6.6",
                    "ipywidgets": "8.1.9",
                    "jupyterlab_widgets": "3.0.15",
                }
            },
            [
                "jupyterlab_widgets 3.0.15 is not the course's pin jupyterlab_widgets==3.0.17",
                "ipywidgets 8.1.9 needs jupyterlab_widgets~=3.0.17, found 3.0.15",
            ],
            id="older-frontend",
        ),
        pytest.param(
            {
                "versions": {
                    "jupyterlab": "3.6.8",
                    "ipywidgets": "8.1.9",
                    "jupyterlab_widgets": "3.0.17",
                }
            },
            ["jupyterlab 3.6.8 is not the course's pin jupyterlab>=4.4,<4.7"],
            id="jupyterlab-3",
        ),
        pytest.param(
            {"loaded_extension": ("5.0.9", "/root/.local/share/jupyter/labextensions")},
            [
                "JupyterLab loads @jupyter-widgets/jupyterlab-manager 5.0.9 from "
                "/root/.local/share/jupyter/labextensions, but jupyterlab_widgets 3.0.17 ships "
                "5.0.16: remove /root/.local/share/jupyter/labextensions/"
                "@jupyter-widgets/jupyterlab-manager"
            ],
            id="stale-user-extension",
        ),
        pytest.param(
            {"loaded_extension": None},
            ["JupyterLab finds no @jupyter-widgets/jupyterlab-manager extension"],
            id="no-extension",
        ),
        pytest.param(
            {
                "versions": {
                    "jupyterlab": "4.6.6",
                    "ipywidgets": "8.1.9",
                    "jupyterlab_widgets": None,
                }
            },
            ["jupyterlab_widgets is not installed: the course's widgets need it"],
            id="frontend-missing",
        ),
    ],
)
def test_doctor_reports_a_widget_mismatch(changes, problems):
    from slotmap.cli import widget_problems, widgets_report

    stack = matching_stack(**changes)
    assert widget_problems(stack) == problems
    ok, lines = widgets_report(stack)
    assert not ok
    assert lines[: len(problems)] == [f"widgets      MISMATCH: {p}" for p in problems]
    assert lines[-1] == (
        "             widgets would show 'Error displaying widget: model not found' or as "
        "text; reinstall the lab extra: pip install -e '.[lab]' (rm -rf .venv && make lab)"
    )


def test_doctor_without_the_lab_extra_is_not_a_mismatch():
    from slotmap.cli import widgets_report

    none = {"jupyterlab": None, "ipywidgets": None, "jupyterlab_widgets": None}
    assert widgets_report(matching_stack(versions=none, loaded_extension=None)) == (
        True,
        ["widgets      not installed (the course needs the lab extra)"],
    )


def test_doctor_on_a_headless_machine_checks_only_the_kernel_side():
    from slotmap.cli import widget_problems, widgets_report

    headless = {"jupyterlab": None, "ipywidgets": "8.1.9", "jupyterlab_widgets": "3.0.17"}
    assert widgets_report(matching_stack(versions=headless, loaded_extension=None)) == (
        True,
        [
            "widgets      kernel side only: ipywidgets 8.1.9, no JupyterLab here; the JupyterLab "
            "that runs these notebooks needs jupyterlab_widgets==3.0.17"
        ],
    )
    old = dict(headless, ipywidgets="8.1.5")
    assert widget_problems(matching_stack(versions=old, loaded_extension=None)) == [
        "ipywidgets 8.1.5 is not the course's pin ipywidgets==8.1.9"
    ]


def test_doctor_exits_1_on_a_widget_mismatch(monkeypatch, capsys):
    from slotmap import cli

    monkeypatch.setattr(cli, "widget_stack", lambda: matching_stack(loaded_extension=None))
    monkeypatch.setattr(cli, "canary", lambda: [("window kernel", True, 0.01, "exact")])
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "widgets      MISMATCH: JupyterLab finds no @jupyter-widgets/jupyterlab-manager" in out
    assert out.rstrip().endswith("doctor: the widgets FAILED")


def test_the_doctors_widget_pins_are_the_lab_extras_pins():
    tomllib = pytest.importorskip("tomllib")  # 3.11+; the file it reads is the same on 3.10

    from packaging.requirements import Requirement

    from slotmap.cli import LAB_PINS

    lab_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["lab"]
    pinned = {Requirement(r).name: str(Requirement(r).specifier) for r in lab_extra}
    from packaging.specifiers import SpecifierSet

    for name, pin in LAB_PINS.items():
        assert SpecifierSet(pinned[name]) == SpecifierSet(pin), name


def test_doctor_canary_fails_on_a_wrong_kernel(monkeypatch, capsys):
    """The canary is a real check: a kernel that writes a wrong slot makes it fail. The doctor
    says so in the course's language: here Chinese, every line of it."""
    import re

    import slotmap
    from slotmap import cli, i18n

    real = slotmap.compute_slot_mapping_direct

    def off_by_one(*args, **kwargs):
        out = real(*args, **kwargs)
        out[0] += 1
        return out

    monkeypatch.setattr(slotmap, "compute_slot_mapping_direct", off_by_one)
    monkeypatch.setattr(cli, "widget_stack", matching_stack)
    i18n.use("zh")
    try:
        assert cli.main(["doctor"]) == 1
    finally:
        i18n.use("en")
    out = capsys.readouterr().out
    assert f"后端         {slotmap.BACKEND.name}，设备 {slotmap.DEVICE!r}\n" in out
    assert "试启动检查   生产算子与参考实现对拍：\n" in out
    assert re.search(r"^  未通过  direct 算子 +[0-9.]+ ms  在 0 处不一致$", out, re.M), out
    assert re.search(r"^  通过  窗口算子 +[0-9.]+ ms  完全一致$", out, re.M), out
    assert "控件         匹配：ipywidgets 8.1.9，jupyterlab_widgets 3.0.17，" in out
    assert out.rstrip().endswith("doctor：试启动检查未通过")


def test_grade_progress_speaks_the_course_language():
    from slotmap import i18n
    from slotmap.cli import progress_bar, progress_line
    from slotmap.exercises.grade import Grade, _exit_reason

    one = Grade("a.ipynb", {"01.x": "PASS", "01.y": "SKIP: no GPU", "01.z": "missing"})
    assert progress_line(one, 1, 2) == "[1/2] a.ipynb: 01.x PASS, 01.y SKIP: no GPU, 01.z missing"
    assert progress_bar(1, 2, 12.3, width=4) == "[##..] 1/2 12 s"
    i18n.use("zh")
    try:
        assert progress_line(one, 1, 2) == "[1/2] a.ipynb: 01.x 通过，01.y 跳过：no GPU，01.z 缺失"
        assert progress_line(Grade("b.ipynb", error=_exit_reason(-9)), 2, 2) == (
            "[2/2] b.ipynb: 没有检查；被信号 9 终止"
        )
        assert progress_bar(1, 2, 12.3, width=4) == "[##..] 1/2，12 秒"
    finally:
        i18n.use("en")


def test_jupyter_programs_run_as_main_without_building_an_unused_grammar(tmp_path):
    # The lab's and the hub learners' servers start through slotmap.jupyter_main: reading a
    # notebook there must not import rfc3987-syntax, whose grammar cost each one 1 to 2 s.
    lesson = ROOT / "notebooks" / "01_paged_kv_cache.ipynb"
    (tmp_path / "probe.py").write_text(
        "import sys\n"
        "import nbformat\n"
        f"nbformat.validate(nbformat.read({str(lesson)!r}, 4))\n"
        "loaded = sorted(m for m in ('lark', 'rfc3987_syntax') if sys.modules.get(m))\n"
        "print(__name__, sys.argv[1:], loaded)\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "slotmap.jupyter_main", "probe", "--flag", "x"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == "__main__ ['--flag', 'x'] []"


def test_lab_command_opens_the_course(tmp_path, monkeypatch):
    from slotmap.lab import lab_command

    monkeypatch.chdir(tmp_path)  # not a course folder: falls back to the checkout
    command = lab_command(port=8123, no_browser=True, token="abc")
    assert command[:4] == [sys.executable, "-m", "slotmap.jupyter_main", "jupyterlab"]
    assert f"--ServerApp.root_dir={ROOT}" in command
    assert "--LabApp.default_url=/lab/tree/notebooks" in command
    assert "--ServerApp.ip=127.0.0.1" in command and "--ServerApp.port=8123" in command
    assert "--IdentityProvider.token=abc" in command and "--no-browser" in command
    assert "--ServerApp.contents_manager_class=slotmap.labserver.CourseContentsManager" in command
    assert (ROOT / "notebooks").is_dir()


def test_the_lab_hands_out_notebooks_with_the_kernel_metadata_jupyterlab_would_add():
    """Otherwise a lesson shows unsaved changes as soon as its kernel starts."""
    import platform
    from types import SimpleNamespace

    pytest.importorskip("jupyter_server")
    from slotmap.labserver import fill_kernel_metadata

    spec = SimpleNamespace(
        display_name="Python 3 (ipykernel)",
        language="python",
        argv=["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    )

    class Specs:
        def get_kernel_spec(self, name):
            if name != "python3":
                raise KeyError(name)
            return spec

    shipped = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    }
    notebook = {"cells": [], "metadata": json.loads(json.dumps(shipped))}
    fill_kernel_metadata(notebook, Specs())
    assert notebook["metadata"]["kernelspec"] == {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    info = notebook["metadata"]["language_info"]
    assert info["version"] == platform.python_version() and info["pygments_lexer"] == "ipython3"
    unknown = {"cells": [], "metadata": {"kernelspec": {"name": "julia-1.10"}}}
    fill_kernel_metadata(unknown, Specs())
    assert unknown["metadata"] == {"kernelspec": {"name": "julia-1.10"}}


def test_exercises_build_check_reports_drift_and_exits_1(tmp_path, monkeypatch, capsys):
    from slotmap.cli import main
    from slotmap.exercises import build

    assert main(["exercises", "build", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out
    # A solution whose exercise was never built is drift.
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / "01_new.ipynb").write_text(
        '{"cells": [{"cell_type": "code", "id": "a", "metadata": {}, "outputs": [],'
        ' "execution_count": null, "source": "### BEGIN SOLUTION\\nx = 1\\n### END SOLUTION"}],'
        ' "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
    )
    monkeypatch.setattr(build, "SOLUTIONS", solutions)
    monkeypatch.setattr(build, "EXERCISES", tmp_path / "exercises")
    monkeypatch.setattr(build.stale_exercises, "__defaults__", (solutions, tmp_path / "exercises"))
    monkeypatch.setattr(build.build_exercises, "__defaults__", (solutions, tmp_path / "exercises"))
    assert main(["exercises", "build", "--check"]) == 1
    assert "exercises/01_new.ipynb is missing" in capsys.readouterr().out
    assert main(["exercises", "build"]) == 0
    assert main(["exercises", "build", "--check"]) == 0


def test_lab_accepts_jupyter_options(capsys):
    from slotmap.cli import main

    assert main(["lab", "--dry-run", "--no-browser", "--LabApp.news_url=", "--", "--x=1"]) == 0
    command = capsys.readouterr().out.split()
    assert "--LabApp.news_url=" in command and "--x=1" in command and "--" not in command
    assert "--ContentsManager.pre_save_hook=slotmap.lab.keep_course_notebooks_clean" in command


def test_the_lab_saves_course_notebooks_without_outputs(tmp_path, monkeypatch):
    """A learner's autosave of a lesson keeps git clean; their own copies keep everything."""
    import json
    import socket
    import time
    import urllib.request

    pytest.importorskip("jupyterlab")
    from slotmap.lab import lab_command

    course = tmp_path / "course"
    for folder in ("notebooks", "my_work"):
        (course / folder).mkdir(parents=True)
    (course / ".slotmap-course").write_text("the course's root\n")
    shipped_metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    }
    (course / "notebooks" / "01_x.ipynb").write_text(
        json.dumps({"cells": [], "metadata": shipped_metadata, "nbformat": 4, "nbformat_minor": 5})
    )
    monkeypatch.chdir(course)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    jupyter_dirs = {
        name: str(tmp_path / name)
        for name in (
            "JUPYTER_CONFIG_DIR",
            "JUPYTER_DATA_DIR",
            "JUPYTER_RUNTIME_DIR",
            "IPYTHONDIR",
            "JUPYTERLAB_SETTINGS_DIR",
            "JUPYTERLAB_WORKSPACES_DIR",
        )
    }
    env = dict(os.environ, JUPYTER_PLATFORM_DIRS="1", **jupyter_dirs)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    server = subprocess.Popen(
        lab_command(port=port, no_browser=True, token="t"),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def call(method, path, body=None):
        request = urllib.request.Request(
            f"{base}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": "token t", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read()

    try:
        for _ in range(300):
            try:
                call("GET", "/api/status")
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()
                time.sleep(0.1)
        cell = {
            "cell_type": "code",
            "id": "a",
            "source": "print(1)",
            "execution_count": 7,
            "metadata": {"execution": {"x": 1}},
            "outputs": [{"output_type": "stream", "name": "stdout", "text": "1\n"}],
        }
        saved = {
            "cells": [cell],
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {
                **shipped_metadata,
                "widgets": {"state": {}},
                "language_info": {"name": "python", "version": "3.11.2"},
            },
        }
        for folder in ("notebooks", "my_work"):
            call(
                "PUT",
                f"/api/contents/{folder}/01_x.ipynb",
                {"type": "notebook", "format": "json", "content": saved},
            )
        lesson = json.loads((course / "notebooks" / "01_x.ipynb").read_text())
        assert lesson["cells"][0]["outputs"] == []
        assert lesson["cells"][0]["execution_count"] is None
        assert "".join(lesson["cells"][0]["source"]) == "print(1)"
        assert lesson["metadata"] == shipped_metadata
        mine = json.loads((course / "my_work" / "01_x.ipynb").read_text())
        assert mine["cells"][0]["outputs"] and mine["cells"][0]["execution_count"] == 7
    finally:
        try:
            call("POST", "/api/shutdown")
            server.wait(timeout=20)
        except Exception:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()


def unsaved_notebook() -> dict:
    """A notebook as JupyterLab saves it after a run: outputs, a count, widget state."""
    cell = {
        "cell_type": "code",
        "id": "a",
        "source": "print(1)",
        "execution_count": 3,
        "metadata": {},
        "outputs": [{"output_type": "stream", "name": "stdout", "text": "1\n"}],
    }
    metadata = {"widgets": {"state": {}}}
    return {"cells": [cell], "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}


def test_the_course_is_known_by_its_marker_file_not_by_a_notebooks_folder(tmp_path, monkeypatch):
    from slotmap.lab import course_root

    research = tmp_path / "research"
    (research / "notebooks").mkdir(parents=True)
    monkeypatch.chdir(research)
    assert course_root() == ROOT  # the checkout: the research folder is not the course
    course = tmp_path / "course"
    (course / "notebooks").mkdir(parents=True)
    (course / ".slotmap-course").write_text("the course's root\n")
    monkeypatch.chdir(course / "notebooks")
    assert course_root() == course  # the nearest folder with the marker, from inside it


@pytest.mark.parametrize("folder", ["notebooks", "solutions", "exercises"])
def test_the_save_hook_keeps_outputs_when_the_server_root_is_not_the_course(tmp_path, folder):
    """A research folder with a notebooks/ of its own keeps its outputs; the course does not."""
    import copy
    from types import SimpleNamespace

    from slotmap.lab import keep_course_notebooks_clean

    research = tmp_path / "research"
    (research / folder).mkdir(parents=True)
    server = SimpleNamespace(root_dir=str(research))
    model = {"type": "notebook", "content": unsaved_notebook()}
    keep_course_notebooks_clean(model, f"{folder}/analysis.ipynb", server)
    assert model == {"type": "notebook", "content": unsaved_notebook()}
    # The same save where the server's root is the course (the marker file) is cleaned.
    (research / ".slotmap-course").write_text("the course's root\n")
    cleaned = copy.deepcopy(model)
    keep_course_notebooks_clean(cleaned, f"{folder}/analysis.ipynb", server)
    cell = cleaned["content"]["cells"][0]
    assert cell["outputs"] == [] and cell["execution_count"] is None
    assert "widgets" not in cleaned["content"]["metadata"]


def test_the_course_marker_is_in_the_checkout_and_tracked_by_git():
    from slotmap.lab import COURSE_MARKER, is_course

    assert is_course(ROOT)
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        ["git", "ls-files", "--error-unmatch", COURSE_MARKER],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tracked.returncode == 0, tracked.stderr


def a_course(tmp_path: Path, monkeypatch) -> Path:
    """A course folder to run ``slotmap lab`` in, made the current folder; JupyterLab is
    never started (``os.execv`` raises)."""
    course = tmp_path / "course"
    for folder in ("notebooks", "exercises"):
        (course / folder).mkdir(parents=True)
    (course / ".slotmap-course").write_text("the course's root\n")
    monkeypatch.chdir(course)

    def no_jupyter(*args):
        raise AssertionError(f"slotmap lab started JupyterLab: {args}")

    monkeypatch.setattr(os, "execv", no_jupyter)
    return course


def test_lab_says_in_one_line_that_my_work_is_a_file(tmp_path, monkeypatch, capsys):
    from slotmap.cli import main

    course = a_course(tmp_path, monkeypatch)
    (course / "my_work").write_text("not a folder")
    assert main(["lab", "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"slotmap lab: {course / 'my_work'} is a file, not a folder: your copies of the "
        "exercises go in a folder there; rename or remove that file and run again\n"
    )


def test_lab_says_in_one_line_that_my_work_cannot_be_written(tmp_path, monkeypatch, capsys):
    # Simulated: the suite runs as root, and root writes into a read-only folder.
    from slotmap.cli import main

    course = a_course(tmp_path, monkeypatch)
    real_write_text = Path.write_text

    def read_only(self, *args, **kwargs):
        if "my_work" in self.parts:
            raise PermissionError(13, "Permission denied", str(self))
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", read_only)
    assert main(["lab", "--no-browser"]) == 2
    mine = course / "my_work"
    assert capsys.readouterr().err == (
        f"slotmap lab: cannot write your copies of the exercises in {mine}: Permission denied; "
        f"make {mine} a folder you can write to (chmod -R u+w {mine}) and run again\n"
    )


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root writes into a read-only folder; the simulated PermissionError test covers it",
)
def test_lab_with_a_read_only_my_work_exits_2(tmp_path, monkeypatch, capsys):
    from slotmap.cli import main

    course = a_course(tmp_path, monkeypatch)
    (course / "my_work").mkdir()
    (course / "my_work").chmod(0o500)
    try:
        assert main(["lab", "--no-browser"]) == 2
    finally:
        (course / "my_work").chmod(0o700)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Permission denied; make " in err


def test_lab_refuses_an_empty_token_unless_told_that_no_authentication_is_meant(capsys):
    from slotmap.cli import main

    for no_token in (["--token", ""], ["--IdentityProvider.token="], ["--ServerApp.token=''"]):
        assert main(["lab", "--dry-run", *no_token]) == 2, no_token
        captured = capsys.readouterr()
        assert captured.out == ""  # no command: nothing would start
        assert captured.err == (
            "slotmap lab: an empty token turns authentication off: anyone who can reach the "
            "port can run code as you; pass a token, or add --unsafe-no-auth if you mean it\n"
        )
    assert main(["lab", "--dry-run", "--token", "", "--unsafe-no-auth"]) == 0
    command = capsys.readouterr().out.split()
    assert "--IdentityProvider.token=" in command and "--unsafe-no-auth" not in command
    assert main(["lab", "--dry-run", "--token", "abc"]) == 0  # a token needs no flag
    assert "--IdentityProvider.token=abc" in capsys.readouterr().out.split()


def test_lab_outside_any_course_says_so(tmp_path, monkeypatch, capsys):
    from slotmap import cli, lab

    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lab, "CHECKOUT", tmp_path / "site-packages")  # installed on its own
    assert cli.main(["lab", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slotmap lab: no course here: ") and err.count("\n") == 1
    assert "run slotmap lab in the slotmap checkout" in err


def test_the_makefiles_cpu_torch_is_the_cpu_extras_pin():
    import re

    tomllib = pytest.importorskip("tomllib")  # 3.11+; the file it reads is the same on 3.10

    cpu_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["cpu"]
    pinned = re.search(r"^CPU_TORCH := (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert pinned in cpu_extra


def test_exercises_copy_says_in_one_line_that_my_work_is_a_file(tmp_path, monkeypatch, capsys):
    from slotmap.cli import main
    from slotmap.exercises import build

    workspace = tmp_path / "my_work"
    workspace.write_text("not a folder")
    monkeypatch.setattr(build, "learner_workspace", lambda: workspace)
    assert main(["exercises", "copy"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"slotmap exercises: {workspace} is a file, not a folder")
    assert err.count("\n") == 1


def test_exercises_copy_in_chinese_makes_the_chinese_copies_lab_makes(tmp_path, capsys):
    """A learner who deletes a copy and runs `slotmap exercises copy` again, as its banner
    says, gets it back in the language they take the course in, where `slotmap lab` put it."""
    from slotmap import i18n
    from slotmap.cli import main
    from slotmap.exercises.build import EXERCISES

    i18n.use("zh")
    try:
        assert main(["exercises", "copy", "--workspace", str(tmp_path)]) == 0
    finally:
        i18n.use("en")
    names = sorted(p.name for p in EXERCISES.glob("[0-9][0-9]_*.ipynb"))
    assert sorted(p.name for p in (tmp_path / "zh_CN").glob("*.ipynb")) == names
    assert sorted(p.name for p in tmp_path.glob("*.ipynb")) == names
    copy = json.loads((tmp_path / "zh_CN" / names[0]).read_text(encoding="utf-8"))
    assert copy["metadata"]["slotmap"]["language"] == "zh_CN"
    assert "zh_CN" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "names"),
    [
        (["lab"], {"slotmap", "lab", "en", "zh", "locale"}),
        (["grade"], {"slotmap", "grade", "folder", "ipynb"}),
    ],
)
def test_a_commands_help_speaks_the_course_language(command, names, capsys):
    # What is left in English is code: the command, its flags, metavars, paths and variables.
    import re

    from english_left import KEPT, english_words

    from slotmap import cli, i18n

    i18n.use("zh")
    try:
        with pytest.raises(SystemExit):
            cli.main([*command, "--help"])
    finally:
        i18n.use("en")
    shown = capsys.readouterr().out
    assert shown.startswith(f"用法：slotmap {command[0]}") and "\n选项：\n" in shown
    prose = re.sub(r"--?[\w-]+|\b[A-Z][A-Z_]+\b|\$\w+|\S*/\S*", " ", shown)
    assert set(english_words(prose, KEPT)) <= names, english_words(prose, KEPT)
    with pytest.raises(SystemExit):
        cli.main([*command, "--help"])
    assert capsys.readouterr().out.startswith(f"usage: slotmap {command[0]}")


@pytest.mark.parametrize(
    "argv",
    [
        [],  # the following arguments are required
        ["exercises", "cpy"],  # invalid choice
        ["grade", "my_work", "--jobs", "x"],  # invalid int value
        ["lab", "--port"],  # expected one argument
        ["grade", "my_work", "--verbose"],  # unrecognized arguments
    ],
)
def test_argparse_s_own_errors_speak_the_course_language(argv, capsys):
    import re

    from english_left import KEPT, english_words

    from slotmap import cli, i18n

    i18n.use("zh")
    try:
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
    finally:
        i18n.use("en")
    assert exited.value.code == 2
    said = capsys.readouterr().err.splitlines()[-1]
    assert said.startswith("slotmap") and "错误：" in said, said
    # Left in English: the command, the words typed, the names of its arguments and types.
    prose = re.sub(
        r"'[^']*'|--?[\w-]+|\b(slotmap|grade|lab|exercises|command|action|int)\b", " ", said
    )
    assert english_words(prose, KEPT) == [], said
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert ": error: " in capsys.readouterr().err


def test_grade_refuses_a_solutions_folder_without_solutions(tmp_path, capsys):
    from slotmap import cli

    (tmp_path / "learner").mkdir()
    notebook = ROOT / "exercises" / "01_paged_kv_cache.ipynb"
    (tmp_path / "learner" / notebook.name).write_bytes(notebook.read_bytes())
    argv = ["grade", str(tmp_path / "learner"), "--solutions", str(tmp_path / "nope")]
    assert cli.main(argv) == 2
    assert f"no solutions in {tmp_path / 'nope'}" in capsys.readouterr().err
