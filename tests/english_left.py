"""The English words a Chinese text should not have left: what the figure, widget and
bad-input tests look for in the course's Chinese (no widget or plotting library needed)."""

from __future__ import annotations

import re

# Words a Chinese figure keeps in English: the glossary's (token, rank, tile, batch, program,
# attention, world size, Triton, CUDA Graph, ...), the lane, chunk and full attention the
# lessons' Chinese keeps, names (Python, C, Mamba, gloo) and the letters of the lessons' math.
KEPT = set(
    "token rank tile gather batch program lane chunk full head attention world size stride hybrid "
    "Triton Python C CUDA Graph graph eager NPU KV kv PAD lse pid mod inf exp max Mamba out "
    "gloo nccl hccl cpu cuda npu vb vo lo".split()
)


def english_words(text: str, kept: set[str]) -> list[str]:
    """The English words of ``text`` a translation should have translated: not an identifier
    (``slot_mapping``, ``table0``, ``slotmap.pad_replayed_slots``, ``ValueError``), not a call
    or an index (``cdiv(``, ``ring[q]``), not an operand of the math (``vb·2 + lo // 4``,
    ``kv_cache_block_size % interleave != 0``), not a single letter, not a kept word."""
    found = []
    for match in re.finditer(r"[A-Za-z_][A-Za-z0-9_.]*", text):
        word = match.group().strip(".")
        before = text[: match.start()].rstrip()[-1:]
        after = text[match.end() :].lstrip()[:1]
        if (
            "_" in word
            or "." in word
            or re.search(r"\d|[a-z][A-Z]", word)
            or text[match.end() : match.end() + 1] in ("(", "[")
            or (before and before in "%/*=+<>!·")
            or (after and after in "%/*=+<>!·")
        ):
            continue
        if len(word) > 1 and word not in kept:
            found.append(word)
    return found
