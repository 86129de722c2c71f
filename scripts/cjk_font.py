"""Make the Chinese font the course's figures use: a subset of Noto Sans CJK SC (Regular).

    apt-get install fonts-noto-cjk       # Debian's copy of the font (SIL Open Font License 1.1)
    .venv/bin/python scripts/cjk_font.py

It writes ``slotmap/viz/fonts/NotoSansCJKsc-Regular-subset.otf``, which ``slotmap.viz.style``
registers with matplotlib, and the licence beside it. The subset holds CJK and full-width
punctuation and every character the course's Chinese uses (its translations, its runtime
messages' catalog, the glossary): a learner's machine needs no CJK font of its own, and the
repository holds about 0.5 KB a character instead of a 16 MB font (the 3,755 common hanzi of
GB 2312 level 1 alone would be 1.7 MB). ``tests/test_cjk_font.py`` fails when the course
uses a character the subset lacks: run this script again then.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
LICENCE = Path("/usr/share/doc/fonts-noto-cjk/copyright")
FAMILY = "Noto Sans CJK SC"
FONTS = ROOT / "slotmap" / "viz" / "fonts"
TARGET = FONTS / "NotoSansCJKsc-Regular-subset.otf"

# Where the course's Chinese lives: every character in them must be in the subset.
CHINESE_SOURCES = ("translations/**/*.po", "slotmap/locale/**/*.po", "docs/glossary.md")


def course_characters(root: Path = ROOT) -> set[str]:
    """Every non-ASCII character in the course's Chinese sources."""
    found = set()
    for pattern in CHINESE_SOURCES:
        for path in root.glob(pattern):
            found |= {c for c in path.read_text(encoding="utf-8") if ord(c) > 0x7F}
    return found


def wanted() -> set[str]:
    punctuation = {chr(c) for c in range(0x3000, 0x3040)}  # CJK symbols and punctuation
    punctuation |= {chr(c) for c in range(0xFF01, 0xFF5F)}  # full-width forms
    punctuation |= set("“”‘’…—·–")
    return punctuation | course_characters()


def ofl_text() -> str:
    """The SIL Open Font License 1.1, as Debian's copyright file of the font quotes it."""
    lines = LICENCE.read_text(encoding="utf-8").splitlines()
    start = lines.index("License: SIL-1.1", lines.index("License: GPL-3+")) + 1
    text = []
    for line in lines[start:]:
        if not line.startswith(" "):
            break
        text.append("" if line == " ." else line[1:])
    return "\n".join(text) + "\n"


def main() -> int:
    from fontTools import subset
    from fontTools.ttLib import TTCollection

    if not SOURCE.is_file():
        print(f"{SOURCE} is missing: apt-get install fonts-noto-cjk", file=sys.stderr)
        return 1
    collection = TTCollection(str(SOURCE))
    index = next(i for i, font in enumerate(collection) if font["name"].getDebugName(1) == FAMILY)
    options = subset.Options()  # fontTools' defaults: horizontal text, CFF subroutines kept
    options.name_IDs = ["*"]  # the copyright and licence records travel with the font
    options.notdef_outline = True
    font = collection[index]
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=sorted(ord(c) for c in wanted()))
    subsetter.subset(font)
    # Fixed timestamps: the same characters give the same file.
    font.recalcTimestamp = False
    font["head"].created = font["head"].modified = 0
    FONTS.mkdir(parents=True, exist_ok=True)
    font.save(str(TARGET), reorderTables=True)
    notice = font["name"].getDebugName(0)  # the font's own copyright line
    (FONTS / "LICENSE-NotoSansCJK.txt").write_text(
        f"{TARGET.name}: a subset of {FAMILY} Regular (scripts/cjk_font.py).\n{notice}\n\n"
        + ofl_text(),
        encoding="utf-8",
    )
    print(f"wrote {TARGET.relative_to(ROOT)}: {TARGET.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
