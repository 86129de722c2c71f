"""The Triton kernels and their launchers (one job per file)."""

from slotmap.kernels.direct import _compute_slot_mapping_direct_kernel, compute_slot_mapping_direct
from slotmap.kernels.slot_mapping import _compute_slot_mapping_kernel, compute_slot_mapping

__all__ = [
    "_compute_slot_mapping_direct_kernel",
    "_compute_slot_mapping_kernel",
    "compute_slot_mapping",
    "compute_slot_mapping_direct",
]
