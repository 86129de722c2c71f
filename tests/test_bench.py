"""``slotmap bench``: its correctness path on tiny shapes (no speed is asserted anywhere).

The bench checks every variant exactly against the reference before and after timing, with
the output poisoned first; these tests run that path on the active backend (the CPU
interpreter in CI) and check the files it writes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

import slotmap
from slotmap import bench


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("bench")
    args = parse(
        "--shapes",
        "tiny-mixed",
        "--block-sizes",
        "16",
        "--quick",
        "--out-dir",
        str(folder),
        "--name",
        "tiny",
    )
    assert bench.run(args) == 0
    return folder, json.loads((folder / "tiny.json").read_text())


def test_json_schema(written) -> None:
    _, result = written
    hardware = result["hardware"]
    for key in ("gpu", "driver", "torch", "triton", "date"):
        assert key in hardware
    assert hardware["torch"] == torch.__version__
    modes = {"eager", "graph"} if bench.graph_capture(slotmap.BACKEND.name) else {"eager"}
    seen = {(r["variant"], r["mode"]) for r in result["records"]}
    assert seen == {(v, m) for v in bench.VARIANTS for m in modes}
    for record in result["records"]:
        assert set(record) >= {"shape", "block_size", "variant", "mode", "us", "gbps"}
        assert record["shape"] == "tiny-mixed" and record["block_size"] == 16
        assert record["us"] > 0
        assert (record["gbps"] is None) == (record["variant"] == "empty")
        assert record["exact"] is True


def test_launcher_overhead_is_recorded(written) -> None:
    _, result = written
    launches = {r["launch"] for r in result["launcher"]}
    # Every launcher's hot path against its own raw launch: the window's and the fused one's.
    assert launches == {
        "raw",
        "validate-off",
        "validate-on",
        "fused-2 raw",
        "fused-2 validate-off",
    }


def test_the_serving_trace_is_measured_exactly(written) -> None:
    folder, result = written
    serving = result["serving"]
    assert serving["exact"] is True and serving["steps"] == len(serving["tokens_per_step"]) > 2
    assert len(set(serving["tokens_per_step"])) > 1  # num_tokens changes from step to step
    runs = {"raw", "mapper", "mapper-jit", "launcher", "empty", "groups-mapper"}
    if serving["c_launch"]:  # Triton's C launcher of the same kernel: on a GPU only
        runs |= {"c-launcher", "groups-c-launcher"}
    assert set(serving["host_us_per_step"]) == set(serving["host_us_quantiles"]) == runs
    assert serving["variants_warmed"] >= 1
    assert set(serving["mapper_over_raw"]) == {"median", "p95", "max"}
    assert (serving["mapper_over_c_launcher"] is None) == (not serving["c_launch"])
    assert "## A serving trace (" in (folder / "tiny.md").read_text()
    if serving["c_launch"]:
        assert any(row["target"].startswith("serving trace") for row in result["targets"])


def test_the_host_ladder_is_measured_exactly(written) -> None:
    folder, result = written
    ladder = result["ladder"]
    assert ladder["exact"] is True
    ways = {"empty-jit", "raw-jit", "aten-fill", "mapper", "mapper-jit", "groups-mapper"}
    if slotmap.BACKEND.name == "cuda":
        ways |= {"c-launcher", "groups-c-launcher", "graph-replay"}
    assert set(ladder["host_us"]) == ways
    assert all(us > 0 for us in ladder["host_us"].values())
    assert "## What one launch costs the host (" in (folder / "tiny.md").read_text()
    # No graph capture on the interpreter: no replayed decode steps.
    assert (result["graph_steps"] is None) == (bench.graph_capture(slotmap.BACKEND.name) is None)


def test_the_mapper_targets_are_judged_against_the_c_launcher() -> None:
    ratio = {"median": 1.1, "p95": 1.2, "max": 1.31}
    serving = dict(
        steps=3,
        host_us_per_step={"c-launcher": 6.0, "groups-c-launcher": 7.0},
        mapper_over_c_launcher=ratio,
        groups_over_c_launcher=dict(ratio, max=1.29),
    )
    rows = [r for r in bench.targets([], [], serving) if r["target"].startswith("serving")]
    assert [r["met"] for r in rows] == [False, True]  # the max of every step decides


def test_markdown_and_plot_are_written(written) -> None:
    folder, _ = written
    table = (folder / "tiny.md").read_text()
    assert "| tiny-mixed | 16 |" in table
    # The targets section names the project's own page, nothing outside the repository.
    assert "\n## Performance targets (docs/performance.md)\n" in table
    assert "## PERF" not in table
    pytest.importorskip("matplotlib")
    assert (folder / "tiny.png").stat().st_size > 0


def test_a_wrong_variant_is_caught(monkeypatch) -> None:
    # The check must be able to fail: a "kernel" that leaves its output poisoned.
    case = bench.build_case(bench.TINY_SHAPES["tiny-decode"], 16, slotmap.DEVICE)
    real = bench.make_variants

    def broken(case, names):
        variants = real(case, names)
        for variant in variants:
            variant.run = lambda: None
        return variants

    monkeypatch.setattr(bench, "make_variants", broken)
    with pytest.raises(AssertionError, match="differs from the reference before timing"):
        bench.measure_case(case, ["direct"], ["eager"], 2, True, lambda line: None)


def test_case_reference_matches_the_oracle() -> None:
    case = bench.build_case(bench.TINY_SHAPES["tiny-mixed"], 16, slotmap.DEVICE)
    for g in range(4):
        want = slotmap.slot_mapping_oracle(
            case.query_start_loc,
            case.positions,
            case.block_tables[g],
            16,
            max_num_tokens=case.shape.max_num_tokens,
        )
        assert torch.equal(case.expected[g].cpu(), want.cpu())


def test_graph_mode_is_chosen_per_backend() -> None:
    # CUDA graphs on a GPU; torch_npu's ACL graphs on an NPU (never run on hardware, and so
    # marked); no graph capture on the CPU interpreter.
    assert bench.bench_modes(["eager", "graph"], "cuda") == (["eager", "graph"], [])
    assert bench.bench_modes(["eager", "graph"], "npu") == (["eager", "graph"], [])
    assert bench.bench_modes(["eager", "graph"], "cpu") == (["eager"], ["graph"])
    cuda, npu = bench.graph_capture("cuda"), bench.graph_capture("npu")
    assert (cuda.graph_class, cuda.verified) == ("CUDAGraph", True)
    assert (npu.backend, npu.graph_class, npu.verified) == ("npu", "NPUGraph", False)
    assert bench.graph_capture("cpu") is None


def test_the_report_says_which_graph_api_timed_it_and_whether_it_ran_on_hardware(written):
    _, result = written
    if slotmap.BACKEND.name == "cpu":
        assert result["graph"] is None  # no graph mode ran
    label = bench.graph_capture("npu").label
    npu = dict(result, graph={"api": label, "verified_on_hardware": False})
    line = bench.graph_line(npu)
    assert "NPU graph (torch_npu ACL graph) (never run on hardware before this)" in line
    assert "(never run" not in bench.graph_line(dict(result, graph=None))
    assert "captured CUDA graph of" in bench.graph_line(dict(result, graph=None))
    assert bench.graph_line(npu) in bench.markdown(npu)


def test_the_raw_launch_passes_what_the_launcher_passes() -> None:
    # A raw launch without the plan's runtime arguments would run another configuration
    # (every program walking every tile) and still be exact: compare the calls themselves.
    calls = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    plan = bench.Plan(Kernel(), (3, 2), {"TILE_BLOCK_SIZE": 64}, {"parallel_tiles": 2})
    bench.raw_launch(plan, (1, 2))
    assert calls == [((3, 2), (1, 2), {"TILE_BLOCK_SIZE": 64, "parallel_tiles": 2})]
