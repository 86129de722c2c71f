"""Translated notebooks, built from the English ones and per-cell translations.

* The English ``notebooks/NN_*.ipynb`` and ``solutions/NN_*.ipynb`` are the source.
* ``translations/<lang>/<folder>/NN_*.po`` holds one entry per markdown cell: msgctxt the cell's
  id, msgid the cell's English (the key: a changed English is a stale translation, and the
  reviewer sees both), msgstr the translation. A gettext file, so that any PO editor opens it.
* ``update_translations`` adds the new cells, marks a changed cell fuzzy (its old English kept
  as ``#| msgid``, its translation kept for the translator to mend), follows a cell whose id
  changed but whose English did not, and drops removed cells.
* ``translations/<lang>/complete.txt`` lists, one a line, the notebooks whose translation is
  complete and reviewed. Only those are built: ``<folder>/<lang>/NN_*.ipynb``, with every code
  cell exactly as in English. The exercises in ``<lang>`` are built from the solutions in
  ``<lang>`` by ``slotmap exercises build``'s own rule.
* ``translation_problems`` (``slotmap translate build --check``) names every stale translation
  anywhere, every missing cell of a notebook listed complete, and every built notebook that
  differs from what a build writes.
"""

from __future__ import annotations

import copy
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from slotmap.exercises import build as exercises_build
from slotmap.i18n import CHINESE
from slotmap.translate.glossary import INLINE_CODE, INLINE_MATH

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("notebooks", "solutions")  # exercises are built from translated solutions
COMPLETE = "complete.txt"


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def english_notebooks(root: Path = ROOT) -> list[str]:
    """Every English notebook a translation is made from, as ``folder/name``."""
    return [
        f"{folder}/{path.name}"
        for folder in SOURCE_FOLDERS
        for path in sorted((root / folder).glob("[0-9][0-9]_*.ipynb"))
    ]


def po_path(notebook: str, lang: str = CHINESE, root: Path = ROOT) -> Path:
    folder, name = notebook.split("/")
    return root / "translations" / lang / folder / (Path(name).stem + ".po")


def built_path(notebook: str, lang: str = CHINESE, root: Path = ROOT) -> Path:
    folder, name = notebook.split("/")
    return root / folder / lang / name


def markdown_cells(notebook: str, root: Path = ROOT) -> list[tuple[str, str]]:
    """(cell id, English source) of each markdown cell, in order."""
    cells = json.loads((root / notebook).read_text(encoding="utf-8"))["cells"]
    found = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        if not cell.get("id"):
            raise ValueError(f"{notebook}, cell {index}: no cell id (nbformat 4.5 gives one)")
        found.append((cell["id"], _source(cell)))
    return found


def read_catalog(path: Path, lang: str = CHINESE):  # noqa: ANN201 - babel's Catalog
    """The gettext file at ``path``, or an empty catalog if there is none yet."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po

    if not path.exists():
        return Catalog(locale=lang, fuzzy=False)
    with path.open("rb") as handle:
        return read_po(handle)


def write_catalog(path: Path, catalog) -> None:  # noqa: ANN001
    from babel.messages.pofile import write_po

    buffer = io.BytesIO()
    write_po(buffer, catalog, include_previous=True, omit_header=False, width=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())


def _entries(catalog) -> dict[str, object]:  # noqa: ANN001
    """The catalog's messages by cell id (msgctxt); the header has none and is left out."""
    return {message.context: message for message in catalog if message.id and message.context}


@dataclass
class Status:
    """Where one notebook's translation stands."""

    notebook: str
    translated: list[str] = field(default_factory=list)  # cell ids
    stale: list[str] = field(default_factory=list)  # translated from English that has changed
    missing: list[str] = field(default_factory=list)  # no translation yet
    orphaned: list[str] = field(default_factory=list)  # translated cells the English lost

    @property
    def complete(self) -> bool:
        return not (self.stale or self.missing or self.orphaned)


def status(notebook: str, lang: str = CHINESE, root: Path = ROOT) -> Status:
    entries = _entries(read_catalog(po_path(notebook, lang, root), lang))
    result = Status(notebook)
    current = markdown_cells(notebook, root)
    for cell_id, english in current:
        message = entries.get(cell_id)
        if message is None or not message.string:
            result.missing.append(cell_id)
        elif message.fuzzy or message.id != english:
            result.stale.append(cell_id)
        else:
            result.translated.append(cell_id)
    ids = {cell_id for cell_id, _ in current}
    result.orphaned = [cid for cid, m in entries.items() if m.string and cid not in ids]
    return result


def update_translations(lang: str = CHINESE, root: Path = ROOT) -> list[Path]:
    """Bring every notebook's translation file up to its English; returns the files written.
    New cells get an empty entry, a changed cell is marked fuzzy, a removed cell is dropped."""
    from babel.messages.catalog import Catalog

    written = []
    for notebook in english_notebooks(root):
        path = po_path(notebook, lang, root)
        old = read_catalog(path, lang)
        entries = _entries(old)
        new = Catalog(
            locale=lang,
            project="slotmap",
            msgid_bugs_address="",
            header_comment=(
                f"# {notebook}, translated: one entry per markdown cell (msgctxt: the cell's id;"
                "\n# msgid: its English). slotmap translate update brings it up to the English;"
                "\n# slotmap translate build writes the translated notebook."
                " Terms: docs/glossary.md."
            ),
            creation_date=old.creation_date,
            fuzzy=False,
        )
        cells = markdown_cells(notebook, root)
        # A cell whose id changed but whose English did not keeps its translation.
        current = {cell_id for cell_id, _ in cells}
        moved = {m.id: m for cid, m in entries.items() if cid not in current and m.string}
        for cell_id, english in cells:
            carry_translation(new, english, cell_id, entries.get(cell_id) or moved.get(english))
        before = path.read_bytes() if path.exists() else None
        write_catalog(path, new)
        if path.read_bytes() != before:
            written.append(path)
    return written


def carry_translation(new, english: str, key: str, message, comments=()) -> None:  # noqa: ANN001
    """Add ``english`` under ``key`` to the catalog ``new``, with the translation ``message``
    held (None: none yet): as it was when its English is unchanged, else marked fuzzy with the
    English it was made from, so that a translator sees what changed."""
    comments = list(comments)
    if message is None:
        new.add(english, "", context=key, auto_comments=comments)
    elif message.id == english:
        new.add(english, message.string, context=key, flags=message.flags, auto_comments=comments)
    else:
        previous = message.previous_id if message.fuzzy and message.previous_id else None
        flags = (set(message.flags) - {"fuzzy"}) | ({"fuzzy"} if message.string else set())
        new.add(
            english,
            message.string,
            context=key,
            flags=flags,
            auto_comments=comments,
            previous_id=previous or (message.id if message.string else ()),
        )


def listed_complete(lang: str = CHINESE, root: Path = ROOT) -> list[str]:
    """Every line of ``translations/<lang>/complete.txt``: notebooks and documents (``.md``)."""
    path = root / "translations" / lang / COMPLETE
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def complete_list(lang: str = CHINESE, root: Path = ROOT) -> list[str]:
    """The notebooks ``translations/<lang>/complete.txt`` says are translated and reviewed
    (its documents are slotmap.translate.documents')."""
    return [line for line in listed_complete(lang, root) if not line.endswith(".md")]


def translated_notebook(notebook: str, lang: str = CHINESE, root: Path = ROOT) -> dict:
    """The notebook in ``lang``: markdown cells translated, every other cell as in English.
    Raises ValueError if a markdown cell has no current translation."""
    data = json.loads((root / notebook).read_text(encoding="utf-8"))
    entries = _entries(read_catalog(po_path(notebook, lang, root), lang))
    cells = []
    for cell in data["cells"]:
        cell = copy.deepcopy(cell)
        if cell["cell_type"] == "markdown":
            message = entries.get(cell["id"])
            english = _source(cell)
            if message is None or not message.string or message.fuzzy or message.id != english:
                raise ValueError(f"{notebook}, cell {cell['id']}: no current translation")
            cell["source"] = message.string.splitlines(keepends=True)
        cells.append(cell)
    metadata = dict(data.get("metadata", {}))
    metadata["slotmap"] = {"translated_from": notebook, "language": lang}
    return dict(data, cells=cells, metadata=metadata)


def _dump(notebook: dict) -> str:
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _expected(lang: str, root: Path) -> dict[Path, str]:
    """Every file a build writes, and its text (complete notebooks only)."""
    return {
        built_path(notebook, lang, root): _dump(translated_notebook(notebook, lang, root))
        for notebook in complete_list(lang, root)
        if status(notebook, lang, root).complete
    }


def _built(lang: str, root: Path) -> list[Path]:
    return [
        path
        for folder in SOURCE_FOLDERS
        for path in sorted((root / folder / lang).glob("[0-9][0-9]_*.ipynb"))
    ]


def build_translations(lang: str = CHINESE, root: Path = ROOT) -> list[Path]:
    """Write the complete notebooks in ``lang`` and the exercises built from its solutions;
    remove a built notebook whose translation is no longer complete. Returns what changed.
    Raises ValueError if a notebook listed complete is not."""
    unfinished = [n for n in complete_list(lang, root) if not status(n, lang, root).complete]
    if unfinished:
        raise ValueError(f"listed complete but not: {', '.join(unfinished)} (see --check)")
    expected = _expected(lang, root)
    changed = []
    for path, text in expected.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    for path in _built(lang, root):
        if path not in expected:
            path.unlink()
            changed.append(path)
    solutions = root / "solutions" / lang
    if solutions.is_dir():
        changed += exercises_build.build_exercises(solutions, root / "exercises" / lang)
    return changed


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root))


def built_problems(expected: dict[Path, str], built: list[Path], root: Path) -> list[str]:
    """The built files (``built``: those on disk) against what a build writes (``expected``:
    path -> text): missing, different, or built from a translation that is not complete."""
    problems = []
    for path, text in expected.items():
        if not path.exists():
            problems.append(f"{_relative(path, root)} is missing (slotmap translate build)")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{_relative(path, root)} differs from what its translation builds")
    for path in built:
        if path not in expected:
            problems.append(
                f"{_relative(path, root)} is built, but its translation is not complete"
            )
    return problems


def translation_problems(lang: str = CHINESE, root: Path = ROOT) -> list[str]:
    """Every reason the translation in ``lang`` is not what it claims: stale and orphaned
    translations anywhere, missing cells of a notebook listed complete, a listed notebook that
    does not exist, and built notebooks that differ from what a build writes."""
    problems = []
    sources = english_notebooks(root)
    listed = complete_list(lang, root)
    for notebook in listed:
        if notebook not in sources:
            problems.append(f"{COMPLETE} lists {notebook}, which is not an English notebook")
    for notebook in sources:
        state = status(notebook, lang, root)
        for cell_id in state.stale:
            problems.append(f"{notebook}, cell {cell_id}: stale (the English changed)")
        for cell_id in state.orphaned:
            problems.append(f"{notebook}, cell {cell_id}: translated, but no such English cell")
        if notebook in listed:
            for cell_id in state.missing:
                problems.append(f"{notebook}, cell {cell_id}: missing (listed complete)")
    problems += built_problems(_expected(lang, root), _built(lang, root), root)
    solutions = root / "solutions" / lang
    if solutions.is_dir():
        problems += [
            f"{lang}: {p}"
            for p in exercises_build.stale_exercises(solutions, root / "exercises" / lang)
        ]
    return problems


# What a translation must carry over from its English unchanged: code, math, links, the
# markers the exercise build cuts at, HTML tags (<details>), and every number in the prose.
KEPT = re.compile(
    rf"```.*?```|{INLINE_CODE}|\$\$.*?\$\$|{INLINE_MATH}|\]\([^)]*\)|<!--.*?-->"
    r"|</?[a-zA-Z][^>\n]*>",
    re.DOTALL,
)
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?![\w])")


def carried_over(english: str) -> tuple[list[str], set[str]]:
    """(code, math, links, markers and tags in order; numbers in the prose) of a text."""
    kept = KEPT.findall(english)
    return kept, set(NUMBER.findall(KEPT.sub(" ", english)))


# A course folder's notebook in the translation's own language: `exercises/zh_CN/01_x.ipynb`
# translates `exercises/01_x.ipynb` (the learner's copies are in `my_work/zh_CN/`).
OWN_FOLDER = re.compile(r"\b(exercises|my_work|notebooks|solutions)/[a-z]{2}_[A-Z]{2}/")


def carry_over_problems(where: str, english: str, chinese: str) -> list[str]:
    """What the translation dropped or changed of what it must keep."""
    kept, numbers = carried_over(OWN_FOLDER.sub(r"\1/", english))
    kept_zh, numbers_zh = carried_over(OWN_FOLDER.sub(r"\1/", chinese))
    problems = []
    if sorted(kept) != sorted(kept_zh):
        lost = sorted(set(kept) - set(kept_zh)) or sorted(set(kept_zh) - set(kept))
        problems.append(f"{where}: code, math, links or markers differ from the English: {lost}")
    if numbers - numbers_zh:
        problems.append(f"{where}: numbers of the English missing: {sorted(numbers - numbers_zh)}")
    return problems


def translated_texts(lang: str = CHINESE, root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(where, English, translation) of every current translated cell."""
    texts = []
    for notebook in english_notebooks(root):
        entries = _entries(read_catalog(po_path(notebook, lang, root), lang))
        for cell_id, english in markdown_cells(notebook, root):
            message = entries.get(cell_id)
            if message and message.string and not message.fuzzy and message.id == english:
                texts.append((f"{notebook}, cell {cell_id}", english, message.string))
    return texts
