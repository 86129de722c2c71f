"""triton-ascend's compiler (frontend, TTIR passes, Ascend adapter) on every launch the course
makes under the NPU's launch policy, as recorded in benchmarks/results/ascend-launches.json.

No NPU and no CANN: a launch passes when it reaches the binary stage, which needs CANN.
Known-wrong variants prove the checks can fail: the int32 gather is refused by the frontend,
and a per-lane block-table load shows up in the IR as a loop of scalar loads.
"""

from __future__ import annotations

import importlib.metadata
import os

import pytest

# These tests run apart from the main suite, in .venv-ascend (make ascend-ir): triton-ascend
# installs the `triton` package over upstream triton, so the two never share an environment.
# `make test` runs them as a second pytest run with --confcutdir=tests/ascend (the main
# suite's conftest needs the course's environment). No conftest.py here: its module name
# would shadow the main suite's `from conftest import ...`.
try:
    importlib.metadata.version("triton-ascend")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("needs triton-ascend: run `make ascend-ir`", allow_module_level=True)
os.environ.setdefault("SLOTMAP_BACKEND", "ascend-ir")  # before slotmap is imported

from slotmap import ascend  # noqa: E402
from slotmap.backend import BACKEND, COMPILE_ONLY  # noqa: E402

MANIFEST = ascend.load_manifest()
# Every kernel the course launches on an NPU: the slot-mapping family and the attention side.
COURSE_KERNELS = {
    "_compute_slot_mapping_kernel",  # the production window kernel
    "_compute_slot_mapping_direct_kernel",  # one block-table load a lane
    "_compute_slot_mappings_kernel",  # all KV-cache groups in one launch
    "_pad_replayed_slots_kernel",  # replay padding
    "_reshape_and_cache_kernel",
    "_paged_decode_attention_kernel",
    "_merge_attention_states_kernel",
}


def _name(launch: dict) -> str:
    return launch["kernel"].rsplit(":", 1)[1]


@pytest.fixture(scope="session")
def compiled() -> list[ascend.Compiled]:
    return ascend.compile_all(ascend.launches_of(MANIFEST))


def _npu(compiled, kernel: str) -> list[ascend.Compiled]:
    return [r for r in compiled if r.launch["policy"] == "npu" and r.kernel_name == kernel]


def test_kernels_are_compiled_functions_not_interpreted():
    from slotmap.kernels.slot_mapping import _compute_slot_mapping_kernel

    assert BACKEND.name == COMPILE_ONLY and BACKEND.policy == "npu"
    assert type(_compute_slot_mapping_kernel).__name__ == "JITFunction"


def test_the_manifest_covers_every_course_kernel_under_the_npu_policy():
    kernels = {_name(launch) for launch in ascend.launches_of(MANIFEST, "npu")}
    assert COURSE_KERNELS <= kernels, COURSE_KERNELS - kernels
    assert not MANIFEST["problems"], MANIFEST["problems"]


def test_every_npu_launch_passes_the_frontend_and_the_adapter(compiled):
    npu = [r for r in compiled if r.launch["policy"] == "npu"]
    refused = [
        f"{ascend.describe(r.launch)}: {r.status}: {r.first_error}"
        for r in npu
        if r.status != ascend.PASSES
    ]
    assert npu and not refused, "\n".join(refused)
    assert all(r.ir for r in npu), "every passing launch leaves the adapter's IR"


def test_the_npu_policy_never_launches_a_gpu_only_variant():
    for launch in ascend.launches_of(MANIFEST, "npu"):
        assert "token_grid" not in launch["kernel"], launch["kernel"]
        assert not launch["constants"].get("LANE_LOADS"), ascend.describe(launch)
        # Production's single-group launch is one program a request; only the fused kernel
        # spreads requests over parallel tiles (as vllm-ascend's adaptive fused kernel does).
        if "fused_groups" not in launch["kernel"]:
            assert launch.get("values", {}).get("parallel_tiles", 1) == 1, ascend.describe(launch)


def test_the_window_gathers_inside_a_contiguous_window_with_no_scalar_loop(compiled):
    windows = _npu(compiled, "_compute_slot_mapping_kernel")
    assert windows
    for r in windows:
        assert r.stats.scalar_load_loops == 0, ascend.describe(r.launch)
        assert r.stats.copies >= 2  # positions and the block-table window, each one block
        # The NPU's float gather: two exact 16-bit halves, two gathers.
        assert r.launch["constants"]["GATHER_AS_FLOAT"] is True
        assert r.stats.gathers == 2, ascend.describe(r.launch)


def test_a_per_lane_block_table_load_becomes_a_loop_of_scalar_loads(compiled):
    # The known-wrong design for an NPU: the direct kernel's one load a lane.
    direct = _npu(compiled, "_compute_slot_mapping_direct_kernel")
    assert direct
    for r in direct:
        assert r.stats.scalar_load_loops >= 1, ascend.describe(r.launch)
        assert r.stats.gathers == 0


def test_the_int32_gather_is_refused_by_the_frontend():
    result = ascend.refused_int32_gather()
    assert result.status == ascend.FRONTEND
    assert "but got int32" in result.first_error


def test_the_committed_report_matches_a_fresh_run(compiled):
    versions = {"triton-ascend": importlib.metadata.version("triton-ascend")}
    fresh = ascend.render_report(compiled, versions, MANIFEST)
    assert ascend.REPORT.read_text() == fresh, "run: .venv-ascend/bin/slotmap ascend --write"


def test_lesson_03s_committed_snapshot_matches_a_fresh_compile():
    import json

    fresh = ascend.lesson_snapshot()
    committed = json.loads(ascend.SNAPSHOT.read_text())
    assert fresh == committed, "run: .venv-ascend/bin/slotmap ascend --write"
    direct = fresh["kernels"]["_compute_slot_mapping_direct_kernel"]
    assert "scf.for" in direct["scalar_loop"] and "memref.load" in direct["scalar_loop"]
    window = fresh["kernels"]["_compute_slot_mapping_kernel"]
    assert "memref.copy" in window["copy"] and "triton_gather" in window["gather"]
