"""``validate=False`` on junk contents (docs/semantics.md §5): whatever int32 query_start_loc,
int64 positions, int32 block tables and int32 or int64 idx_mapping hold, every launcher, grid
and knob writes every element of ``out`` and nothing outside it, and the process survives.

The fuzz runs in a process of its own (tests/junk_fuzz.py): a kernel that reads or writes
where it must not can kill its process (SIGSEGV under the interpreter; an illegal memory
access on a GPU kills the CUDA context and every later launch), and that must fail one test,
not end the run. On the CPU a few hundred small batches; on a GPU (skipped elsewhere) 1,200
batches in each of three seeds, with the GPU's default tiles and long padding tails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import Guarded, tensor

import slotmap

FUZZ = Path(__file__).with_name("junk_fuzz.py")


def run_fuzz(examples: int, seed: int, size: str, tmp_path: Path, timeout: int) -> None:
    trace = tmp_path / "batch"
    env = dict(os.environ, SLOTMAP_BACKEND=slotmap.BACKEND.name, SLOTMAP_QUIET="1")
    if slotmap.BACKEND.interpreted:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run(
        [sys.executable, str(FUZZ), str(examples), str(seed), size, str(trace)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        batch = trace.read_text() if trace.exists() else "(none yet)"
        pytest.fail(f"the fuzz process died of {name} launching {batch}\n{done.stderr[-3000:]}")
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    assert f"{examples} batches held" in done.stdout


@pytest.mark.skipif(not slotmap.BACKEND.interpreted, reason="the GPU runs the larger fuzz")
def test_junk_contents_never_crash_or_write_outside_out_on_the_cpu(tmp_path: Path) -> None:
    run_fuzz(150, 0, "small", tmp_path, timeout=1500)


@pytest.mark.skipif(slotmap.BACKEND.name != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_junk_contents_never_crash_or_write_outside_out_on_the_gpu(
    tmp_path: Path, seed: int
) -> None:
    run_fuzz(1200, seed, "big", tmp_path, timeout=1800)


# The request grids, where a token belongs to the request whose span holds it (a token grid
# finds each token's request by counting request ends, so it maps every token itself). These
# batches crashed nothing before, so they run in-process; the report's crashing batches run
# first in the fuzz process above.
LAUNCHERS = {
    "window": lambda *a, **k: slotmap.compute_slot_mapping(*a, **k),
    "direct": lambda *a, **k: slotmap.compute_slot_mapping_direct(*a, token_parallel=False, **k),
    "fused": lambda *a, **k: _fused(*a, token_parallel=False, lane_loads=False, **k),
    "fused-lanes": lambda *a, **k: _fused(*a, token_parallel=False, lane_loads=True, **k),
}


def _fused(qsl, positions, table, block_size, *, out, **options):
    slotmap.compute_slot_mappings(qsl, positions, [table], [block_size], out=out[None], **options)
    return out


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
@pytest.mark.parametrize(
    "qsl",
    [[3, 4, 10], [0, 4, 6], [5, 2, 1], [9, 9, 9], [-4, -2, -1]],
    ids=str,
)
def test_tokens_no_request_holds_are_padded(qsl, launcher: str) -> None:
    # Unvalidated, tokens before the first request's start or after the last request's end
    # belong to no request: they get PAD, not whatever the buffer held.
    guarded = Guarded(12)
    out = LAUNCHERS[launcher](
        tensor(qsl, torch.int32),
        tensor(list(range(10)), torch.int64),
        tensor([[1, 2, 3, 4], [5, 6, 7, 8]], torch.int32),
        4,
        out=guarded.out,
        num_tokens=10,
        max_num_tokens=12,
        validate=False,
        tile_size=16,
    )
    guarded.check()
    start, end = min(max(qsl[0], 0), 10), max(min(max(v, 0), 10) for v in qsl)
    outside = [t for t in range(12) if not start <= t < end]
    assert all(int(out[t]) == slotmap.PAD_SLOT_ID for t in outside), out.tolist()
