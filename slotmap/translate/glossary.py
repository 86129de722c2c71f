"""``docs/glossary.md``'s terms, and whether a translation uses them.

The glossary's first table (under ``## Terms``) is the list the check enforces: where the
English of a translated text uses a term in its prose (code spans, code blocks, math and link
targets do not count), the translation must use that term's Chinese. Rows whose English differs
only by a qualifier in parentheses (``kernel (Triton, NPU)``, ``kernel (Jupyter)``) are one term
with several accepted translations.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "docs" / "glossary.md"
TERMS_HEADING = "## Terms"


@dataclass(frozen=True)
class Term:
    english: str  # as matched in English prose, without the qualifier: "kernel"
    chinese: tuple[str, ...]  # any one of them must appear in the translation


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    """The cells of the first table after ``heading``, header and rule left out."""
    lines = markdown.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == heading)
    except StopIteration:
        raise ValueError(f"the glossary has no {heading!r} section") from None
    rows, in_table = [], False
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            in_table = True
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif in_table:
            break
    return [row for row in rows[1:] if not set("".join(row)) <= set("-: ")]


def terms(path: Path = GLOSSARY) -> list[Term]:
    """The enforced terms, longest English first (so that a longer term is reported first)."""
    found: dict[str, list[str]] = {}
    for row in table_rows(path.read_text(encoding="utf-8"), TERMS_HEADING):
        if len(row) < 3 or not row[0] or not row[1] or not row[2]:
            raise ValueError(f"glossary row {row}: every term needs English, 中文 and a reason")
        english = re.sub(r"\s*\(.*\)\s*$", "", row[0]).strip().lower()
        found.setdefault(english, []).append(row[1])
    ordered = sorted(found, key=lambda english: (-len(english), english))
    return [Term(english, tuple(found[english])) for english in ordered]


# What prose is not: fenced code, inline code, display and inline math, link targets, HTML tags,
# and a message's {placeholders}.
# Inline code and math as Markdown reads them: a span may wrap onto the next line, never
# across a blank line (a new paragraph).
INLINE_CODE = r"`(?:[^`\n]|\n(?!\n))*`"
INLINE_MATH = r"\$(?:[^$\n]|\n(?!\n))*\$"
NOT_PROSE = re.compile(
    rf"```.*?```|{INLINE_CODE}|\$\$.*?\$\$|{INLINE_MATH}|\]\([^)]*\)|<[^>\n]*>|\{{\w*\}}"
    r"|\bWindows\b",  # the operating system, not a window
    re.DOTALL,
)


def prose(markdown: str) -> str:
    return NOT_PROSE.sub(" ", markdown)


def _pattern(english: str) -> re.Pattern[str]:
    words = [re.escape(word) for word in re.split(r"[\s-]+", english)]
    # "block table", "block-table", "block tables"; never inside another word.
    return re.compile(r"(?<![\w-])" + r"[\s-]+".join(words) + r"(?:s|es)?(?![\w-])", re.I)


def missing_terms(english: str, chinese: str, glossary: list[Term]) -> list[Term]:
    """The glossary terms the English uses in its prose and the translation does not."""
    text = prose(english)
    return [
        term
        for term in glossary
        if _pattern(term.english).search(text) and not any(zh in chinese for zh in term.chinese)
    ]


def glossary_problems(
    texts: Iterable[tuple[str, str, str]], glossary: list[Term] | None = None
) -> list[str]:
    """One line per (where, English, translation) that leaves out a glossary term."""
    glossary = terms() if glossary is None else glossary
    problems = []
    for where, english, chinese in texts:
        for term in missing_terms(english, chinese, glossary):
            wanted = " or ".join(f"「{zh}」" for zh in term.chinese)
            problems.append(
                f"{where}: the English says {term.english!r}, the translation lacks {wanted}"
            )
    return problems
