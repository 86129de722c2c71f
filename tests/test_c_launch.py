"""The launchers' C launch (``kernels/launch.py``'s ``fast_launch`` over ``kernels/c_launch.py``):
on a GPU with a verified Triton, a repeated launch takes Triton's C launcher with the variant
Triton's own key chooses, for every pattern of aligned pointers and specialised integers; its
output is the JIT path's and the oracle's. Elsewhere every launch takes ``kernel[grid](...)``."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

import slotmap
from slotmap.kernels import c_launch, launch

needs_cuda = pytest.mark.skipif(slotmap.BACKEND.name != "cuda", reason="needs a CUDA device")
POISON = -999


def test_the_launchers_take_the_jit_where_the_c_launch_does_not_run() -> None:
    assert launch.C_LAUNCH is c_launch.supported()
    if not launch.C_LAUNCH:
        plan = launch.Plan(None, (1,), {})
        assert launch.fast_launch(plan, (1,)) is False and plan.launches == {}


def offset(tensor: torch.Tensor, elements: int) -> torch.Tensor:
    """The same values, starting ``elements`` into a fresh buffer (its address moves)."""
    buffer = torch.zeros(tensor.numel() + elements, dtype=tensor.dtype, device=tensor.device)
    view = buffer[elements:].view(tensor.shape) if tensor.dim() == 1 else None
    if view is None:
        flat = buffer[elements:]
        view = flat.view(tensor.shape)
    view.copy_(tensor)
    return view


LAUNCHERS = {
    "window": slotmap.compute_slot_mapping,
    "direct": slotmap.compute_slot_mapping_direct,
}


def cases():
    # Two batches (a decode one and a mixed one: different grids and variants), block sizes
    # 1 (a constexpr under Triton's rule), 5 and 16 (divisible by 16), tables of one column
    # (stride 1) and wider.
    for lengths in ((1, 1, 1), (5, 1, 9)):
        for block_size in (1, 5, 16):
            for width in (1, 4, 16):
                reach = block_size * width
                if max(lengths) > reach:
                    continue  # positions within a request are distinct
                starts, positions = [0], []
                for i, n in enumerate(lengths):
                    starts.append(starts[-1] + n)
                    first = i % (reach - n + 1)
                    positions += range(first, first + n)
                rows = len(lengths)
                table = torch.randperm(rows * width + 3)[: rows * width].view(rows, width)
                yield (
                    torch.tensor(starts, dtype=torch.int32, device=DEVICE),
                    torch.tensor(positions, dtype=torch.int64, device=DEVICE),
                    table.to(torch.int32).to(DEVICE),
                    block_size,
                )


def launch_once(name, q, p, table, block_size, n, m, out) -> None:
    if name == "fused":
        slotmap.compute_slot_mappings(
            q,
            p,
            [table],
            [block_size],
            num_tokens=n,
            max_num_tokens=m,
            out=out.view(1, m),
            validate=False,
        )
    else:
        LAUNCHERS[name](
            q, p, table, block_size, num_tokens=n, max_num_tokens=m, out=out, validate=False
        )


@needs_cuda
@pytest.mark.parametrize("name", ["window", "direct", "fused"])
def test_a_repeated_launch_takes_tritons_variant_through_the_c_launcher(name, monkeypatch):
    """Each case three times (the JIT compiles, then the C launch) and once more through the
    JIT alone: every launch ran the compiled variant the JIT's own lookup returns."""
    import triton

    launched = []
    jit_run = triton.runtime.jit.JITFunction.run
    c_call = c_launch.CLaunch.__call__

    def run(self, *args, **kwargs):
        launched.append(("jit", jit_run(self, *args, **kwargs)))
        return launched[-1][1]

    def call(self, *args):
        launched.append(("c", self.compiled))
        return c_call(self, *args)

    monkeypatch.setattr(triton.runtime.jit.JITFunction, "run", run)
    monkeypatch.setattr(c_launch.CLaunch, "__call__", call)
    c_launches, variants = 0, set()
    for qsl, positions, table, block_size in cases():
        n = int(positions.numel())
        m = n + 3
        want = slotmap.slot_mapping_oracle(qsl, positions, table, block_size, max_num_tokens=m)
        for shift in (0, 1):  # 16-byte aligned, then 4 or 8 bytes in
            q, p = offset(qsl, shift), offset(positions, shift)
            out = offset(torch.empty(m, dtype=torch.int32, device=DEVICE), shift)
            launched.clear()
            for c_on in (True, True, True, False):
                monkeypatch.setattr(launch, "C_LAUNCH", c_on)
                out.fill_(POISON)
                launch_once(name, q, p, table, block_size, n, m, out)
                torch.cuda.synchronize()
                assert out.cpu().tolist() == want.tolist(), (name, block_size, shift, c_on)
            ways = [way for way, _ in launched]
            assert ways[-1] == "jit" and ways[1:3] == ["c", "c"], ways
            assert len({id(compiled) for _, compiled in launched}) == 1, (block_size, shift)
            c_launches += 2
            variants.add(id(launched[-1][1]))
    assert c_launches and len(variants) >= 4  # alignment and integers chose variants
