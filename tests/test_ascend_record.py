"""The course's side of the Ascend compiler check (the compiler itself runs in .venv-ascend:
tests/ascend): the launch policy, the compile-only backend, the launch recorder, the IR
counts, and that the committed manifest of NPU launches is fresh for the library's launches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton.language as tl

from slotmap import ascend, launch_log

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLOTMAP_", "TRITON_"))}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_the_npu_policy_makes_the_npu_choices_on_the_cpu_interpreter():
    code = (
        "import slotmap, triton\n"
        "from slotmap.kernels import fused_groups, launch, token_grid\n"
        "print(slotmap.BACKEND.name, slotmap.BACKEND.policy, launch.DEFAULT_GATHER_AS_FLOAT,\n"
        "      launch.launch_shape(8192, 4, None, None, None),\n"
        "      token_grid.use_token_grid(256, 256, None, None),\n"
        "      fused_groups.use_lane_loads(None, None))\n"
    )
    npu = run_python(code, SLOTMAP_BACKEND="cpu", SLOTMAP_LAUNCH_POLICY="npu")
    assert npu.returncode == 0, npu.stderr
    assert npu.stdout.splitlines()[-1] == "cpu npu True (1024, 1, {}) False False"
    cuda = run_python(code, SLOTMAP_BACKEND="cpu", SLOTMAP_LAUNCH_POLICY="cuda")
    assert cuda.returncode == 0, cuda.stderr
    gpu = "cpu cuda False (1024, 2, {'num_warps': 8}) True True"
    assert cuda.stdout.splitlines()[-1] == gpu
    wrong = run_python("import slotmap.backend", SLOTMAP_LAUNCH_POLICY="tpu")
    assert wrong.returncode != 0 and "SLOTMAP_LAUNCH_POLICY='tpu'" in wrong.stderr


def test_the_compile_only_backend_decorates_compiled_kernels_and_launches_nothing():
    code = (
        "import os, slotmap\n"
        "from slotmap.kernels.slot_mapping import _compute_slot_mapping_kernel as k\n"
        "print(slotmap.BACKEND.name, slotmap.BACKEND.policy, type(k).__name__,\n"
        "      os.environ.get('TRITON_INTERPRET'))\n"
    )
    done = run_python(code, SLOTMAP_BACKEND="ascend-ir")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ascend-ir npu JITFunction None"
    # With the interpreter forced on, nothing could be compiled: one clear error, up front.
    both = run_python(code, SLOTMAP_BACKEND="ascend-ir", TRITON_INTERPRET="1")
    assert both.returncode != 0
    assert "SLOTMAP_BACKEND=ascend-ir compiles the kernels: unset TRITON_INTERPRET" in both.stderr


def test_describe_launch_types_every_argument():
    def kernel(a_ptr, b_ptr, n, big, f, flag, missing, SIZE: tl.constexpr, DEF: tl.constexpr = 3):
        pass

    a = torch.zeros(2, dtype=torch.int32)
    b = torch.zeros(2, dtype=torch.float32)
    launch = launch_log.describe_launch(
        kernel, (a, b, 5, 2**40, 1.5, True, None), {"SIZE": 8, "num_warps": 4}
    )  # noqa: E501
    assert launch["signature"] == {
        "a_ptr": "*i32",
        "b_ptr": "*fp32",
        "n": "i32",
        "big": "i64",
        "f": "fp32",
        "flag": "i1",
        "missing": "constexpr",
        "SIZE": "constexpr",
        "DEF": "constexpr",
    }
    assert launch["constants"] == {"missing": None, "SIZE": 8, "DEF": 3}
    assert launch["kernel"].endswith(":test_describe_launch_types_every_argument.<locals>.kernel")


def test_ir_stats_counts_scalar_loads_inside_loops_only():
    ir = "\n".join(
        [
            "func.func @k() {",
            "  %a = memref.load %p[%c0] : memref<1xi32>",  # outside any loop: a scalar argument
            "  memref.copy %s, %d : memref<?xi32> to memref<?xi32>",
            "  scf.for %i = %c0 to %c64 step %c1 {",  # the tile loop: a copy and a nested loop
            "    memref.copy %s, %d : memref<?xi32> to memref<?xi32>",
            "    %r = scf.for %j = %c0 to %c64 step %c1 iter_args(%t = %e) -> (tensor<64xi32>) {",
            "      %x = memref.load %q[%c0] : memref<1xi32>",
            "      scf.yield %t : tensor<64xi32>",
            "    } {ExtractedLoadOrStore}",
            "    %g = func.call @triton_gather(%w, %r, %c0_i32)",
            "    %h = func.call @triton_gather_0(%w, %r, %c0_i32)",
            "  }",
            "  scf.for %k = %c0 to %c4 step %c1 {",  # not the adapter's: loads, but not per lane
            "    %y = memref.load %q[%k] : memref<4xi32>",
            "    memref.store %v, %o[%k] : memref<4xi32>",
            "  }",
            "}",
        ]
    )
    stats = ascend.ir_stats(ir)
    # One per-lane loop (tagged by the adapter) inside the tile loop; two loads inside loops.
    assert stats == ascend.IRStats(
        scalar_load_loops=1,
        scalar_loads_in_loops=2,
        scalar_stores_in_loops=1,
        copies=2,
        gathers=2,
    )
    no_loop = ascend.ir_stats("\n".join(line for line in ir.splitlines() if "%x" not in line))
    assert no_loop.scalar_load_loops == 0 and no_loop.scalar_loads_in_loops == 1


def test_the_committed_manifest_holds_every_library_launch(tmp_path):
    """A fresh recording of the doctor's canary under each policy finds nothing that the
    committed manifest (which tests/ascend compiles) lacks."""
    manifest = ascend.load_manifest()
    for policy in ("npu", "cuda"):
        record = tmp_path / f"{policy}.jsonl"
        record.touch()
        env = ascend._policy_env(policy, record, "test")
        env = {k: v for k, v in env.items() if not k.startswith("TRITON_")}
        done = subprocess.run(
            [sys.executable, "-m", "slotmap", "doctor"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert "canary" in done.stdout, done.stderr
        fresh = {launch_log.launch_key(x) for x in launch_log.read([record])}
        committed = {launch_log.launch_key(x) for x in ascend.launches_of(manifest, policy)}
        assert fresh and fresh <= committed, [json.loads(k)[0] for k in fresh - committed]


@pytest.mark.parametrize("policy", ["npu"])
def test_a_recorded_launch_is_written_once_per_process(tmp_path, policy):
    record = tmp_path / "r.jsonl"
    code = (
        "import torch, slotmap\n"
        "q = torch.tensor([0, 3], dtype=torch.int32); p = torch.arange(3)\n"
        "t = torch.tensor([[4]], dtype=torch.int32)\n"
        "for _ in range(3): slotmap.compute_slot_mapping(q, p, t, block_size=4)\n"
    )
    done = run_python(
        code,
        SLOTMAP_BACKEND="cpu",
        SLOTMAP_LAUNCH_POLICY=policy,
        SLOTMAP_RECORD_LAUNCHES=str(record),
    )
    assert done.returncode == 0, done.stderr
    lines = record.read_text().splitlines()
    assert len(lines) == 1
    launch = json.loads(lines[0])
    assert launch["kernel"] == "slotmap.kernels.slot_mapping:_compute_slot_mapping_kernel"
    assert (
        launch["constants"]["GATHER_AS_FLOAT"] is True
        and launch["signature"]["positions_ptr"] == "*i64"
    )  # noqa: E501


def test_lesson_03_falls_back_to_the_committed_snapshot_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(ascend, "ASCEND_VENV", tmp_path / "no-such-venv")
    view = ascend.lesson_view()
    assert view["source"].startswith("committed snapshot (benchmarks/results/ascend-ir.json)")
    assert view["triton-ascend"] in view["source"]
    direct = view["kernels"]["_compute_slot_mapping_direct_kernel"]["stats"]
    window = view["kernels"]["_compute_slot_mapping_kernel"]["stats"]
    assert direct["scalar_load_loops"] >= 1 and window["scalar_load_loops"] == 0
    assert window["gathers"] == 2 and view["int32_gather"]["status"] == ascend.FRONTEND
