"""The language the course speaks at run time, and ``_()``, through which every learner-facing
message passes.

English is the source language: a message is written in English in the code, wrapped in
``_()``, and translated in the gettext catalog ``slotmap/locale/<lang>/LC_MESSAGES/slotmap.po``
(Babel extracts, updates and compiles it: ``slotmap translate messages``). A message with no
translation is shown in English.

The language: ``$SLOTMAP_LANG`` (``zh``, ``zh_CN`` or ``en``) if set, else the locale
(``$LANGUAGE``, ``$LC_ALL``, ``$LC_MESSAGES``, ``$LANG``: a ``zh`` one chooses Chinese), else
English. ``slotmap lab --lang zh`` sets ``$SLOTMAP_LANG`` for the notebooks' kernels. It is read
when this module is first imported; ``use(lang)`` changes it afterwards (tests, a hub).

A message defined at import time (an exercise's title, a hint held by a module-level object)
is marked with ``N_("...")``, which Babel extracts and which returns it unchanged, and is
translated where it is shown, with ``tr(message)``: so it follows ``use(lang)`` instead of the
language of the moment its module was imported.
"""

from __future__ import annotations

import functools
import gettext
import os
import unicodedata
from pathlib import Path

DOMAIN = "slotmap"
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
LANG_VAR = "SLOTMAP_LANG"
ENGLISH = "en"
CHINESE = "zh_CN"
LANGUAGES = (ENGLISH, CHINESE)
# What a learner may type for each language (``--lang``, ``$SLOTMAP_LANG``).
ALIASES = {"en": ENGLISH, "english": ENGLISH, "zh": CHINESE, "zh_cn": CHINESE, "zh-cn": CHINESE}
LOCALE_VARS = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")


def normalize(lang: str) -> str:
    """``zh``, ``zh-CN``, ``zh_CN.UTF-8`` -> ``zh_CN``; ``en``, ``en_US`` -> ``en``.

    Raises ValueError for a language the course does not have."""
    key = lang.strip().split(".")[0].split("@")[0].lower()
    if key in ALIASES:
        return ALIASES[key]
    if key.startswith("zh"):
        return CHINESE
    if key.startswith("en") or key in ("c", "posix"):
        return ENGLISH
    # Said in the language spoken so far (English while the environment is being read).
    raise ValueError(
        _("{lang}: the course speaks en (English) and zh (简体中文)").format(lang=repr(lang))
    )


def from_environment(environ: dict[str, str] | None = None) -> str:
    """The language the environment asks for: ``$SLOTMAP_LANG``, else a ``zh`` locale, else
    English."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(LANG_VAR, "").strip()
    if chosen:
        return normalize(chosen)
    for name in LOCALE_VARS:
        value = environ.get(name, "").strip()
        if value:
            # $LANGUAGE may list several (zh_CN:en); the first decides.
            first = value.split(":")[0]
            return CHINESE if first.lower().startswith("zh") else ENGLISH
    return ENGLISH


@functools.cache
def _translations(lang: str) -> gettext.NullTranslations:
    if lang == ENGLISH:
        return gettext.NullTranslations()
    # fallback: a catalog not compiled yet shows English rather than failing the course.
    return gettext.translation(DOMAIN, LOCALE_DIR, languages=[lang], fallback=True)


_catalog: gettext.NullTranslations = gettext.NullTranslations()  # until the language is read
_current = from_environment()
_catalog = _translations(_current)


def use(lang: str) -> str:
    """Speak ``lang`` from now on in this process; returns the normalized name."""
    global _current, _catalog
    _current = normalize(lang)
    _catalog = _translations(_current)
    return _current


def language() -> str:
    """The language the course speaks now: ``en`` or ``zh_CN``."""
    return _current


def _(message: str) -> str:
    """``message`` (English, a literal so that Babel can extract it) in the course's language.
    Placeholders are filled after translation: ``_("{n} slots").format(n=n)``."""
    return _catalog.gettext(message)


def ngettext(singular: str, plural: str, n: int, lang: str | None = None) -> str:
    """The singular or plural form for ``n`` in the course's language, or in ``lang``."""
    catalog = _catalog if lang is None else _translations(normalize(lang))
    return catalog.ngettext(singular, plural, n)


def N_(message: str) -> str:
    """Mark ``message`` for extraction without translating it: for a string built at import
    time (an exercise's title or hint kept in a module-level object), which must not freeze
    the language of the moment it was imported. Returns ``message`` unchanged; show it with
    ``tr(message)``."""
    return message


def tr(message: str, lang: str | None = None) -> str:
    """``message`` (English, marked with ``N_`` where it was defined) in the course's language
    now, at the time it is shown, or in ``lang`` (a notebook's own language). Unlike ``_``, its
    argument is a variable: Babel extracts the literal at the ``N_``."""
    if not message:
        return message  # gettext("") is the catalog's header
    catalog = _catalog if lang is None else _translations(normalize(lang))
    return catalog.gettext(message)


def columns(text: str) -> int:
    """Columns ``text`` takes in a terminal or a monospaced font: a CJK character takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
