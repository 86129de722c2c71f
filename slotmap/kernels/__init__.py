"""The Triton kernels and their launchers (one job per file).

Taught (the lessons print them): ``common.py`` (the shared ``@triton.jit`` helpers),
``slot_mapping.py`` (production's window kernel), ``direct.py``, ``fused_groups.py`` and
``replay.py``. Not taught: ``token_grid.py`` (the direct kernels' GPU grid) and ``launch.py``
(launch policy, checks and the plan cache).
"""

from slotmap import backend  # noqa: F401 - chooses the backend before any kernel is decorated
from slotmap.kernels.direct import _compute_slot_mapping_direct_kernel, compute_slot_mapping_direct
from slotmap.kernels.fused_groups import (
    _compute_slot_mappings_kernel,
    choose_tiling,
    compute_slot_mappings,
)
from slotmap.kernels.replay import _pad_replayed_slots_kernel, pad_replayed_slots
from slotmap.kernels.slot_mapping import _compute_slot_mapping_kernel, compute_slot_mapping

__all__ = [
    "_compute_slot_mapping_direct_kernel",
    "_compute_slot_mapping_kernel",
    "_compute_slot_mappings_kernel",
    "_pad_replayed_slots_kernel",
    "choose_tiling",
    "compute_slot_mapping",
    "compute_slot_mapping_direct",
    "compute_slot_mappings",
    "pad_replayed_slots",
]
