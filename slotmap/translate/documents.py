"""Translated Markdown documents (README.md, the workshop's guide, the instructor's notes,
docs/semantics.md and docs/performance.md),
built from the English ones and per-block translations, as the notebooks are.

* The unit is a block: a paragraph, a heading, one list item, a table, a fenced code block
  (what a blank line, a heading, a fence or a list marker delimits): the smallest text that
  is translated and reviewed on its own, so a changed list item makes only that item stale.
* A block's key is its section's heading path and its place there (``two-commands#3``; the
  heading itself is ``two-commands``); its msgid is its exact English. A key that moved (a
  paragraph inserted above it) is followed by its English, as a notebook cell's changed id is.
* ``translations/<lang>/docs/<path>.po`` holds one entry per block that is prose (code blocks,
  HTML comments and generated regions are copied from English, never translated).
* A heading whose entry carries the flag ``keep-english`` keeps its whole section (down to the
  next heading of its level or above) in English; its translation says so in ``<lang>``.
* The English document's language link (``中文：[README.zh-CN.md](README.zh-CN.md)``) becomes
  the link back (``English: [README.md](README.md)``) in the built one.
* ``translations/<lang>/complete.txt`` lists the complete documents (``README.md``) beside the
  notebooks; only those are built, as ``README.zh-CN.md`` beside their English.
* In a built document, a link to another document built in the same language
  (``[docs/semantics.md](docs/semantics.md)``) leads to that translation instead.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

from slotmap.i18n import CHINESE
from slotmap.translate.notebooks import (
    COMPLETE,
    built_problems,
    carry_translation,
    listed_complete,
    read_catalog,
    write_catalog,
)

ROOT = Path(__file__).resolve().parents[2]
# The documents a translation is made from, relative to the repository's root.
DOCUMENTS = (
    "README.md",
    "workshop/README.md",
    "workshop/slides/instructor.md",
    "docs/semantics.md",
    "docs/performance.md",
)
KEEP = "keep-english"  # a heading's flag: its section stays in English
SUFFIX = {CHINESE: "zh-CN"}  # README.md -> README.zh-CN.md
LINK_LABEL = {CHINESE: "中文"}

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ITEM = re.compile(r"^( {0,3})([-*+]|\d+[.)])\s")


@dataclass
class Block:
    """Lines ``start``..``end`` (exclusive) of a document: their kind, key and English."""

    kind: str  # heading, paragraph, item, table, code, html, link
    start: int
    end: int
    text: str
    key: str = ""
    level: int = 0  # a heading's

    @property
    def translated(self) -> bool:
        return self.kind in ("heading", "paragraph", "item", "table")


def _slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    title = re.sub(r"[`*\[\]()]", "", title).strip().lower()
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def _kind(lines: list[str], start: int) -> str:
    line = lines[start]
    if HEADING.match(line):
        return "heading"
    if line.startswith("<!--"):
        return "html"
    if line.startswith("|"):
        return "table"
    if ITEM.match(line):
        return "item"
    return "paragraph"


def blocks(text: str, built_name: str = "", lang: str = CHINESE) -> list[Block]:
    """The document's blocks in order; the lines between them are blank."""
    lines = text.split("\n")
    found: list[Block] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.strip():
            index += 1
            continue
        start = index
        fence = FENCE.match(line)
        if fence:
            mark = fence.group(1)
            index += 1
            while index < len(lines) and not lines[index].strip().startswith(mark):
                index += 1
            index = min(index + 1, len(lines))
            found.append(Block("code", start, index, "\n".join(lines[start:index])))
            continue
        kind = _kind(lines, start)
        index += 1
        if kind != "heading":
            indent = len(line) - len(line.lstrip())
            while index < len(lines) and lines[index].strip():
                if kind == "html" and lines[index - 1].rstrip().endswith("-->"):
                    break  # a comment ends on its line: a table right under it is a table
                following = lines[index]
                if HEADING.match(following) or FENCE.match(following):
                    break
                if kind != "html" and following.startswith("<!--"):
                    break
                item = ITEM.match(following)
                if kind == "item" and item and len(item.group(1)) <= indent:
                    break  # the list's next item
                if kind == "paragraph" and item and not item.group(1):
                    break  # a list right under a paragraph
                index += 1
        body = "\n".join(lines[start:index])
        if built_name and kind == "paragraph" and body == language_link(built_name, lang):
            kind = "link"
        block = Block(kind, start, index, body)
        if kind == "heading":
            heading = HEADING.match(line)
            block.level = len(heading.group(1))
        found.append(block)
    _key(found)
    return found


def _key(found: list[Block]) -> None:
    """Each prose block's key: its section's heading path, then ``#n`` in that section."""
    path: list[tuple[int, str]] = []
    counts: dict[str, int] = {}
    seen: dict[str, int] = {}
    for block in found:
        if block.kind == "heading":
            title = HEADING.match(block.text.split("\n")[0]).group(2)
            path = [(level, slug) for level, slug in path if level < block.level]
            path.append((block.level, _slug(title) or "heading"))
            key = "/".join(slug for level, slug in path if level > 1) or "title"
        elif block.translated:
            section = "/".join(slug for level, slug in path if level > 1)
            counts[section] = counts.get(section, 0) + 1
            key = f"{section}#{counts[section]}"
        else:
            continue
        seen[key] = seen.get(key, 0) + 1
        block.key = key if seen[key] == 1 else f"{key}~{seen[key]}"


def built_name(document: str, lang: str = CHINESE) -> str:
    path = Path(document)
    return f"{path.stem}.{SUFFIX.get(lang, lang)}{path.suffix}"


def built_path(document: str, lang: str = CHINESE, root: Path = ROOT) -> Path:
    return (root / document).with_name(built_name(document, lang))


def po_path(document: str, lang: str = CHINESE, root: Path = ROOT) -> Path:
    return root / "translations" / lang / "docs" / Path(document).with_suffix(".po")


def language_link(name: str, lang: str = CHINESE) -> str:
    """The English document's line that leads to its translation."""
    return f"{LINK_LABEL.get(lang, lang)}：[{name}]({name})"


def back_link(document: str) -> str:
    name = Path(document).name
    return f"English: [{name}]({name})"


def document_blocks(document: str, lang: str = CHINESE, root: Path = ROOT) -> list[Block]:
    text = (root / document).read_text(encoding="utf-8")
    return blocks(text, built_name(document, lang), lang)


def _entries(catalog) -> dict[str, object]:  # noqa: ANN001
    return {message.context: message for message in catalog if message.id and message.context}


def _kept_sections(found: list[Block], entries: dict) -> set[str]:
    """The keys of the blocks that a ``keep-english`` heading keeps in English."""
    kept, level = set(), 0
    for block in found:
        if block.kind == "heading" and (not level or block.level <= level):
            message = entries.get(block.key)
            level = block.level if message is not None and KEEP in message.flags else 0
            continue
        if level and block.key:
            kept.add(block.key)
    return kept


def _current(message) -> bool:  # noqa: ANN001
    return bool(message is not None and message.string and not message.fuzzy)


@dataclass
class Status:
    """Where one document's translation stands, by block key."""

    document: str
    translated: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # in a section kept in English
    stale: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    orphaned: list[str] = field(default_factory=list)
    english: dict[str, str] = field(default_factory=dict)  # key -> English, to name a block

    @property
    def complete(self) -> bool:
        return not (self.stale or self.missing or self.orphaned)


def _translations(
    document: str, lang: str, root: Path
) -> tuple[list[Block], dict[str, object], set[str], dict[str, str]]:
    """(blocks, entries by key, kept keys, translation of each current block by key)."""
    found = document_blocks(document, lang, root)
    entries = _entries(read_catalog(po_path(document, lang, root), lang))
    kept = _kept_sections(found, entries)
    by_english = {m.id: m.string for m in entries.values() if _current(m)}
    done = {}
    for block in found:
        if not block.key or block.key in kept:
            continue
        message = entries.get(block.key)
        if _current(message) and message.id == block.text:
            done[block.key] = message.string
        elif block.text in by_english:  # moved: a block above it came or went
            done[block.key] = by_english[block.text]
    return found, entries, kept, done


def status(document: str, lang: str = CHINESE, root: Path = ROOT) -> Status:
    found, entries, kept, done = _translations(document, lang, root)
    result = Status(document)
    used = {block.text for block in found if block.key in done}
    for block in found:
        if not block.key:
            continue
        result.english[block.key] = block.text
        message = entries.get(block.key)
        if block.key in kept:
            result.kept.append(block.key)
        elif block.key in done:
            result.translated.append(block.key)
        elif message is not None and message.string and message.id not in used:
            result.stale.append(block.key)
        else:  # no entry, or its entry's English moved to another block
            result.missing.append(block.key)
    # A translation no current block uses, nor marks stale at its key: its English is gone.
    result.orphaned = [
        key
        for key, message in entries.items()
        if message.string and message.id not in used and key not in result.stale + result.kept
    ]
    return result


def update_documents(lang: str = CHINESE, root: Path = ROOT) -> list[Path]:
    """Bring every document's catalog up to its English; returns the files written. A new
    block gets an empty entry, a changed one is marked fuzzy (its old English kept as
    ``#| msgid``), a moved one follows its English, a removed one is dropped."""
    from babel.messages.catalog import Catalog

    written = []
    for document in DOCUMENTS:
        if not (root / document).exists():
            continue
        path = po_path(document, lang, root)
        old = read_catalog(path, lang)
        found, entries, kept, _ = _translations(document, lang, root)
        new = Catalog(
            locale=lang,
            project="slotmap",
            msgid_bugs_address="",
            header_comment=(
                f"# {document}, translated: one entry per block (msgctxt: its section's heading"
                "\n# path and place; msgid: its English). Code blocks are never translated; a"
                f"\n# heading flagged {KEEP} keeps its section in English. slotmap translate"
                "\n# update brings it up to the English; slotmap translate build writes"
                f" {built_name(document, lang)}. Terms: docs/glossary.md."
            ),
            creation_date=old.creation_date,
            fuzzy=False,
        )
        # A block whose key moved (one above it came or went) follows its English.
        moved = {m.id: m for m in entries.values() if m.string}
        texts = {block.text for block in found if block.key}
        for block in found:
            if not block.key or block.key in kept:
                continue
            message = entries.get(block.key)
            if message is None or message.id != block.text:
                if block.text in moved:
                    message = moved[block.text]
                elif message is not None and message.id in texts:
                    message = None  # its English moved to another block: this one is new
            carry_translation(new, block.text, block.key, message, [block.kind])
        before = path.read_bytes() if path.exists() else None
        write_catalog(path, new)
        if path.read_bytes() != before:
            written.append(path)
    return written


def complete_documents(lang: str = CHINESE, root: Path = ROOT) -> list[str]:
    """The documents ``complete.txt`` lists (its ``.md`` lines)."""
    return [line for line in listed_complete(lang, root) if line.endswith(".md")]


LINK = re.compile(r"\[([^\]\n]*)\]\(([^)\s#:]+\.md)\)")  # a relative link to a whole .md


# A link to the speaker notes names the file workshop/slides.py reads, in either language.
LINKED_AS_FILE = ("workshop/slides/instructor.md",)


def _linked_translations(lang: str, root: Path) -> set[str]:
    """The documents a link leads to the translation of: built in ``lang`` (listed complete,
    and complete) and read, not a tool's input."""
    return {
        document
        for document in complete_documents(lang, root)
        if document in DOCUMENTS
        and document not in LINKED_AS_FILE
        and status(document, lang, root).complete
    }


def _to_translations(text: str, document: str, lang: str, built: set[str]) -> str:
    """``text`` with each link to a document built in ``lang`` leading to its translation; a
    label that is the link's target (``[docs/semantics.md](docs/semantics.md)``) follows it."""

    def swap(match: re.Match) -> str:
        label, target = match.groups()
        path = posixpath.normpath(posixpath.join(posixpath.dirname(document), target))
        if path not in built:
            return match.group(0)
        translated = posixpath.join(posixpath.dirname(target), built_name(path, lang))
        return f"[{translated if label == target else label}]({translated})"

    return LINK.sub(swap, text)


def translated_document(
    document: str, lang: str = CHINESE, root: Path = ROOT, built: set[str] | None = None
) -> str:
    """The document in ``lang``: its prose translated, its code and comments as in English, a
    link to a document of ``built`` (default: every one built in ``lang``) leading to its
    translation. Raises ValueError if a block has no current translation."""
    text = (root / document).read_text(encoding="utf-8")
    lines = text.split("\n")
    found, _, kept, done = _translations(document, lang, root)
    built = _linked_translations(lang, root) if built is None else built
    out, at = [], 0
    for block in found:
        out += lines[at : block.start]
        at = block.end
        if block.kind == "link":
            out.append(back_link(document))
        elif not block.key or block.key in kept:
            out += lines[block.start : block.end]
        elif block.key in done:
            out += _to_translations(done[block.key], document, lang, built).split("\n")
        else:
            raise ValueError(f"{document}, block {block.key}: no current translation")
    out += lines[at:]
    return "\n".join(out)


def _expected(lang: str, root: Path) -> dict[Path, str]:
    built = _linked_translations(lang, root)
    return {
        built_path(document, lang, root): translated_document(document, lang, root, built)
        for document in complete_documents(lang, root)
        if document in DOCUMENTS and status(document, lang, root).complete
    }


def build_documents(lang: str = CHINESE, root: Path = ROOT) -> list[Path]:
    """Write the complete documents in ``lang``; remove a built one no longer complete.
    Raises ValueError if a document listed complete is not."""
    listed = [d for d in complete_documents(lang, root) if d in DOCUMENTS]
    unfinished = [d for d in listed if not status(d, lang, root).complete]
    if unfinished:
        raise ValueError(f"listed complete but not: {', '.join(unfinished)} (see --check)")
    expected = _expected(lang, root)
    changed = []
    for path, text in expected.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    for document in DOCUMENTS:
        path = built_path(document, lang, root)
        if path.exists() and path not in expected:
            path.unlink()
            changed.append(path)
    return changed


def _name(state: Status, key: str) -> str:
    words = " ".join(state.english.get(key, "").split())
    return f"{state.document}, block {key}" + (f" ({words[:50]!r})" if words else "")


def document_problems(lang: str = CHINESE, root: Path = ROOT) -> list[str]:
    """Stale and orphaned translations of every document, missing blocks of a document listed
    complete, a listed document that is not one, and built documents that differ."""
    problems = []
    listed = complete_documents(lang, root)
    for document in listed:
        if document not in DOCUMENTS:
            problems.append(f"{COMPLETE} lists {document}, which is not a translated document")
    for document in DOCUMENTS:
        if not (root / document).exists():
            continue
        state = status(document, lang, root)
        for key in state.stale:
            problems.append(f"{_name(state, key)}: stale (the English changed)")
        for key in state.orphaned:
            problems.append(f"{state.document}, block {key}: translated, but no such English")
        if document in listed:
            for key in state.missing:
                problems.append(f"{_name(state, key)}: missing (listed complete)")
    built = [built_path(document, lang, root) for document in DOCUMENTS]
    return problems + built_problems(
        _expected(lang, root), [path for path in built if path.exists()], root
    )


def translated_texts(lang: str = CHINESE, root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(where, English, translation) of every current translated block."""
    texts = []
    for document in DOCUMENTS:
        if not (root / document).exists():
            continue
        found, _, _, done = _translations(document, lang, root)
        for block in found:
            if block.key in done:
                texts.append((f"{document}, block {block.key}", block.text, done[block.key]))
    return texts
