"""The backend choice and the ``slotmap`` command (doctor, lab), as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("SLOTMAP_BACKEND",)}
    environment.update(env)
    environment["PYTHONPATH"] = str(ROOT) + os.pathsep + environment.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment,
        cwd=ROOT, timeout=300,
    )  # fmt: skip


def test_backend_is_printed_once_per_process():
    done = run_python("import slotmap, importlib; import slotmap.backend; print('ok')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("slotmap: backend") == 1
    assert done.stdout.strip().endswith("ok")


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
    done = run_python("import slotmap", SLOTMAP_BACKEND="tpu")
    assert done.returncode != 0
    assert "SLOTMAP_BACKEND='tpu'" in done.stderr and "npu, cuda, cpu" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_forcing_a_missing_accelerator_says_why():
    done = run_python("import slotmap", SLOTMAP_BACKEND="cuda")
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
    assert "doctor: all good" in out


def test_doctor_canary_fails_on_a_wrong_kernel(monkeypatch):
    """The canary is a real check: a kernel that writes a wrong slot makes it fail."""
    import slotmap
    from slotmap import cli

    real = slotmap.compute_slot_mapping_direct

    def off_by_one(*args, **kwargs):
        out = real(*args, **kwargs)
        out[0] += 1
        return out

    monkeypatch.setattr(slotmap, "compute_slot_mapping_direct", off_by_one)
    results = {name: (ok, detail) for name, ok, _, detail in cli.canary()}
    assert results["direct kernel"] == (False, "MISMATCH at 0")
    assert results["window kernel"][0]


def test_lab_command_opens_the_course(tmp_path, monkeypatch):
    from slotmap.cli import lab_command

    monkeypatch.chdir(tmp_path)  # not a course folder: falls back to the checkout
    command = lab_command(port=8123, no_browser=True, token="abc")
    assert command[:3] == [sys.executable, "-m", "jupyterlab"]
    assert f"--ServerApp.root_dir={ROOT}" in command
    assert "--LabApp.default_url=/lab/tree/notebooks" in command
    assert "--ServerApp.ip=127.0.0.1" in command and "--ServerApp.port=8123" in command
    assert "--IdentityProvider.token=abc" in command and "--no-browser" in command
    assert (ROOT / "notebooks").is_dir()


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
    assert "--ContentsManager.pre_save_hook=slotmap.cli.keep_course_notebooks_clean" in command


def test_the_lab_saves_course_notebooks_without_outputs(tmp_path, monkeypatch):
    """A learner's autosave of a lesson keeps git clean; their own copies keep everything."""
    import json
    import socket
    import time
    import urllib.request

    pytest.importorskip("jupyterlab")
    from slotmap.cli import lab_command

    course = tmp_path / "course"
    for folder in ("notebooks", "my_work"):
        (course / folder).mkdir(parents=True)
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


def test_the_makefiles_cpu_torch_is_the_cpu_extras_pin():
    import re
    import tomllib

    cpu_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["cpu"]
    pinned = re.search(r"^CPU_TORCH := (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert pinned in cpu_extra
