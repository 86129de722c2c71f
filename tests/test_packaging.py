"""The package as pip builds it: one wheel, built once for the module, and what its metadata
promises (version, license, typing, the Pythons and extras it declares)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import slotmap

ROOT = Path(__file__).resolve().parent.parent
# What the build reads. It builds a copy: pip's in-tree build would rewrite the checkout's
# slotmap.egg-info, which the editable install reads.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "NOTICE", "slotmap")
# The Pythons requires-python admits, and those triton-ascend 3.2.0 ships wheels for.
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
ASCEND_PYTHONS = ("3.10", "3.11")
# sha256 of the Apache License 2.0 as apache.org serves it (LICENSE-2.0.txt), which is
# LICENSE with the appendix's copyright line put back to its template.
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
COPYRIGHT = "Copyright 2026 the slotmap authors"

# The build (a few seconds, more when pip fetches setuptools for its isolated environment):
# every test here shares it, on one worker.
pytestmark = [pytest.mark.xdist_group("test_packaging"), pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Iterator[zipfile.ZipFile]:
    """The wheel ``pip wheel . --no-deps`` builds from the working tree, in an isolated build
    environment (no torch there: the version must be read without importing slotmap)."""
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif path.exists():
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(out)],
        check=True,
        timeout=240,
    )
    (built,) = out.glob("slotmap-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    """The text of ``name`` in the wheel's ``.dist-info`` folder."""
    (path,) = [
        p
        for p in wheel.namelist()
        if p.split("/")[0].endswith(".dist-info") and p.split("/", 1)[1] == name
    ]
    return wheel.read(path).decode()


@pytest.fixture(scope="module")
def metadata(wheel) -> Message:
    return Parser().parsestr(dist_info(wheel, "METADATA"))


def requirements(metadata: Message) -> list[Requirement]:
    return [Requirement(line) for line in metadata.get_all("Requires-Dist", [])]


def installs(requirement: Requirement, python: str, extra: str = "") -> bool:
    """Whether pip installs ``requirement`` on ``python`` when asked for ``extra``."""
    if requirement.marker is None:
        return True
    environment = default_environment()
    environment.update(python_version=python, python_full_version=f"{python}.0", extra=extra)
    return requirement.marker.evaluate(environment)


def test_the_wheel_requires_python_3_10_to_3_13(metadata):
    assert SpecifierSet(metadata["Requires-Python"]) == SpecifierSet(">=3.10,<3.14")


@pytest.mark.parametrize("extra", ["cpu", "cuda"])
def test_the_cpu_and_cuda_extras_install_on_python_3_10_to_3_13(metadata, extra):
    """Each Python is admitted, and the extra brings it a torch and a triton."""
    for python in PYTHONS:
        assert python in SpecifierSet(metadata["Requires-Python"]), python
        names = {
            r.name
            for r in requirements(metadata)
            if not installs(r, python) and installs(r, python, extra)
        }
        assert {"torch", "triton"} <= names, python


@pytest.mark.parametrize("extra", ["npu", "ascend-ir"])
def test_the_ascend_extras_are_limited_to_the_pythons_triton_ascend_ships(metadata, extra):
    """triton-ascend 3.2.0 and torch_npu 2.7.1 ship cp310 and cp311 wheels only: on a newer
    Python each of these extras' requirements is left out by its marker."""
    own = [r for r in requirements(metadata) if installs(r, "3.11", extra)]
    own = [r for r in own if not installs(r, "3.11")]
    assert "triton-ascend" in {r.name for r in own}
    for requirement in own:
        assert "python_version" in str(requirement.marker), requirement
        for python in PYTHONS:
            assert installs(requirement, python, extra) == (python in ASCEND_PYTHONS), (
                requirement,
                python,
            )


def test_no_library_code_needs_a_python_newer_than_3_10():
    """vermin reads slotmap/ and tests/ for any feature (syntax, module, member) newer than
    requires-python's lower end; the suite itself runs on one Python only."""
    pytest.importorskip("vermin", reason="vermin comes with the test extra")
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, vermin; sys.exit(vermin.main())",
            "--target=3.10-",
            "--eval-annotations",
            "--no-tips",
            "--violations",
            "--processes=1",
            "slotmap",
            "tests",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert found.returncode == 0, found.stdout + found.stderr


def test_the_license_is_apache_2_0_with_license_and_notice_in_the_wheel(wheel, metadata):
    assert metadata["License-Expression"] == "Apache-2.0"
    assert sorted(metadata.get_all("License-File", [])) == ["LICENSE", "NOTICE"]
    license_text = dist_info(wheel, "licenses/LICENSE")
    assert license_text == (ROOT / "LICENSE").read_text()
    assert COPYRIGHT in license_text
    template = license_text.replace(COPYRIGHT, "Copyright [yyyy] [name of copyright owner]")
    assert hashlib.sha256(template.encode()).hexdigest() == APACHE_2_SHA256
    notice = dist_info(wheel, "licenses/NOTICE")
    for name in ("vLLM", "vllm-ascend", "_compute_slot_mapping_kernel", "Apache License"):
        assert name in notice, name


def test_the_wheel_ships_py_typed(wheel):
    assert "slotmap/py.typed" in wheel.namelist()


def test_the_version_is_written_once(metadata):
    assert metadata["Version"] == slotmap.__version__
    tomllib = pytest.importorskip("tomllib")  # 3.11+; the file it reads is the same on 3.10
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]


def test_hypothesis_comes_only_with_the_lab_and_test_extras(metadata):
    hypothesis = [r for r in requirements(metadata) if r.name == "hypothesis"]
    assert hypothesis
    for python in PYTHONS:
        assert not any(installs(r, python) for r in hypothesis), python
        for extra in ("lab", "test"):
            assert any(installs(r, python, extra) for r in hypothesis), (extra, python)
    # The compile-only environment imports the exercises' kernels too (make test's second run).
    for python in ("3.10", "3.11"):
        assert any(installs(r, python, "ascend-ir") for r in hypothesis), python


# Run in a fresh interpreter where hypothesis cannot be imported: the library, a launcher,
# then the course's exercise package.
WITHOUT_HYPOTHESIS = """
import json, sys

class NoHypothesis:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hypothesis":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoHypothesis())
import torch
import slotmap

d = slotmap.DEVICE
slots = slotmap.compute_slot_mapping(
    torch.tensor([0, 3, 8], dtype=torch.int32, device=d),
    torch.tensor([0, 1, 2, 2, 3, 4, 5, 6], dtype=torch.int64, device=d),
    torch.tensor([[7, 2], [5, 9]], dtype=torch.int32, device=d),
    block_size=4,
    max_num_tokens=10,
)
result = {"slots": slots.tolist(), "loaded": [m for m in sys.modules if "hypothesis" in m]}
try:
    import slotmap.exercises
except ImportError as error:
    result["error"] = [type(error).__name__, error.name, str(error)]
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def without_hypothesis() -> dict:
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_HYPOTHESIS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def test_the_library_imports_and_launches_without_hypothesis(without_hypothesis):
    assert without_hypothesis["slots"] == [28, 29, 30, 22, 23, 36, 37, 38, -1, -1]
    assert without_hypothesis["loaded"] == []


def test_the_exercises_name_the_extra_that_brings_hypothesis_in_one_line(without_hypothesis):
    kind, name, message = without_hypothesis["error"]
    assert (kind, name) == ("ModuleNotFoundError", "hypothesis")
    assert "\n" not in message and "pip install 'slotmap[lab]'" in message
