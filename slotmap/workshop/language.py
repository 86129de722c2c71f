"""The language of each learner's server on the hub: English or 中文, chosen in the form the
hub shows before it starts the server.

The room's default is ``$SLOTMAP_HUB_LANG`` (``en`` when unset); JupyterHub keeps each
learner's last choice and the form offers it again at their next start. A server in Chinese
gets ``$SLOTMAP_LANG=zh_CN`` (its kernels' messages, and the lessons, exercises and
JupyterLab's menus ``slotmap.workshop.learner_server`` gives it) and opens on the learner's
Chinese exercises, ``my_work/zh_CN/``: each language has its own copies, so that switching
back and forth loses no work.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slotmap.i18n import CHINESE, ENGLISH, LANG_VAR, normalize

ROOM_VARIABLE = "SLOTMAP_HUB_LANG"
FIELD = "lang"  # the form's field, and the key of the learner's options in the hub's database
CHOICES = ((ENGLISH, "English"), (CHINESE, "中文"))
WORKSPACE_URL = "/lab/tree/my_work"


def room_language(environ: Mapping[str, str] | None = None) -> str:
    """The room's default language: ``$SLOTMAP_HUB_LANG`` (``en``, ``zh``, ...), else English.
    Raises ValueError for a language the course does not have."""
    environ = os.environ if environ is None else environ
    return normalize(environ.get(ROOM_VARIABLE, "").strip() or ENGLISH)


def chosen_language(user_options: Mapping[str, Any] | None, room: str) -> str:
    """The language a learner's server speaks: their choice in ``user_options`` (the form's,
    or a REST request's body), else the room's. Raises ValueError for one the course does
    not have (the hub answers 400)."""
    chosen = (user_options or {}).get(FIELD) or room
    if not isinstance(chosen, str):
        raise ValueError(f"{FIELD}: {chosen!r} is not a language")
    return normalize(chosen)


def options_form(user_options: Mapping[str, Any] | None, room: str) -> str:
    """The form's fields (JupyterHub adds the form and its Start button): one choice per
    language, the learner's last one (else the room's) already chosen."""
    try:
        current = chosen_language(user_options, room)
    except ValueError:  # a value the course no longer has: offer the room's
        current = room
    rows = [
        "<p>Your course's language: the lessons, the exercises and JupyterLab's menus. "
        "Your work in the other language stays where it is.<br>"
        "课程语言：课程、练习和 JupyterLab 的菜单。另一种语言中的作业原样保留。</p>"
    ]
    for lang, label in CHOICES:
        checked = " checked" if lang == current else ""
        rows.append(
            f'<label style="margin-right: 2em"><input type="radio" name="{FIELD}" '
            f'value="{html.escape(lang)}" id="{FIELD}-{lang}"{checked}> {html.escape(label)}'
            "</label>"
        )
    return "\n".join(rows)


def options_from_form(form_data: Mapping[str, list[str]]) -> dict[str, str]:
    """The learner's options from the submitted form: ``{"lang": "en" | "zh_CN"}``."""
    values = form_data.get(FIELD) or [""]
    return {FIELD: normalize(values[0])} if values[0] else {}


def server_settings(lang: str, course: Path) -> tuple[dict[str, str], str]:
    """(environment, default URL) of a learner's server in ``lang``: ``$SLOTMAP_LANG``, and
    the learner's exercise copies in that language (``my_work/zh_CN``) when the course has
    them, else ``my_work``."""
    url = WORKSPACE_URL
    if lang != ENGLISH and (Path(course) / "exercises" / lang).is_dir():
        url = f"{WORKSPACE_URL}/{lang}"
    return {LANG_VAR: lang}, url
