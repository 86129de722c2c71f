"""slotmap: how inference engines map each token's position to a KV-cache slot.

Importing it has no side effects: nothing is printed, the environment is left as it is, and
no accelerator is touched. Names load on first use; the backend is chosen when the first
kernel module loads (``slotmap.backend``). The course starts with ``import slotmap.course``,
which also names the backend and lets a learner's own ``@triton.jit`` kernels run on a CPU.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

# The launchers run the Triton kernels; the references define what they must return.
LAUNCHERS = (
    "compute_slot_mapping",
    "compute_slot_mapping_direct",
    "compute_slot_mappings",
    "pad_replayed_slots",
    "choose_tiling",
)
REFERENCES = (
    "slot_mapping_oracle",
    "slot_mapping_torch",
    "slot_mappings_oracle",
    "slot_mappings_torch",
    "replay_padding_oracle",
    "replay_padding_torch",
    "token_slot",
    "window_bases_oracle",
)
LAYOUT = ("PAD_SLOT_ID", "PRODUCTION_TILE", "SlotLayout", "expand_block_table", "window_size")
SERVING = ("SlotMapper", "GroupsMapper", "warmup")
BACKEND_NAMES = ("BACKEND", "DEVICE")

_HOMES = {
    **dict.fromkeys(LAUNCHERS, "slotmap.kernels"),
    **dict.fromkeys(REFERENCES, "slotmap.reference"),
    **dict.fromkeys(LAYOUT, "slotmap.layout"),
    **dict.fromkeys(BACKEND_NAMES, "slotmap.backend"),
    **dict.fromkeys(SERVING, "slotmap.serving"),
}

__all__ = [*LAUNCHERS, *REFERENCES, *LAYOUT, *SERVING, *BACKEND_NAMES]


def __getattr__(name: str) -> Any:
    # PEP 562: load a public name, or a submodule (``slotmap.viz``), on first use.
    home = _HOMES.get(name)
    if home is None:
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as missing:
            if missing.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
