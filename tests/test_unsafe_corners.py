"""The launchers' last unsafe corners: each case here once wrote outside its output, read
outside its inputs, crashed the process or returned wrong slots without a word.

* the hot path's plan cache recognises a tensor object *and* its geometry, so an output
  shrunk in place (``set_``, ``resize_``, ``.data``) goes back through the full checks;
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import DEVICE, GUARD, POISON, Guarded, tensor

import slotmap


def small_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Request 0 = positions 0..3, request 1 = positions 8..13; block 4, rows of 4 blocks."""
    return (
        tensor([0, 4, 10], torch.int32),
        tensor([0, 1, 2, 3, 8, 9, 10, 11, 12, 13], torch.int64),
        tensor([[1, 2, 3, 4], [5, 6, 7, 8]], torch.int32),
        4,
    )


EXPECTED = [4, 5, 6, 7, 28, 29, 30, 31, 32, 33]

# ---------------------------------------------------------------------------------------------
# Item 8: the hot path after a tensor object changed under it
# ---------------------------------------------------------------------------------------------
HOT_LAUNCHERS: dict[str, Callable[..., torch.Tensor]] = {
    "window": slotmap.compute_slot_mapping,
    "direct-requests": lambda *a, **k: slotmap.compute_slot_mapping_direct(
        *a, token_parallel=False, **k
    ),
    "direct-tokens": lambda *a, **k: slotmap.compute_slot_mapping_direct(
        *a, token_parallel=True, **k
    ),
}


def _shrink_out(guarded: Guarded, inputs: list) -> None:
    # The same object now views 2 elements at the start of the old output.
    guarded.out.set_(guarded.buffer.untyped_storage(), GUARD, (2,), (1,))


def _resize_out(guarded: Guarded, inputs: list) -> None:
    guarded.out.resize_(2)


def _retype_out(guarded: Guarded, inputs: list) -> None:
    # int8: the kernel's int32 stores would run four times past its end.
    guarded.out.data = torch.zeros(10, dtype=torch.int8, device=DEVICE)


def _stride_out(guarded: Guarded, inputs: list) -> None:
    # Same 10 elements, stride 0: they all sit on one element of memory.
    guarded.out.set_(guarded.buffer.untyped_storage(), GUARD, (10,), (0,))


def _resize_positions(guarded: Guarded, inputs: list) -> None:
    inputs[1].resize_(4)  # the kernel would read 6 positions past its end


def _reshape_block_table(guarded: Guarded, inputs: list) -> None:
    # Same elements, one row: row 1 would be read past the table's end.
    table = inputs[2]
    table.set_(table.untyped_storage(), 0, (1, 8), (8, 1))


MUTATIONS: dict[str, tuple[Callable[[Guarded, list], None], str]] = {
    "out-set-to-2-elements": (_shrink_out, r"out has shape \(2,\), expected \(10,\)"),
    "out-resized-to-2": (_resize_out, r"out has shape \(2,\), expected \(10,\)"),
    "out-retyped-int8": (_retype_out, r"out must be int32 or int64, got int8"),
    "out-stride-0": (_stride_out, r"out must be contiguous"),
    "positions-resized": (_resize_positions, r"too few positions: 4 for 10 tokens"),
    "block-table-reshaped": (_reshape_block_table, r"2 requests but the block table has only 1"),
}


@pytest.mark.parametrize("launcher_name", list(HOT_LAUNCHERS))
@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_hot_path_sees_a_tensor_changed_in_place(launcher_name: str, mutation: str) -> None:
    launcher = HOT_LAUNCHERS[launcher_name]
    inputs = list(small_batch())
    guarded = Guarded(10)
    hot: dict[str, Any] = dict(num_tokens=10, max_num_tokens=10, validate=False, tile_size=16)
    for _ in range(2):  # the second call takes the cached plan with the same objects
        assert launcher(*inputs, out=guarded.out, **hot).cpu().tolist() == EXPECTED
    guarded.check()
    change, message = MUTATIONS[mutation]
    guarded.buffer.fill_(POISON)
    change(guarded, inputs)
    with pytest.raises(ValueError, match=message):
        launcher(*inputs, out=guarded.out, **hot)
    assert torch.all(guarded.buffer.cpu() == POISON), "the launch wrote after a failed check"


# ---------------------------------------------------------------------------------------------
# Item 9: the fused kernels with an unvalidated idx_mapping
# ---------------------------------------------------------------------------------------------
FUSED_GRIDS: dict[str, dict[str, Any]] = {
    "window": dict(token_parallel=False, lane_loads=False),
    "lanes": dict(token_parallel=False, lane_loads=True),
    "tokens": dict(token_parallel=True),
}


@pytest.mark.parametrize("grid", list(FUSED_GRIDS))
@pytest.mark.parametrize("row", [2, 3, 10**6, -1, -(10**6), 2**31 - 1, -(2**31)])
def test_unvalidated_idx_mapping_outside_the_tables_reads_nothing(grid: str, row: int) -> None:
    # Request 1's row does not exist in the smaller table (2 rows; the other has 3): its
    # tokens get PAD_ID in every group, request 0 keeps its slots, nothing else is touched.
    qsl, positions, table, _ = small_batch()
    bigger = tensor([list(range(20, 28)), list(range(30, 38)), list(range(40, 48))], torch.int32)
    guarded = Guarded((2, 12))
    slotmap.compute_slot_mappings(
        qsl, positions, [table, bigger], [4, 2], idx_mapping=tensor([0, row], torch.int32),
        num_tokens=10, max_num_tokens=12, out=guarded.out, validate=False, tile_size=16,
        **FUSED_GRIDS[grid],
    )  # fmt: skip
    pad = slotmap.PAD_SLOT_ID
    assert guarded.check().cpu().tolist() == [
        [4, 5, 6, 7] + [pad] * 8,
        [40, 41, 42, 43] + [pad] * 8,
    ]


def test_a_table_of_no_rows_is_named_even_unvalidated() -> None:
    qsl, positions, table, _ = small_batch()
    empty = torch.empty(0, 4, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"2 requests but a block table has 0 rows"):
        slotmap.compute_slot_mappings(
            qsl, positions, [table, empty], [4, 4], idx_mapping=tensor([0, 1], torch.int32),
            num_tokens=10, validate=False,
        )  # fmt: skip
