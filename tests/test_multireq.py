"""The correctness paths of the two experiments, benchmarks/multireq.py (several requests a
program, speculative position load) and benchmarks/token_lab.py (token-grid variants), run
exact against the reference on the CPU interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import slotmap

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(slotmap.BACKEND.name != "cpu", reason="the device run checks itself")
def test_multireq_cpu_check_is_exact():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "multireq.py"), "--cpu-check"],
        env={**os.environ, "SLOTMAP_BACKEND": "cpu", "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "192 launches exact" in done.stdout


@pytest.mark.skipif(slotmap.BACKEND.name != "cpu", reason="the device run checks itself")
def test_token_lab_variants_are_exact(tmp_path):
    # benchmarks/token_lab.py raises on any variant that differs from the reference.
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "token_lab.py"), "--cpu",
         "--out", str(tmp_path / "lab.json")],
        env={**os.environ, "SLOTMAP_BACKEND": "cpu", "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("tiny-mixed b16") == 4  # 2 tiles x (library, run6)
