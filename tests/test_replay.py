"""Replay padding: ``pad_replayed_slots`` against ``replay_padding_oracle``.

A request q with ``replay_start[q] > 0`` pads positions ``[replay_start[q], + window)`` in
every prefix-cacheable group, in place; other groups and other tokens keep their slots.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import (
    DEVICE,
    GUARD,
    POISON,
    assert_slots_equal,
    multi_group_cases,
    qsl_of,
    tensor,
)
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

import slotmap

PAD = slotmap.PAD_SLOT_ID
REPLAY = {
    "oracle": lambda: slotmap.replay_padding_oracle,
    "torch": lambda: slotmap.replay_padding_torch,
    "kernel": lambda: slotmap.pad_replayed_slots,
}
IMPLEMENTATIONS = pytest.mark.parametrize(
    "impl_name", [pytest.param(name, id=name) for name in REPLAY]
)


class GuardedSlots:
    """slot_mappings holding ``values``, in the middle of a POISON-filled buffer."""

    def __init__(self, values: Tensor, dtype: torch.dtype = torch.int32) -> None:
        self.numel = values.numel()
        self.buffer = torch.full((self.numel + 2 * GUARD,), POISON, dtype=dtype, device=DEVICE)
        self.slots = self.buffer[GUARD : GUARD + self.numel].view(values.shape)
        self.slots.copy_(values)

    def check_guards(self) -> None:
        assert torch.all(self.buffer[:GUARD] == POISON), "wrote before slot_mappings"
        assert torch.all(self.buffer[GUARD + self.numel :] == POISON), "wrote after it"


def run_replay(impl, values: Tensor, *args, dtype=torch.int32, **kwargs) -> Tensor:
    guarded = GuardedSlots(values, dtype)
    result = impl(guarded.slots, *args, **kwargs)
    assert result.data_ptr() == guarded.slots.data_ptr(), "must modify slot_mappings in place"
    guarded.check_guards()
    return guarded.slots


def hand_case():
    # Request 0: positions 0..4, replay from 2 (window 2: positions 2 3).
    # Request 1: positions 3 4 5, replay_start 0: no replay, even though 3 4 5 >= 0.
    # Request 2: positions 9 7 8 (shuffled), replay from 8: positions 8 9 -> tokens 8 and 10.
    # Columns 10 and 11: past num_tokens (a padding tail), never touched.
    qsl = qsl_of([5, 3, 3])
    positions = tensor([0, 1, 2, 3, 4, 3, 4, 5, 9, 7, 8], torch.int64)
    replay_start = tensor([2, 0, 8], torch.int32)
    values = torch.arange(2 * 13, device=DEVICE).view(2, 13) + 100
    expected = values.clone().cpu()
    expected[0, [2, 3, 8, 10]] = PAD  # group 0 is prefix-cacheable, group 1 is not
    return values, (qsl, positions, replay_start, 2, [True, False]), expected


@IMPLEMENTATIONS
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_replay_by_hand(impl_name: str, dtype: torch.dtype) -> None:
    values, args, expected = hand_case()
    actual = run_replay(REPLAY[impl_name](), values, *args, dtype=dtype)
    assert_slots_equal(actual, expected, impl_name)


@IMPLEMENTATIONS
def test_replay_custom_pad_and_every_group(impl_name: str) -> None:
    values, (qsl, positions, replay_start, _, _), _ = hand_case()
    actual = run_replay(
        REPLAY[impl_name](), values, qsl, positions, replay_start, 1, [True, True], pad_id=-7
    )
    expected = values.clone().cpu()
    expected[:, [2, 10]] = -7
    assert_slots_equal(actual, expected, impl_name)


@IMPLEMENTATIONS
@pytest.mark.parametrize(
    ("window", "cacheable"),
    [
        pytest.param(0, [True, True], id="window-0"),
        pytest.param(3, [False, False], id="no-cacheable-group"),
    ],
)
def test_replay_that_changes_nothing(impl_name: str, window: int, cacheable) -> None:
    values, (qsl, positions, replay_start, _, _), _ = hand_case()
    actual = run_replay(
        REPLAY[impl_name](), values, qsl, positions, replay_start, window, cacheable
    )
    assert_slots_equal(actual, values)


@IMPLEMENTATIONS
def test_replay_without_requests(impl_name: str) -> None:
    values = torch.arange(6, device=DEVICE).view(2, 3)
    empty = tensor([], torch.int32)
    actual = run_replay(
        REPLAY[impl_name](), values, qsl_of([]), tensor([], torch.int64), empty, 4, [True, True]
    )
    assert_slots_equal(actual, values)


@st.composite
def replay_cases(draw):
    case = draw(multi_group_cases(), label="slot mappings")
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    values = slotmap.slot_mappings_oracle(*case.args(), **case.options)
    starts = case.query_start_loc.tolist()
    positions = case.positions.tolist()
    replay_start = []
    for q in range(len(starts) - 1):
        own = positions[starts[q] : starts[q + 1]]
        # replay_start is never negative (the launchers reject it): 0 means no replay.
        choices = [0, 1, max(max(own, default=0) + 1, 0)] + [p for p in own if p > 0]
        replay_start.append(rng.choice(choices))
    window = draw(st.sampled_from((0, 1, 3, 8, 40)))
    groups = len(case.block_sizes)
    cacheable = draw(st.lists(st.booleans(), min_size=groups, max_size=groups))
    args = (
        case.query_start_loc,
        case.positions,
        tensor(replay_start, torch.int32),
        window,
        cacheable,
    )
    options = {"pad_id": case.options["pad_id"]} if "pad_id" in case.options else {}
    if draw(st.booleans()):
        options["num_tokens"] = case.num_tokens
    return values, args, options


@given(replay=replay_cases(), tile=st.sampled_from((16, 32, 1024)), int64=st.booleans())
def test_kernel_matches_oracle(replay, tile: int, int64: bool) -> None:
    values, args, options = replay
    dtype = torch.int64 if int64 else torch.int32
    expected = run_replay(slotmap.replay_padding_oracle, values, *args, dtype=dtype, **options)
    actual = run_replay(
        slotmap.pad_replayed_slots, values, *args, dtype=dtype, tile_size=tile, **options
    )
    assert_slots_equal(actual, expected)


@given(replay=replay_cases())
def test_torch_reference_matches_oracle(replay) -> None:
    values, args, options = replay
    expected = run_replay(slotmap.replay_padding_oracle, values, *args, **options)
    assert_slots_equal(
        run_replay(slotmap.replay_padding_torch, values, *args, **options), expected
    )


@given(replay=replay_cases())
def test_kernel_without_validation_matches_oracle(replay) -> None:
    values, args, options = replay
    options = dict(options, num_tokens=int(args[0][-1]))
    expected = run_replay(slotmap.replay_padding_oracle, values, *args, **options)
    actual = run_replay(slotmap.pad_replayed_slots, values, *args, validate=False, **options)
    assert_slots_equal(actual, expected)
