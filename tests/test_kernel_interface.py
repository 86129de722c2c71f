"""The production kernel keeps production's interface (docs/semantics.md §3), so that a learner
recognises every parameter when reading vLLM's or vllm-ascend's kernel afterwards; and the
launchers share one signature with the reference, so either can stand in for the other."""

from __future__ import annotations

import inspect

import pytest

import slotmap
from slotmap.kernels import _compute_slot_mapping_kernel

PRODUCTION_PARAMETERS = [
    "num_tokens",
    "max_num_tokens",
    "query_start_loc_ptr",
    "positions_ptr",
    "block_table_ptr",
    "block_table_stride",
    "block_size",
    "slot_mapping_ptr",
    "KV_CACHE_BLOCK_SIZE",
    "BLOCKS_PER_KV_BLOCK",
    "TOTAL_CP_WORLD_SIZE",
    "TOTAL_CP_RANK",
    "CP_KV_CACHE_INTERLEAVE_SIZE",
    "PAD_ID",
    "TILE_BLOCK_SIZE",
    "BLOCK_TABLE_WINDOW_SIZE",
    "IS_CIRCULAR",
]


def kernel_parameters(kernel) -> list[inspect.Parameter]:
    function = kernel.fn  # the Python function under the JITFunction / InterpretedFunction
    return list(inspect.signature(function).parameters.values())


def test_production_parameters_in_production_order():
    names = [p.name for p in kernel_parameters(_compute_slot_mapping_kernel)]
    assert names[: len(PRODUCTION_PARAMETERS)] == PRODUCTION_PARAMETERS


def test_our_additions_come_after_with_defaults():
    extra = kernel_parameters(_compute_slot_mapping_kernel)[len(PRODUCTION_PARAMETERS) :]
    assert extra, "GATHER_AS_FLOAT is expected after the production parameters"
    assert all(p.default is not inspect.Parameter.empty for p in extra)


def test_runtime_sizes_are_not_specialised():
    kernel = _compute_slot_mapping_kernel
    if hasattr(kernel, "params"):  # a compiled JITFunction
        skipped = {p.name for p in kernel.params if p.do_not_specialize}
    else:  # the interpreter keeps the decorator's arguments
        skipped = set(kernel.kwargs["do_not_specialize"])
    assert {"num_tokens", "max_num_tokens"} <= skipped


# Launch tuning that the references have no use for: the tile, the programs per request,
# the grid (requests or tokens), the gather and (GPU only) the warps per program change how
# the kernel runs, never what it returns.
LAUNCHER_ONLY = {
    "tile_size",
    "gather_as_float",
    "parallel_tiles",
    "num_warps",
    "window_trace",
    "token_parallel",
    "lane_loads",
}


SINGLE_GROUP = [slotmap.slot_mapping_oracle, slotmap.slot_mapping_torch]
PAIRS = {
    "window": (slotmap.compute_slot_mapping, SINGLE_GROUP),
    "direct": (slotmap.compute_slot_mapping_direct, SINGLE_GROUP),
    "fused": (
        slotmap.compute_slot_mappings,
        [slotmap.slot_mappings_oracle, slotmap.slot_mappings_torch],
    ),
    "replay": (
        slotmap.pad_replayed_slots,
        [slotmap.replay_padding_oracle, slotmap.replay_padding_torch],
    ),
}


@pytest.mark.parametrize("launcher, references", PAIRS.values(), ids=PAIRS.keys())
def test_launcher_and_reference_share_one_signature(launcher, references):
    def shared(function):
        return [
            (p.name, p.kind, p.default)
            for p in inspect.signature(function).parameters.values()
            if p.name not in LAUNCHER_ONLY
        ]

    for reference in references:
        assert shared(launcher) == shared(reference), reference.__name__
