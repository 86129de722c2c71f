"""Known-wrong variants of slotmap (mutants) that the suite must catch.

Each mutant is one exact textual replacement in a copy of the package (the pattern must occur
exactly once, so a mutant can never silently be a no-op). A focused subset of the real tests
then runs against the copy in a process of its own and must fail; the same subset must pass
against an unmutated copy (the control), so the failure is the mutant's doing. Triton reads
kernel source from real files, which the copy provides. The processes use this run's backend
(the CPU interpreter under ``SLOTMAP_BACKEND=cpu``, compiled kernels on a GPU) and the
``mutants`` hypothesis profile (no shrinking). Each is a fork of ``tests/mutant_runner.py``,
which has imported torch, Triton and pytest once, but never slotmap.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import slotmap

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    path: str  # inside the slotmap package
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments, relative to the repository root


WINDOW_PROPERTY = "tests/test_slot_mapping_properties.py::test_window_kernel_matches_oracle"
TOKEN_HAND = "tests/test_token_grid.py::test_hand_case"
PARITY = "tests/test_group_parity.py"

MUTANTS = {
    # (a) The window without its + 1: a tile that starts mid-block spans one block more than
    # its length covers. The validator shares window_size, so it now rejects valid batches.
    "window-without-plus-one": Mutant(
        "layout.py",
        "return next_power_of_2(cdiv(tile_size, block_size) + 1)",
        "return next_power_of_2(cdiv(tile_size, block_size))",
        (
            "tests/test_window.py::test_tile_starting_mid_block",
            "tests/test_hand_cases.py::test_hand_case[4-requests-1k-to-8k-b16-window]",
        ),
    ),
    # (b) Floor where C truncation and a guard are meant: a circular branch that wraps
    # negative positions Python-style, ((p % b) + b) % b, and gives the padded tail a slot.
    "circular-wraps-negative-positions": Mutant(
        "kernels/common.py",
        "        has_slot = pos >= 0\n"
        "        block_indices = tl.zeros_like(pos)\n"
        "        slot_offsets = tl.where(has_slot, pos, 0) % block_size\n",
        "        has_slot = pos == pos\n"
        "        block_indices = tl.zeros_like(pos)\n"
        "        slot_offsets = ((pos % block_size) + block_size) % block_size\n",
        (
            "tests/test_hand_cases.py::test_hand_case[circular-negative-window]",
            f"{WINDOW_PROPERTY}[circular]",
        ),
    ),
    # (b') Floor where ceiling is meant: the validator counts a request's tiles with floor
    # division, so short requests share tile numbers and valid batches are rejected.
    "validator-counts-tiles-with-floor": Mutant(
        "validate.py",
        "tiles_per_request = (lengths + tile_size - 1) // tile_size",
        "tiles_per_request = lengths // tile_size",
        (
            "tests/test_window.py::test_contiguous_positions_always_pass_the_precondition",
            f"{WINDOW_PROPERTY}[plain]",
        ),
    ),
    # (c) A missing mask: the min-reduction also sees lanes past the request's end (loaded
    # as position 0), so a partial tile's window starts at block 0, not at its own blocks.
    "min-reduction-without-valid-mask": Mutant(
        "kernels/common.py",
        "block_idx_base = tl.min(tl.where(valid, block_indices, INT32_MAX_SENTINEL), axis=0)",
        "block_idx_base = tl.min(block_indices, axis=0)",
        (
            "tests/test_hand_cases.py::test_hand_case[cp-w2-r0-i2-kv128-b32-window-tile16]",
            f"{WINDOW_PROPERTY}[plain]",
        ),
    ),
    # (c') A missing mask: the store writes whole tiles, past the request and past the output.
    # Only the guard band around ``out`` sees it when the overflow is past the output.
    "store-without-mask": Mutant(
        "kernels/slot_mapping.py",
        "tl.store(slot_mapping_ptr + offsets, slot_ids, mask=mask)",
        "tl.store(slot_mapping_ptr + offsets, slot_ids)",
        ("tests/test_hand_cases.py::test_hand_case[doc-example-window-tile16]",),
    ),
    # (d) A forgotten padding program: it returns without filling [num_tokens, max_num_tokens).
    "padding-program-forgets-to-fill": Mutant(
        "kernels/slot_mapping.py",
        "        _pad_outside_requests(\n"
        "            slot_mapping_ptr,\n"
        "            query_start_loc_ptr,\n"
        "            req_idx,\n"
        "            num_tokens,\n"
        "            max_num_tokens,\n"
        "            part,\n"
        "            parallel_tiles,\n"
        "            PAD_ID,\n"
        "            TILE_BLOCK_SIZE,\n"
        "        )\n"
        "        return\n",
        "        return\n",
        ("tests/test_hand_cases.py::test_hand_case[padding-tail-window]",),
    ),
    # (e) The token grid's guess checked by the guessed requests' ends alone: an empty
    # request whose start lies past the tile's first token looks right (qsl 0 2 3 3 4 5).
    "token-guess-without-start-check": Mutant(
        "kernels/token_grid.py",
        "likely = (start == tile_start) & (stop == tile_start + n)",
        "likely = stop == tile_start + n",
        (f"{TOKEN_HAND}[direct-empty-request-under-a-right-looking-guess]",),
    ),
    # (f) One request for the tile when a request ends at its last token (< for <=).
    "token-tile-one-request-off-by-one": Mutant(
        "kernels/token_grid.py",
        "packed = tl.where(ends <= tile_start, 1, tl.where(ends <= last, 1 << 16, 0))",
        "packed = tl.where(ends <= tile_start, 1, tl.where(ends < last, 1 << 16, 0))",
        (f"{TOKEN_HAND}[direct-end-at-tiles-last-token]",),
    ),
    # (g) The histogram's last bin keeps the ends past the tile: the last lane counts them.
    "token-histogram-keeps-ends-past-the-tile": Mutant(
        "kernels/token_grid.py",
        "return req_idx - tl.where(lane == TILE_BLOCK_SIZE - 1, past_count, 0)",
        "return req_idx",
        (f"{TOKEN_HAND}[fused-ends-past-the-tile]",),
    ),
    # (h) Padding programs that start at num_tokens, not after the last token tile: they
    # stop short of max_num_tokens by the last token tile's masked lanes.
    "token-padding-starts-at-num-tokens": Mutant(
        "kernels/token_grid.py",
        "first = token_tiles * TILE_BLOCK_SIZE + (tile_idx - token_tiles) * PAD_TILE_SIZE",
        "first = num_tokens + (tile_idx - token_tiles) * PAD_TILE_SIZE",
        (f"{TOKEN_HAND}[direct-padding-programs-end-at-the-output]",),
    ),
    # (i) The likely decode run trusted on its two scalar checks, its lanes' ends unchecked.
    "token-likely-guess-trusted-unchecked": Mutant(
        "kernels/token_grid.py",
        "return likely & tl.min(lane_ok.to(tl.int32), 0)  # 1: right",
        "return likely  # 1: right",
        (f"{TOKEN_HAND}[fused-likely-run-hiding-a-two-token-request-early-ends]",),
    ),
    # (j) The sampled request trusted for a tile in the batch's middle, whose request's end
    # the sample lacks: the count misses the middle ends.
    "token-sample-trusted-in-the-middle": Mutant(
        "kernels/token_grid.py",
        "settled = sampled_end & (req < num_reqs) & ((counts >> 16) == 0)",
        "settled = (req < num_reqs) & ((counts >> 16) == 0)",
        (f"{TOKEN_HAND}[direct-decode-both-ends]",),
    ),
    # (k) The middle ends counted only once the back half's first end lies before the tile
    # (< for <=): exact still (the histogram takes over), but the last requests' tiles lose
    # their fast path, which only the sampled answer's own test sees.
    "token-sample-back-half-off-by-one": Mutant(
        "kernels/token_grid.py",
        "req = (counts & 0xFFFF) + tl.where(back_first <= tile_start, middle, 0)",
        "req = (counts & 0xFFFF) + tl.where(back_first < tile_start, middle, 0)",
        ("tests/test_token_grid.py::test_sampled_request_is_exact_where_it_settles",),
    ),
    # (l) The fused request grid's per-lane load (the GPU's) from the table's first row,
    # whatever the request.
    "fused-lanes-forget-the-row": Mutant(
        "kernels/fused_groups.py",
        "block_numbers = tl.load(block_table_row_ptr + block_indices, mask=in_row, other=0)",
        "block_numbers = tl.load(block_table_ptr + block_indices, mask=in_row, other=0)",
        ("tests/test_hand_cases.py::test_hand_case[two-requests-shuffled-fused-lanes-tile16]",),
    ),
    # (m) A disabled group that still reads its row: its poisoned table's entries come out.
    "fused-disabled-group-reads-its-row": Mutant(
        "kernels/fused_groups.py",
        "    if (is_enabled == 0) | (row_idx < 0) | (row_idx >= num_rows):",
        "    if (row_idx < 0) | (row_idx >= num_rows):",
        (f"{PARITY}::test_disabled_group_never_reads_its_poisoned_table[fused-window]",),
    ),
    # (m') The same on the token grid.
    "fused-token-grid-disabled-group-reads-its-row": Mutant(
        "kernels/fused_groups.py",
        "    if is_enabled == 0:\n        # A disabled group: PAD_ID, no block-table address.",
        "    if False:\n        # A disabled group: PAD_ID, no block-table address.",
        (f"{PARITY}::test_disabled_group_never_reads_its_poisoned_table[fused-token-grid]",),
    ),
    # (n) Context parallelism applied to every group: the unsharded sliding window's tokens
    # get another rank's packed positions, or PAD.
    "fused-cp-on-an-unsharded-group": Mutant(
        "kernels/fused_groups.py",
        "                int(layout.cp_world_size > 1),",
        "                int(True),",
        (f"{PARITY}::test_hybrid_model_three_kinds_of_group[0-expected0-fused-window]",),
    ),
    # (o) Padding from the host's (padded) count: the gap after the real tokens keeps an
    # earlier chunk's slots.
    "fused-pads-from-the-host-count": Mutant(
        "kernels/slot_mapping.py",
        "tail = _real_token_count(query_start_loc_ptr, num_reqs, num_tokens) + part * TILE_BLOCK",
        "tail = num_tokens + part * TILE_BLOCK",
        (f"{PARITY}::test_padding_starts_at_the_real_token_count[False-fused-window]",),
    ),
    # (o') The same on the token grid, whose lanes past the real count must get PAD_ID.
    "fused-token-grid-pads-from-the-host-count": Mutant(
        "kernels/fused_groups.py",
        "    mask = mask & real\n",
        "",
        (f"{PARITY}::test_padding_starts_at_the_real_token_count[False-fused-token-grid]",),
    ),
    # (p) A dummy request (idx_mapping -1) that reads "row -1": the poisoned row before the
    # table.
    "fused-dummy-request-reads-row-minus-one": Mutant(
        "kernels/fused_groups.py",
        "    if (is_enabled == 0) | (row_idx < 0) | (row_idx >= num_rows):",
        "    if (is_enabled == 0) | (row_idx >= num_rows):",
        (f"{PARITY}::test_dummy_request_gets_pad_and_reads_no_row[fused-window]",),
    ),
    # (p') The same on the token grid, whose lanes check their own rows.
    "token-grid-dummy-request-reads-row-minus-one": Mutant(
        "kernels/token_grid.py",
        "        row_ok = (row_idx >= 0) & (row_idx < num_rows)",
        "        row_ok = row_idx < num_rows",
        (f"{PARITY}::test_dummy_request_gets_pad_and_reads_no_row[fused-token-grid]",),
    ),
    # (q) The token grid reads a lane's idx_mapping entry only where its block lies inside the
    # row: a dummy request's stale position past the row then reads "row 0" and gets a slot
    # in physical block 0 (vLLM writes -1).
    "token-grid-dummy-past-its-row-reads-row-0": Mutant(
        "kernels/token_grid.py",
        "row_idx = tl.load(idx_mapping_ptr + req_idx, mask=req_idx < num_reqs, other=0)",
        "row_idx = tl.load(idx_mapping_ptr + req_idx, mask=in_batch, other=0)",
        (
            "tests/test_hand_cases.py::test_dummy_request_with_a_stale_position_past_its_row"
            "[fused-token-grid-int32-unvalidated]",
        ),
    ),
}


def copy_project(destination: Path) -> Path:
    """slotmap and tests, copied; returns the package directory."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    shutil.copytree(ROOT / "slotmap", destination / "slotmap", ignore=ignore)
    shutil.copytree(ROOT / "tests", destination / "tests", ignore=ignore)
    return destination / "slotmap"


def mutate(package: Path, mutant: Mutant) -> None:
    target = package / mutant.path
    source = target.read_text()
    count = source.count(mutant.old)
    assert count == 1, f"{mutant.path}: the mutant's pattern occurs {count} times, not once"
    target.write_text(source.replace(mutant.old, mutant.new))


@dataclass(frozen=True)
class Done:
    returncode: int
    output: str  # the job's stdout and stderr


class MutantRunner:
    """``tests/mutant_runner.py``, started on first use and again after a timeout killed it."""

    TIMEOUT_S = 300

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None

    def run(self, project: Path, tests: tuple[str, ...]) -> Done:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "mutant_runner.py")],
                env=runner_environment(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,  # a timeout kills the runner and the job it forked
            )
        log = project / "pytest.log"
        args = ["-x", "-q", "-p", "no:cacheprovider", *tests]
        job = {"cwd": str(project), "env": job_environment(project), "args": args, "log": str(log)}
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], self.TIMEOUT_S)
        if not ready:
            self.stop()
            raise TimeoutError(f"{tests} took more than {self.TIMEOUT_S} s")
        answer = self.process.stdout.readline()
        assert answer, f"the mutant runner died (exit {self.process.wait()})"
        return Done(json.loads(answer), log.read_text())

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def runner_environment() -> dict[str, str]:
    """This run's environment without pytest's and Triton's variables, with its backend. On the
    CPU, TRITON_INTERPRET=1 as slotmap would set it: the runner imports Triton before slotmap."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    env.update(SLOTMAP_BACKEND=slotmap.BACKEND.name, HYPOTHESIS_PROFILE="mutants")
    if slotmap.BACKEND.interpreted:
        env["TRITON_INTERPRET"] = "1"
    return env


def job_environment(project: Path) -> dict[str, str]:
    return dict(
        runner_environment(),
        PYTHONPATH=str(project),
        SLOTMAP_TEST_EXPECT_PACKAGE=str(project / "slotmap"),
    )


@pytest.fixture(scope="session")  # one runner per xdist worker, not one group of tests
def runner() -> Iterator[MutantRunner]:
    started = MutantRunner()
    yield started
    started.stop()


def test_every_mutant_pattern_occurs_once() -> None:
    # Cheap, in-process: a refactor that moves a pattern is reported here first.
    for name, mutant in MUTANTS.items():
        count = (ROOT / "slotmap" / mutant.path).read_text().count(mutant.old)
        assert count == 1, f"{name}: pattern occurs {count} times in {mutant.path}"


def test_control_passes_on_unmutated_copy(tmp_path: Path, runner: MutantRunner) -> None:
    copy_project(tmp_path)
    subset = tuple(dict.fromkeys(t for m in MUTANTS.values() for t in m.tests))
    done = runner.run(tmp_path, subset)
    assert done.returncode == 0, f"control failed:\n{done.output[-6000:]}"


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in MUTANTS])
def test_suite_catches_mutant(name: str, tmp_path: Path, runner: MutantRunner) -> None:
    mutant = MUTANTS[name]
    mutate(copy_project(tmp_path), mutant)
    done = runner.run(tmp_path, mutant.tests)
    # Exit status 1: tests ran and failed (not 2-5: interrupted, internal or collection errors,
    # and not a crash of the interpreter).
    assert done.returncode == 1, (
        f"mutant {name} survived or broke the run (exit {done.returncode}):\n{done.output[-6000:]}"
    )
    assert "failed" in done.output
