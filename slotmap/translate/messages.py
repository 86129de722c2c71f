"""The runtime messages' gettext catalog, with Babel: extract, update, compile, check.

* Extract: every ``_("...")``, ``N_("...")`` (a message defined at import time, translated
  where it is shown by ``tr``) and ``ngettext`` in the files ``babel.cfg`` names.
* Update: ``slotmap/locale/<lang>/LC_MESSAGES/slotmap.po`` gains the new messages; a changed
  message is matched to its old translation and marked fuzzy; a removed one becomes obsolete.
* Compile: ``slotmap.mo`` beside it, what ``slotmap.i18n`` reads at run time (committed, so
  that a learner's install needs no Babel; the check keeps it equal to the ``.po``).
* Check (``message_problems``): every extracted message translated, nothing fuzzy or
  obsolete, the same ``{placeholders}`` in both languages, the glossary's terms, and a ``.mo``
  that is the ``.po`` compiled.
"""

from __future__ import annotations

import io
import string
from pathlib import Path

from slotmap.i18n import CHINESE, DOMAIN, LOCALE_DIR
from slotmap.translate.glossary import glossary_problems

ROOT = Path(__file__).resolve().parents[2]
BABEL_CFG = "babel.cfg"
# Babel's defaults have N_ already; the course depends on it (import-time messages), so it says so.
KEYWORDS = {"_": None, "N_": None, "ngettext": (1, 2)}
HEADER = """\
# What slotmap says at run time, translated. English is the source: wrap a message in
# slotmap.i18n._() in the code, run `slotmap translate messages` (it extracts, updates this
# file and compiles slotmap.mo), translate here, run it again.
# The terms: docs/glossary.md."""


def po_path(lang: str = CHINESE, locale_dir: Path = LOCALE_DIR) -> Path:
    return locale_dir / lang / "LC_MESSAGES" / f"{DOMAIN}.po"


def extract(root: Path = ROOT):  # noqa: ANN201 - babel's Catalog
    """The template: every message the source wraps, as Babel extracts it."""
    from babel.messages.catalog import Catalog
    from babel.messages.extract import DEFAULT_KEYWORDS, extract_from_dir
    from babel.messages.frontend import parse_mapping_cfg

    with (root / BABEL_CFG).open(encoding="utf-8") as handle:
        method_map, options_map = parse_mapping_cfg(handle)
    template = Catalog(project="slotmap", fuzzy=False)
    found = extract_from_dir(
        str(root),
        method_map,
        options_map,
        keywords={**DEFAULT_KEYWORDS, **KEYWORDS},
        strip_comment_tags=True,
    )
    for filename, lineno, message, comments, context in found:
        template.add(
            message,
            None,
            [(Path(filename).as_posix(), lineno)],
            auto_comments=comments,
            context=context,
        )
    return template


def read(lang: str = CHINESE, locale_dir: Path = LOCALE_DIR):  # noqa: ANN201
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po

    path = po_path(lang, locale_dir)
    if not path.exists():
        return Catalog(locale=lang, domain=DOMAIN, fuzzy=False)
    with path.open("rb") as handle:
        return read_po(handle, locale=lang, domain=DOMAIN)


def compiled(catalog) -> bytes:  # noqa: ANN001
    from babel.messages.mofile import write_mo

    buffer = io.BytesIO()
    write_mo(buffer, catalog, use_fuzzy=False)
    return buffer.getvalue()


def update(lang: str = CHINESE, root: Path = ROOT, locale_dir: Path = LOCALE_DIR) -> list[Path]:
    """Extract, update the ``.po`` and compile the ``.mo``; returns the files that changed."""
    from babel.messages.pofile import write_po

    catalog = read(lang, locale_dir)
    catalog.project, catalog.msgid_bugs_address = "slotmap", ""
    catalog.header_comment = HEADER
    catalog.update(extract(root), update_creation_date=False)
    catalog.fuzzy = False  # the header: a catalog marked fuzzy would not compile at all
    buffer = io.BytesIO()
    write_po(buffer, catalog, include_previous=True, width=0, sort_by_file=True)
    po = po_path(lang, locale_dir)
    changed = []
    for path, data in ((po, buffer.getvalue()), (po.with_suffix(".mo"), compiled(catalog))):
        if not path.exists() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            changed.append(path)
    return changed


def _fields(text: str) -> list[str]:
    try:
        return sorted(name for _, name, _, _ in string.Formatter().parse(text) if name is not None)
    except ValueError as error:
        return [f"unparsable: {error}"]


def _forms(message) -> list[str]:  # noqa: ANN001
    value = message if isinstance(message, str) else None
    if value is not None:
        return [value]
    return [form for form in message if form]


def message_problems(
    lang: str = CHINESE, root: Path = ROOT, locale_dir: Path = LOCALE_DIR
) -> list[str]:
    """Why the catalog in ``lang`` does not say everything the source says, or says it wrong."""
    template = extract(root)
    catalog = read(lang, locale_dir)
    where = po_path(lang, locale_dir).relative_to(root).as_posix()
    problems = []
    wanted = {message.id: message for message in template if message.id}
    have = {message.id: message for message in catalog if message.id}
    for key, source in wanted.items():
        message = have.get(key)
        line = ", ".join(f"{f}:{n}" for f, n in source.locations)
        if message is None:
            problems.append(f"{where}: missing {key!r} ({line}): run slotmap translate messages")
        elif not all(_forms(message.string)) or not _forms(message.string):
            problems.append(f"{where}: untranslated {key!r} ({line})")
        elif message.fuzzy:
            problems.append(f"{where}: fuzzy {key!r} (the English changed): review it")
        else:
            english = _fields(key if isinstance(key, str) else key[0])
            for form in _forms(message.string):
                if _fields(form) != english:
                    problems.append(
                        f"{where}: {key!r} has placeholders {_fields(form)}, not {english}"
                    )
    for key in have.keys() - wanted.keys():
        problems.append(f"{where}: obsolete {key!r}: the source no longer says it")
    for message in catalog.obsolete.values():
        problems.append(f"{where}: obsolete #~ {message.id!r}: delete it")
    texts = [
        (f"{where} {key!r}", key if isinstance(key, str) else key[0], " ".join(_forms(m.string)))
        for key, m in have.items()
        if key in wanted and m.string and not m.fuzzy
    ]
    problems += glossary_problems(texts)
    mo = po_path(lang, locale_dir).with_suffix(".mo")
    if not mo.exists() or mo.read_bytes() != compiled(catalog):
        problems.append(
            f"{where}: {mo.name} is not the .po compiled: run slotmap translate messages"
        )
    return problems
