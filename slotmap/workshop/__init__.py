"""The course as a workshop on JupyterHub (``workshop/jupyterhub_config.py`` runs it).

* ``sync_course`` gives a learner their own course copy (``~/slotmap-course``): every course
  file they do not have is copied, a file they never changed is brought up to date, a file
  they changed is kept; then ``copy_to_workspace`` gives them ``my_work/`` by ``slotmap lab``'s
  rule (a copy once, never overwritten), and ``my_work/zh_CN/`` when they work in Chinese.
* ``learner_server`` is what the hub starts for each learner: it syncs their copy as that
  learner, then becomes ``jupyterhub-singleuser`` with the options ``slotmap lab`` uses, on
  the course copy, with ``$SLOTMAP_WORKSPACE`` pointing at their ``my_work/``, in the language
  ``$SLOTMAP_LANG`` says (``slotmap.workshop.language``: the learner's choice on the hub).
* ``slotmap.workshop.dashboard`` is the instructor's live view; ``slotmap.workshop.preflight``
  the check an instructor runs before the room arrives; ``slotmap.workshop.commands`` the
  ``slotmap workshop`` command, above them all.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from slotmap.exercises.build import (
    COURSE_MARKER,
    HOME_COURSE,
    WORKSPACE_VARIABLE,
    copy_to_workspace,
)
from slotmap.lab import exercise_copies

# What a learner's copy holds of the course: the lessons, the exercises, the solutions, and
# the workshop's slide decks (so that the instructor's own server on the hub has them too).
COURSE_FOLDERS = ("notebooks", "exercises", "solutions", "workshop/slides")
# In a learner's copy: the digest of each course file as last copied, to tell their edits apart.
MANIFEST = ".slotmap-sync.json"
SOURCE_VARIABLE = "SLOTMAP_COURSE_SOURCE"
STATE_VARIABLE = "SLOTMAP_HUB_STATE"
# Not the course: caches, and what running a notebook in place leaves next to it.
SKIPPED_NAMES = {"__pycache__", "my_rank_fn.py"}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def course_files(source: Path) -> list[Path]:
    """The course's files under ``source``, relative to it: the marker and every file of
    ``notebooks/``, ``exercises/`` and ``solutions/`` (no hidden files, no caches)."""
    found = [Path(COURSE_MARKER)]
    for folder in COURSE_FOLDERS:
        for path in sorted((source / folder).rglob("*")):
            relative = path.relative_to(source)
            hidden = any(part.startswith(".") for part in relative.parts)
            if path.is_file() and not hidden and not SKIPPED_NAMES.intersection(relative.parts):
                found.append(relative)
    return found


def sync_course(source: Path, target: Path, lang: str = "en") -> list[str]:
    """Bring the learner's course copy ``target`` up to date with the course at ``source``,
    never overwriting what the learner changed, then give them ``my_work/`` (and, in a
    language other than English, that language's exercises in ``my_work/<lang>/``).

    A course file missing from ``target`` is copied; one whose bytes are still those last
    copied is replaced by a newer version; one the learner edited is kept (and said so).
    Returns one line per file copied, updated or kept."""
    target.mkdir(parents=True, exist_ok=True)
    manifest_path = target / MANIFEST
    try:
        copied = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        copied = {}
    messages = []
    for relative in course_files(source):
        origin, mine, key = source / relative, target / relative, relative.as_posix()
        new = _digest(origin)
        if mine.exists():
            have = _digest(mine)
            if have == new:
                copied[key] = new
                continue
            if copied.get(key) != have:  # the learner edited it (or it predates the manifest)
                messages.append(f"kept {mine} (yours): the course's {key} changed")
                continue
            messages.append(f"updated {mine}")
        else:
            messages.append(f"new  {mine}")
        mine.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(origin, mine)
        copied[key] = new
    manifest_path.write_text(json.dumps(copied, indent=1, sort_keys=True), encoding="utf-8")
    for exercises, workspace in exercise_copies(target / "exercises", target / "my_work", lang):
        messages += copy_to_workspace(exercises, workspace)
    return messages


def course_source() -> Path:
    """The course the hub hands out: ``$SLOTMAP_COURSE_SOURCE``, else this checkout."""
    from slotmap.lab import CHECKOUT

    return Path(os.environ.get(SOURCE_VARIABLE) or CHECKOUT).resolve()


def learner_course() -> Path:
    """The learner's course copy: ``~/slotmap-course``."""
    return Path.home() / HOME_COURSE


def state_folder() -> Path:
    """The hub's state (its database, cookie secret, the accounts it created): root's only."""
    return Path(os.environ.get(STATE_VARIABLE) or "/var/lib/slotmap-hub")


def learner_server_command(course: Path, extra: list[str], lang: str = "en") -> list[str]:
    """``jupyterhub-singleuser`` on ``course`` with ``slotmap lab``'s server options in
    ``lang`` (JupyterLab's menus in it; never ``--allow-root``: a learner's server never runs
    as root)."""
    from slotmap import jupyter_main
    from slotmap.lab import lab_command, lessons_folder

    cwd = Path.cwd()
    os.chdir(course)  # lab_command serves the course it is in
    try:
        lab = lab_command(allow_root=False, lang=lang, lessons=lessons_folder(course, lang))
    finally:
        os.chdir(cwd)
    # The hub says where to listen ($JUPYTERHUB_SERVICE_URL): drop the lab's own address.
    options = lab[len(jupyter_main.command("jupyterlab")) :]
    options = [option for option in options if not option.startswith("--ServerApp.ip=")]
    return [*jupyter_main.command("jupyterhub.singleuser"), *options, *extra]


# JupyterLab asks every new user "get notified about official Jupyter news?" unless this
# setting says no (turning the news feed off, --LabApp.news_url=None, does not stop it).
LAB_NOTIFICATIONS = Path("@jupyterlab/apputils-extension/notification.jupyterlab-settings")


def quiet_lab_settings(settings: Path) -> None:
    """The course's JupyterLab settings in ``settings`` (the user-settings folder): no news
    and no update checks; a learner's own choice, once made, is kept."""
    path = settings / LAB_NOTIFICATIONS
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


def learner_server(extra: list[str]) -> int:
    """Sync the learner's course copy, then exec their single-user server (the hub's
    ``Spawner.cmd``; runs as the learner, never as root)."""
    if os.geteuid() == 0:
        print("slotmap workshop learner-server: refused: a learner's server never runs as root")
        return 2
    from slotmap import i18n

    lang = i18n.from_environment()  # the learner's choice: the hub sets $SLOTMAP_LANG
    course = learner_course()
    settings = os.environ.get("JUPYTERLAB_SETTINGS_DIR")
    quiet_lab_settings(Path(settings) if settings else Path.home() / ".jupyter/lab/user-settings")
    for message in sync_course(course_source(), course, lang):
        print(f"slotmap workshop: {message}", flush=True)
    os.environ[WORKSPACE_VARIABLE] = str(course / "my_work")  # both languages' records go here
    os.environ[i18n.LANG_VAR] = lang  # the kernels speak it too
    command = learner_server_command(course, extra, lang)
    os.chdir(course)
    os.execv(command[0], command)
    return 0  # not reached
