"""The launchers' last unsafe corners: each case here once wrote outside its output, read
outside its inputs, crashed the process or returned wrong slots without a word.

* the hot path's plan cache recognises a tensor object *and* its geometry, so an output
  shrunk in place (``set_``, ``resize_``, ``.data``) goes back through the full checks;
* the fused kernels read no block-table row outside the tables for an unvalidated
  ``idx_mapping`` entry (its tokens get PAD_ID);
* integer arguments are ints (numpy integers too) that fit int32, ``pad_id`` is negative,
  tensor arguments are tensors, each named when it is not;
* ``cp.five_steps`` names a size below 1;
* a position held twice by one request is named; legal repeats stay accepted.

(Paged attention's unvalidated lengths and NaN propagation are in test_attention.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import DEVICE, GUARD, POISON, Guarded, tensor

import slotmap
from slotmap.attention import reshape_and_cache


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
        qsl,
        positions,
        [table, bigger],
        [4, 2],
        idx_mapping=tensor([0, row], torch.int32),
        num_tokens=10,
        max_num_tokens=12,
        out=guarded.out,
        validate=False,
        tile_size=16,
        **FUSED_GRIDS[grid],
    )
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
            qsl,
            positions,
            [table, empty],
            [4, 4],
            idx_mapping=tensor([0, 1], torch.int32),
            num_tokens=10,
            validate=False,
        )


# ---------------------------------------------------------------------------------------------
# Items 11 and 12: integer arguments are ints that fit int32, tensors are tensors
# ---------------------------------------------------------------------------------------------
def _fused(qsl, positions, table, block_size, **options):
    return slotmap.compute_slot_mappings(qsl, positions, [table], [block_size], **options)


SLOT_MAPPERS: dict[str, Callable[..., torch.Tensor]] = {
    "oracle": slotmap.slot_mapping_oracle,
    "torch": slotmap.slot_mapping_torch,
    "window": slotmap.compute_slot_mapping,
    "direct": slotmap.compute_slot_mapping_direct,
    "fused": _fused,
}
FUSED_NAME = {"block_size": "block_sizes[0]"}  # how the fused launcher names an argument

BAD_INTEGERS: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "block-size-over-int32": ({"block_size": 2**32 + 4}, ValueError, "{} 4294967300 does not fit"),
    "max-num-tokens-over-int32": (
        {"max_num_tokens": 2**31},
        ValueError,
        "{} 2147483648 does not fit in int32",
    ),
    "num-tokens-over-int32": ({"num_tokens": 2**31}, ValueError, "{} 2147483648 does not fit"),
    "pad-id-float": ({"pad_id": 1.5}, TypeError, "{} must be an int, got float"),
    "pad-id-positive": ({"pad_id": 5}, ValueError, "{} must be negative, got 5"),
    "pad-id-zero": ({"pad_id": 0}, ValueError, "{} must be negative, got 0"),
    "pad-id-over-int32": ({"pad_id": 2**31}, ValueError, "{} 2147483648 does not fit in int32"),
    "pad-id-under-int32": ({"pad_id": -(2**31) - 1}, ValueError, "{} -2147483649 does not fit"),
    "block-size-float": ({"block_size": 4.0}, TypeError, "{} must be an int, got float"),
    "block-size-bool": ({"block_size": True}, TypeError, "{} must be an int, got bool"),
    "block-size-tensor": ({"block_size": "tensor"}, TypeError, "{} must be an int, got Tensor"),
    "cp-rank-float": ({"cp_rank": 0.0}, TypeError, "{} must be an int, got float"),
    "cp-world-bool": ({"cp_world_size": True}, TypeError, "{} must be an int, got bool"),
    "interleave-over-int32": ({"cp_interleave": 2**40}, ValueError, "{} 1099511627776 does"),
    "tile-size-float": ({"tile_size": 16.0}, TypeError, "{} must be an int, got float"),
    "num-warps-float": ({"num_warps": 4.0}, TypeError, "{} must be an int, got float"),
    "parallel-tiles-bool": ({"parallel_tiles": True}, TypeError, "{} must be an int, got bool"),
}
LAUNCHER_ONLY = ("tile_size", "num_warps", "parallel_tiles")  # the references take none


@pytest.mark.parametrize("impl", list(SLOT_MAPPERS))
@pytest.mark.parametrize("bad", list(BAD_INTEGERS))
def test_a_bad_integer_argument_is_named(impl: str, bad: str) -> None:
    change, error, message = BAD_INTEGERS[bad]
    ((name, value),) = change.items()
    if impl in ("oracle", "torch") and name in LAUNCHER_ONLY:
        pytest.skip("the references take no launch options")
    value = torch.tensor(4, device=DEVICE) if value == "tensor" else value
    qsl, positions, table, block_size = small_batch()
    options = {name: value}
    if name == "block_size":
        block_size = options.pop(name)
    shown = FUSED_NAME.get(name, name) if impl == "fused" else name
    with pytest.raises(error, match=message.format(shown).replace("[", r"\[").replace("]", r"\]")):
        SLOT_MAPPERS[impl](qsl, positions, table, block_size, **options)


@pytest.mark.parametrize("impl", ["oracle", "torch", "window", "direct"])
def test_kv_cache_block_size_0_is_not_the_default(impl: str) -> None:
    qsl, positions, table, block_size = small_batch()
    with pytest.raises(ValueError, match="kv_cache_block_size 0 must be a positive multiple"):
        SLOT_MAPPERS[impl](qsl, positions, table, block_size, kv_cache_block_size=0)


@pytest.mark.parametrize("impl", list(SLOT_MAPPERS))
@pytest.mark.parametrize("validate", [True, False])
def test_numpy_integers_are_ints(impl: str, validate: bool) -> None:
    import numpy as np

    qsl, positions, table, _ = small_batch()
    options = dict(
        num_tokens=np.int64(10),
        max_num_tokens=np.int32(12),
        cp_world_size=np.int8(1),
        cp_rank=np.int64(0),
        cp_interleave=np.uint16(1),
        pad_id=np.int64(-1),
    )
    if impl not in ("oracle", "torch"):
        options["tile_size"] = np.int64(16)
    for _ in range(2):  # the second call is the hot path's, where it has one
        out = SLOT_MAPPERS[impl](qsl, positions, table, np.int64(4), validate=validate, **options)
        assert out.cpu().view(-1).tolist() == EXPECTED + [-1, -1]


@pytest.mark.parametrize("impl", list(SLOT_MAPPERS))
@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_list_for_a_tensor_is_named(impl: str, which: int) -> None:
    inputs = list(small_batch())
    name = ("query_start_loc", "positions", "block_table")[which]
    inputs[which] = inputs[which].tolist()
    if impl == "fused" and which == 2:
        name = r"block_tables\[0\]"
    with pytest.raises(ValueError, match=rf"{name} must be a torch.Tensor, got list"):
        SLOT_MAPPERS[impl](*inputs, validate=False, num_tokens=10)


def test_hot_path_takes_no_float_equal_to_a_cached_int() -> None:
    qsl, positions, table, _ = small_batch()
    out = torch.empty(10, dtype=torch.int32, device=DEVICE)
    hot: dict[str, Any] = dict(out=out, validate=False, tile_size=16)
    for _ in range(2):
        slotmap.compute_slot_mapping(qsl, positions, table, 4, num_tokens=10, **hot)
    for block_size, num_tokens in ((4.0, 10), (4, 10.0)):
        with pytest.raises(TypeError, match="must be an int, got float"):
            slotmap.compute_slot_mapping(
                qsl, positions, table, block_size, num_tokens=num_tokens, **hot
            )


@pytest.mark.parametrize("launcher_name", list(HOT_LAUNCHERS))
@pytest.mark.parametrize("which", [0, 1, 2])
def test_hot_path_names_a_list_for_a_tensor(launcher_name: str, which: int) -> None:
    launcher = HOT_LAUNCHERS[launcher_name]
    inputs: list[Any] = list(small_batch())
    hot: dict[str, Any] = dict(num_tokens=10, validate=False, tile_size=16)
    out = torch.empty(10, dtype=torch.int32, device=DEVICE)
    for _ in range(2):  # the plan is cached and its tensors seen
        launcher(*inputs, out=out, **hot)
    name = ("query_start_loc", "positions", "block_table")[which]
    inputs[which] = inputs[which].tolist()
    with pytest.raises(ValueError, match=rf"{name} must be a torch.Tensor, got list"):
        launcher(*inputs, out=out, **hot)


REPLAY_BAD: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "window-float": ({"window": 3.0}, TypeError, "window must be an int, got float"),
    "window-over-int32": ({"window": 2**31}, ValueError, "window 2147483648 does not fit"),
    "pad-id-positive": ({"pad_id": 3}, ValueError, "pad_id must be negative, got 3"),
    "num-tokens-bool": ({"num_tokens": True}, TypeError, "num_tokens must be an int, got bool"),
}


@pytest.mark.parametrize(
    "replay",
    [slotmap.replay_padding_oracle, slotmap.replay_padding_torch, slotmap.pad_replayed_slots],
)
@pytest.mark.parametrize("bad", list(REPLAY_BAD))
def test_a_bad_replay_integer_is_named(replay: Callable[..., Any], bad: str) -> None:
    change, error, message = REPLAY_BAD[bad]
    qsl, positions, _, _ = small_batch()
    values: dict[str, Any] = dict(window=3)
    values.update(change)
    window = values.pop("window")
    slots = torch.zeros(2, 10, dtype=torch.int32, device=DEVICE)
    starts = tensor([2, 9], torch.int32)
    with pytest.raises(error, match=message):
        replay(slots, qsl, positions, starts, window, [True, False], **values)


@pytest.mark.parametrize("pad_id", [1.5, True, 2**31])
def test_reshape_and_cache_pad_id_is_an_int32(pad_id: Any) -> None:
    key = torch.ones(2, 1, 2, device=DEVICE)
    cache = torch.zeros(2, 2, 1, 2, device=DEVICE)
    slots = tensor([0, 1], torch.int32)
    error = ValueError if isinstance(pad_id, int) and not isinstance(pad_id, bool) else TypeError
    with pytest.raises(error, match="pad_id"):
        reshape_and_cache(key, key, cache, cache.clone(), slots, pad_id=pad_id)


# ---------------------------------------------------------------------------------------------
# Item 14: cp.five_steps names a size below 1 instead of dividing by zero
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((5, 4, 4, 0, 1), "world_size must be >= 1, got 0"),
        ((5, 0, 4, 2, 1), "block_size must be >= 1, got 0"),
        ((5, 4, 0, 2, 1), "kv_cache_block_size must be >= 1, got 0"),
        ((5, 4, 4, 2, 0), "interleave must be >= 1, got 0"),
        ((5, 4, 4, -2, 1), "world_size must be >= 1, got -2"),
        ((-1, 4, 4, 2, 1), "position must be >= 0, got -1"),
    ],
)
def test_five_steps_names_a_bad_size(args: tuple, message: str) -> None:
    from slotmap.cp import five_steps

    with pytest.raises(ValueError, match=message):
        five_steps(*args)


def test_five_steps_of_a_valid_configuration_still_answer() -> None:
    from slotmap.cp import five_steps

    steps = five_steps(13, 4, 4, 2, 2)  # V = 8: virtual block 1, offset 5, segment 2, rank 0
    assert (steps.virtual_block, steps.virtual_offset, steps.segment, steps.owner) == (1, 5, 2, 0)
    assert (steps.local_offset, steps.block, steps.offset) == (3, 1, 3)


# ---------------------------------------------------------------------------------------------
# Item 15 (issue 16, item 7): one position twice in one request would write one slot twice
# ---------------------------------------------------------------------------------------------
def _duplicate_cases() -> dict[str, tuple[dict[str, Any], str]]:
    # The batch above with token 5 moved onto token 4's position 8, then variations.
    base = [0, 1, 2, 3, 8, 8, 10, 11, 12, 13]
    far = [0, 1, 2, 3, 13, 9, 10, 11, 12, 13]
    return {
        "neighbours": ({"positions": base}, r"request 1, tokens 4 and 5: both hold position 8"),
        "far-apart": ({"positions": far}, r"request 1, tokens 4 and 9: both hold position 13"),
        "first-request": (
            {"positions": [2, 1, 2, 3, 8, 9, 10, 11, 12, 13]},
            r"request 0, tokens 0 and 2: both hold position 2",
        ),
        # Under CP the owner's two tokens collide; every rank names the batch alike.
        "cp-owner": (
            {"positions": base, "cp_world_size": 2, "cp_rank": 0},
            r"request 1, tokens 4 and 5: both hold position 8",
        ),
        "cp-not-owner": (
            {"positions": base, "cp_world_size": 2, "cp_rank": 1},
            r"request 1, tokens 4 and 5: both hold position 8",
        ),
        "circular": (
            {"positions": base, "circular": True},
            r"request 1, tokens 4 and 5: both hold position 8",
        ),
    }


DUPLICATES = _duplicate_cases()


@pytest.mark.parametrize("impl", list(SLOT_MAPPERS))
@pytest.mark.parametrize("case", list(DUPLICATES))
def test_one_position_twice_in_a_request_is_named(impl: str, case: str) -> None:
    change, message = DUPLICATES[case]
    qsl, _, table, block_size = small_batch()
    options = dict(change)
    positions = tensor(options.pop("positions"), torch.int64)
    if options.get("circular"):
        table = table[:, :1].contiguous()
    if impl == "fused" and "circular" in options:
        options["circular"] = [options["circular"]]
    with pytest.raises(ValueError, match=message):
        SLOT_MAPPERS[impl](qsl, positions, table, block_size, **options)


def test_one_position_twice_is_named_in_every_group() -> None:
    qsl, _, table, _ = small_batch()
    positions = tensor([0, 1, 2, 3, 8, 8, 10, 11, 12, 13], torch.int64)
    second = tensor([list(range(20, 28)), list(range(30, 38))], torch.int32)
    for fn in (slotmap.slot_mappings_oracle, slotmap.compute_slot_mappings):
        with pytest.raises(ValueError, match=r"group 0, request 1, tokens 4 and 5"):
            fn(qsl, positions, [table, second], [4, 2])


@pytest.mark.parametrize("impl", list(SLOT_MAPPERS))
def test_legal_repeats_stay_accepted(impl: str) -> None:
    # Two requests at the same positions sharing physical blocks (prefix caching), and a
    # circular cache's padded tail, whose negative positions have no slot and may repeat.
    qsl = tensor([0, 4, 8], torch.int32)
    positions = tensor([4, 5, 6, 7, 4, 5, 6, 7], torch.int64)
    shared = tensor([[3, 9], [3, 9]], torch.int32)
    out = SLOT_MAPPERS[impl](qsl, positions, shared, 4)
    assert out.cpu().view(-1).tolist() == [36, 37, 38, 39] * 2
    padded = tensor([-1, -1, -1, 0, -2, -2, 1, 2], torch.int64)
    ring = tensor([[5], [6]], torch.int32)
    circular: Any = [True] if impl == "fused" else True
    out = SLOT_MAPPERS[impl](qsl, padded, ring, 4, circular=circular)
    assert out.cpu().view(-1).tolist() == [-1, -1, -1, 20, -1, -1, 25, 26]


def test_a_repeat_far_apart_in_a_long_request_is_found() -> None:
    # 2**16 tokens, one request, its last token repeating its first position.
    from slotmap.layout import request_of_tokens
    from slotmap.validate import check_distinct_positions

    n = 2**16
    qsl = tensor([0, n], torch.int32)
    positions = torch.arange(n, dtype=torch.int64, device=DEVICE)
    positions[-1] = 0
    with pytest.raises(
        ValueError, match=rf"request 0, tokens 0 and {n - 1}: both hold position 0"
    ):
        check_distinct_positions(request_of_tokens(qsl, n), positions)


def test_an_unchecked_layout_is_a_whole_layout() -> None:
    # lesson 05 launches a configuration the checks refuse: every field is still there.
    from slotmap.layout import SlotLayout

    layout = SlotLayout.unchecked(2, 6, 2, 1, 4)
    assert (layout.cp_world_size, layout.cp_rank, layout.cp_interleave) == (2, 1, 4)
    assert layout.circular is False and layout.pad_id == -1 and layout.enabled is True
    assert layout.constants()["BLOCKS_PER_KV_BLOCK"] == 3
    with pytest.raises(ValueError, match="cp_interleave"):
        SlotLayout(2, 6, 2, 1, 4)


# ---------------------------------------------------------------------------------------------
# Named with validate=True: a scale that is not a finite number, a meta tensor to expand.
# ---------------------------------------------------------------------------------------------
def _paged_inputs(num_reqs: int = 2) -> tuple:
    # Two requests of 3 positions, block 2, one head of 4: valid except for what a test changes.
    query = torch.randn(num_reqs, 1, 4, device=DEVICE)
    cache = torch.randn(4, 2, 1, 4, device=DEVICE)
    table = tensor([[0, 1], [2, 3]][:num_reqs], torch.int32).reshape(num_reqs, 2)
    lens = tensor([3, 3][:num_reqs], torch.int32)
    return query, cache, cache.clone(), table, lens


@pytest.mark.parametrize("num_reqs", [2, 0], ids=["two-requests", "no-request"])
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")], ids=str)
@pytest.mark.parametrize(
    "paged",
    [slotmap.attention.paged_decode_attention, slotmap.attention.paged_decode_attention_torch],
    ids=lambda f: f.__name__,
)
def test_a_scale_that_is_not_a_finite_number_is_named(paged, scale: float, num_reqs: int) -> None:
    with pytest.raises(ValueError, match=rf"scale must be a finite number, got {scale}"):
        paged(*_paged_inputs(num_reqs), scale=scale)


@pytest.mark.parametrize("scale", ["0.5", True, torch.tensor(0.5)], ids=repr)
def test_a_scale_that_is_not_a_real_number_is_named(scale: Any) -> None:
    with pytest.raises(TypeError, match="scale must be a real number"):
        slotmap.attention.paged_decode_attention(*_paged_inputs(), scale=scale)


def test_a_finite_scale_of_any_real_type_is_taken() -> None:
    import numpy as np

    inputs, paged = _paged_inputs(), slotmap.attention.paged_decode_attention
    for scale, as_float in ((np.float32(0.5), 0.5), (np.float64(0.5), 0.5), (1, 1.0)):
        out, _ = paged(*inputs, scale=scale)
        torch.testing.assert_close(out, paged(*inputs, scale=as_float)[0])


def test_a_meta_tensor_to_expand_is_named() -> None:
    meta = torch.zeros(2, 3, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="block_table is a meta tensor"):
        slotmap.expand_block_table(meta, 2)
    with pytest.raises(ValueError, match="block_table is a meta tensor"):
        slotmap.expand_block_table(meta, 2, validate=False)


@pytest.mark.parametrize(
    "table",
    [[[1, 2]], torch.zeros(3, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.float32)],
    ids=["a-list", "1-d", "float"],
)
def test_a_table_expand_cannot_read_is_named(table: Any) -> None:
    table = table.to(DEVICE) if isinstance(table, torch.Tensor) else table
    with pytest.raises(ValueError, match="block_table must be a"):
        slotmap.expand_block_table(table, 2)
