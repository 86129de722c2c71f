"""slotmap: how inference engines map each token's position to a KV-cache slot.

The backend is chosen first, before any Triton kernel is decorated (``slotmap.backend``).
"""

from slotmap.backend import BACKEND, DEVICE  # noqa: I001 - must run before the kernels import
import os as _os

if _os.environ.get("SLOTMAP_RECORD_LAUNCHES") and BACKEND.interpreted:
    from slotmap import launch_log as _launch_log

    _launch_log.start(_os.environ["SLOTMAP_RECORD_LAUNCHES"])
from slotmap.kernels import (
    choose_tiling,
    compute_slot_mapping,
    compute_slot_mapping_direct,
    compute_slot_mappings,
    pad_replayed_slots,
)
from slotmap.layout import PAD_SLOT_ID, PRODUCTION_TILE, expand_block_table, window_size
from slotmap.reference import (
    replay_padding_oracle,
    replay_padding_torch,
    slot_mapping_oracle,
    slot_mapping_torch,
    slot_mappings_oracle,
    slot_mappings_torch,
    token_slot,
    window_bases_oracle,
)

__version__ = "0.1.0"

__all__ = [
    "BACKEND",
    "DEVICE",
    "PAD_SLOT_ID",
    "PRODUCTION_TILE",
    "choose_tiling",
    "compute_slot_mapping",
    "compute_slot_mapping_direct",
    "compute_slot_mappings",
    "pad_replayed_slots",
    "expand_block_table",
    "replay_padding_oracle",
    "replay_padding_torch",
    "slot_mapping_oracle",
    "slot_mapping_torch",
    "slot_mappings_oracle",
    "slot_mappings_torch",
    "token_slot",
    "window_bases_oracle",
    "window_size",
]
