"""Installs that do not drift: the hub's proxy comes from a lockfile that runs on the oldest
node the Makefile accepts, an older node is refused with what to do, the CPU torch comes from
one configurable index and never silently from elsewhere, and the npu extra resolves on an
Ascend host's aarch64. The tests that need a registry (npm, PyPI) skip when it cannot be
reached."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROXY = ROOT / "workshop" / "hub-proxy"
MAKE = shutil.which("make")


def _makefile_value(name: str) -> str:
    found = re.search(rf"^{name} :?= (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, name
    return found.group(1).strip()


def _satisfies(major: int, engines: str) -> bool:
    """Whether node ``major``.0.0 satisfies an npm ``engines.node`` range (the forms the
    lockfile uses: ``>=X[.Y.Z]``, ``>= X``, ``^X``, ``*`` and ``||`` between them)."""
    for alternative in engines.split("||"):
        alternative = alternative.strip().replace(">= ", ">=")
        if alternative in ("*", ""):
            return True
        found = re.fullmatch(r"(>=|\^)v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", alternative)
        assert found, f"an engines range this test cannot read: {engines!r}"
        low = tuple(int(part or 0) for part in found.groups()[1:])
        if found.group(1) == ">=" and (major, 0, 0) >= low:
            return True
        if found.group(1) == "^" and major == low[0]:
            return True
    return False


def test_the_range_reader_refuses_what_an_old_node_cannot_run():
    assert _satisfies(18, ">= 18") and _satisfies(18, "^16 || ^18 || >=20")
    assert _satisfies(20, ">=0.1.90") and _satisfies(18, "*")
    # configurable-http-proxy 5.3.0's commander 15 and 5.2's engines: not on node 18.
    assert not _satisfies(18, ">=22.12.0") and not _satisfies(18, ">= 20")
    assert not _satisfies(21, "^20")


def test_the_proxy_is_pinned_by_a_lockfile_that_runs_on_the_oldest_node_allowed():
    package = json.loads((PROXY / "package.json").read_text())
    lock = json.loads((PROXY / "package-lock.json").read_text())
    pinned = package["dependencies"]["configurable-http-proxy"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned), f"not an exact pin: {pinned}"
    assert lock["packages"][""]["dependencies"] == package["dependencies"]
    assert lock["packages"]["node_modules/configurable-http-proxy"]["version"] == pinned
    node_min = int(_makefile_value("NODE_MIN"))
    assert package["engines"]["node"] == f">={node_min}"
    for name, entry in lock["packages"].items():
        if not name:
            continue
        assert entry.get("integrity", "").startswith("sha512-"), name
        engines = entry.get("engines", {}).get("node")
        if engines:
            assert _satisfies(node_min, engines), (name, entry["version"], engines, node_min)
    makefile = (ROOT / "Makefile").read_text()
    assert "npm ci --prefix $(VENV)/hub-proxy" in makefile and "npm install" not in makefile


def _fake_node(folder: Path, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("node", f"echo {version}"), ("npm", "echo 10.0.0")):
        tool = folder / name
        tool.write_text(f"#!/bin/sh\n{text}\n")
        tool.chmod(0o755)
    return folder


@pytest.mark.skipif(MAKE is None, reason="needs make")
def test_make_refuses_a_node_too_old_or_missing_and_says_what_to_do(tmp_path):
    def hub_node(path: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [MAKE, "--no-print-directory", "-s", "hub-node"],
            cwd=ROOT,
            env={**os.environ, "PATH": path},
            capture_output=True,
            text=True,
            timeout=60,
        )

    node_min = int(_makefile_value("NODE_MIN"))
    old = hub_node(str(_fake_node(tmp_path / "old", f"v{node_min - 2}.20.2")))
    assert old.returncode != 0
    assert f"error: node v{node_min - 2}.20.2 is older than {node_min}" in old.stderr
    assert "NodeSource's node 20 (its nodejs package includes npm)" in old.stderr
    fine = hub_node(str(_fake_node(tmp_path / "fine", f"v{node_min}.19.0")))
    assert fine.returncode == 0, fine.stderr
    (tmp_path / "empty").mkdir()
    missing = hub_node(str(tmp_path / "empty"))
    assert missing.returncode != 0
    assert "apt-get install nodejs npm" in missing.stderr
    assert "'nodejs : Conflicts: npm'" in missing.stderr


def _npm_registry_reachable() -> bool:
    npm = shutil.which("npm")
    if npm is None:
        return False
    ping = subprocess.run([npm, "ping"], capture_output=True, timeout=120, check=False)
    return ping.returncode == 0


@pytest.mark.timeout(600)
def test_npm_ci_installs_exactly_the_locked_proxy(tmp_path):
    if not _npm_registry_reachable():
        pytest.skip("npm, or its registry, is not reachable here")
    prefix = tmp_path / "hub-proxy"
    prefix.mkdir()
    for name in ("package.json", "package-lock.json"):
        shutil.copy(PROXY / name, prefix / name)
    subprocess.run(
        ["npm", "ci", "--prefix", str(prefix), "--no-audit", "--no-fund"],
        check=True,
        capture_output=True,
        timeout=540,
    )
    lock = json.loads((PROXY / "package-lock.json").read_text())
    for name, entry in lock["packages"].items():
        if name:
            installed = json.loads((prefix / name / "package.json").read_text())
            assert installed["version"] == entry["version"], name
    proxy = prefix / "node_modules" / ".bin" / "configurable-http-proxy"
    shown = subprocess.run([proxy, "--version"], capture_output=True, text=True, timeout=60)
    pinned = json.loads((PROXY / "package.json").read_text())["dependencies"]
    assert shown.stdout.strip() == pinned["configurable-http-proxy"]


@pytest.mark.skipif(MAKE is None, reason="needs make")
@pytest.mark.timeout(300)
def test_the_cpu_torch_comes_from_its_index_or_setup_stops(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=240)
    # pip sees only the index given: no configuration file, no find-links, no extra index.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    def cpu_torch(index: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [MAKE, "--no-print-directory", "-s", "cpu-torch", f"VENV={venv}", index],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )

    unreachable = cpu_torch("CPU_TORCH_INDEX=http://127.0.0.1:9/whl/cpu")
    assert unreachable.returncode != 0  # never a fall back to another index's (CUDA) torch
    assert "could not be installed from CPU_TORCH_INDEX=http://127.0.0.1:9/whl/cpu" in (
        unreachable.stderr
    )
    assert "make ... CPU_TORCH_INDEX=" in unreachable.stderr
    empty = cpu_torch("CPU_TORCH_INDEX=")
    assert empty.returncode == 0
    assert "CPU_TORCH_INDEX is empty: torch comes from pip's own index" in empty.stdout
    installed = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert "torch" not in {p["name"] for p in json.loads(installed.stdout)}
    # The pin it installs is pyproject's cpu extra's.
    assert _makefile_value("CPU_TORCH") in _extra("cpu")


def _extra(name: str) -> list[str]:
    """The requirements of one of slotmap's extras, without their markers."""
    found = []
    for requirement in importlib.metadata.requires("slotmap") or []:
        if re.search(rf"""extra == ["']{name}["']""", requirement):
            found.append(requirement.split(";")[0].strip())
    return found


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/torch-npu/", timeout=20):
            return True
    except OSError:
        return False


def _resolve(pins: list[str], platform: str, report: Path) -> subprocess.CompletedProcess:
    """pip's resolver and wheel-tag matching for ``platform`` on PyPI (what ``pip download
    --platform`` does), from the wheels' metadata: nothing is installed, and no large wheel
    is downloaded where PyPI serves its metadata apart."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-deps",
            "--ignore-installed",
            "--only-binary=:all:",
            f"--platform={platform}",
            "--python-version=3.11",
            "--implementation=cp",
            f"--target={report.parent / 'target'}",
            "--index-url=https://pypi.org/simple",
            f"--report={report}",
            *pins,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=540,
    )


@pytest.mark.timeout(600)
def test_the_npu_extra_resolves_on_an_aarch64_host_with_glibc_2_28(tmp_path):
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable here")
    pins = _extra("npu")
    assert {re.split(r"[=<>]", pin)[0] for pin in pins} == {
        "triton-ascend",
        "pybind11",
        "torch",
        "torch-npu",
    }
    report = tmp_path / "aarch64.json"
    resolved = _resolve(pins, "manylinux_2_28_aarch64", report)
    assert resolved.returncode == 0, resolved.stderr[-2000:]
    wheels = {
        item["metadata"]["name"].lower().replace("_", "-"): item["download_info"]["url"]
        for item in json.loads(report.read_text())["install"]
    }
    assert set(wheels) == {"triton-ascend", "pybind11", "torch", "torch-npu"}
    for name, url in wheels.items():
        wheel = url.rsplit("/", 1)[-1]
        assert wheel.endswith(("aarch64.whl", "-none-any.whl")), (name, wheel)
        assert "cp311" in wheel or "py3-none-any" in wheel, (name, wheel)
    # glibc 2.17 to 2.27 (manylinux2014 only, e.g. CentOS 7): triton-ascend has no wheel.
    older = _resolve(["triton-ascend==3.2.0"], "manylinux2014_aarch64", tmp_path / "old.json")
    assert older.returncode != 0
    assert "No matching distribution found for triton-ascend==3.2.0" in older.stderr
