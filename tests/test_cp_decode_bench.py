"""benchmarks/cp_decode.py runs end to end on the CPU: real gloo ranks, checked, timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import slotmap
from slotmap.cp import max_ranks
from slotmap.distributed import COMMUNICATION

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "cp_decode.py"


def test_cp_decode_script_checks_and_times_one_and_two_ranks(tmp_path):
    if slotmap.BACKEND.name != "cpu" and max_ranks() < 2:
        pytest.skip("two ranks need two devices of this backend")
    env = {**os.environ, "SLOTMAP_BACKEND": slotmap.BACKEND.name, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "cp_decode.json").read_text())
    assert result["communication"] == COMMUNICATION[slotmap.BACKEND.name]
    runs = {run["world_size"]: run for run in result["runs"]}
    assert sorted(runs) == [1, 2]
    for run in runs.values():
        assert run["ok"] and run["max_error"] < 1e-5
        assert run["eager_step_ms"] > 0 and run["eager_local_ms"] > 0
        assert run["eager_slot_mapping_ms"] > 0
        assert all(rank["errors"]["after_timing"] == 0.0 for rank in run["ranks"])
    # Two ranks split the cached tokens between them, with nothing lost or stored twice.
    total = sum(runs[1]["problem"]["seq_lens"])
    assert [r["local_tokens"] for r in runs[1]["ranks"]] == [total]
    assert sum(r["local_tokens"] for r in runs[2]["ranks"]) == total
    assert all(r["local_tokens"] > 0 for r in runs[2]["ranks"])
    devices = {r["device"] for r in runs[2]["ranks"]}
    assert devices == (
        {"cpu"}
        if slotmap.BACKEND.name == "cpu"
        else {f"{slotmap.DEVICE}:0", f"{slotmap.DEVICE}:1"}
    )
    table = (tmp_path / "cp_decode.md").read_text()
    assert "| tiny | 2 |" in table and "ok" in table
