"""The course in JupyterLab: where the course is, and the command that serves it.

The course is known by a marker file at its root, not by its folder names: a research folder
with a notebooks/ of its own must never have its outputs stripped. The command line
(``slotmap lab``), the learner's workspace and the workshop's hub all read this module; it sits
below them all and imports none of them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from slotmap import jupyter_main

COURSE_MARKER = ".slotmap-course"
CHECKOUT = Path(__file__).resolve().parents[1]  # where slotmap runs from (an editable install)


def is_course(folder: Path) -> bool:
    """Whether ``folder`` is the course's root: it holds the course's marker file."""
    return (Path(folder) / COURSE_MARKER).is_file()


def course_root() -> Path:
    """The course's root: the current folder or the nearest folder above it that holds the
    marker file, else the checkout slotmap runs from (check the answer with ``is_course``:
    slotmap installed on its own has no course)."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if is_course(folder):
            return folder
    return CHECKOUT


COURSE_FOLDERS = ("notebooks", "solutions", "exercises")


def keep_course_notebooks_clean(model: dict, path: str, contents_manager, **kwargs) -> None:
    """JupyterLab's pre-save hook for the course: a lesson, solution or exercise notebook is
    saved without outputs and with the metadata it has on disk.

    A learner running a lesson autosaves it. Without this, git would see every lesson as
    modified (a ``git pull`` of a course update would then conflict), and reopening a lesson
    would show its saved widgets as "model not found". The learner's own copies in
    ``my_work/`` are saved as they are, and so is every notebook of a server whose root is
    not the course (the hook only acts where the marker file says the course is).
    """
    if model.get("type") != "notebook" or not is_course(Path(contents_manager.root_dir)):
        return
    if path.strip("/").split("/")[0] not in COURSE_FOLDERS:
        return
    notebook = model["content"]
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
    on_disk = Path(contents_manager.root_dir) / path.strip("/")
    if on_disk.exists():
        try:
            notebook["metadata"] = json.loads(on_disk.read_text(encoding="utf-8"))["metadata"]
        except (ValueError, KeyError, OSError):
            notebook.get("metadata", {}).pop("widgets", None)
    else:
        notebook.get("metadata", {}).pop("widgets", None)


def lessons_folder(root: Path, lang: str) -> str:
    """The lessons to open in ``lang``, relative to the course's ``root``: ``notebooks/<lang>``
    once they are built, else the English ``notebooks``."""
    if lang != "en" and any((Path(root) / "notebooks" / lang).glob("[0-9][0-9]_*.ipynb")):
        return f"notebooks/{lang}"
    return "notebooks"


def exercise_copies(exercises: Path, workspace: Path, lang: str) -> list[tuple[Path, Path]]:
    """(exercises folder, the learner's copies of it) for a course in ``lang``: the English
    ones always (``my_work/``), and the language's own in a folder of their own
    (``my_work/zh_CN/``), so that switching language never touches the other's work."""
    copies = [(Path(exercises), Path(workspace))]
    if lang != "en" and (Path(exercises) / lang).is_dir():
        copies.append((Path(exercises) / lang, Path(workspace) / lang))
    return copies


LOCALE_PLUGIN = "@jupyterlab/translation-extension:plugin"


def interface_settings(lang: str) -> Path:
    """JupyterLab's application settings with its interface in ``lang`` by default: the
    installation's own overrides and page config, plus the language (a learner who picks a
    language in JupyterLab's Settings menu keeps their choice). Written to the user's cache."""
    from jupyterlab.commands import get_app_dir

    installed = Path(get_app_dir()) / "settings"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = cache / "slotmap" / "lab-settings" / lang
    folder.mkdir(parents=True, exist_ok=True)
    overrides_file = installed / "overrides.json"
    overrides = json.loads(overrides_file.read_text()) if overrides_file.is_file() else {}
    overrides.setdefault(LOCALE_PLUGIN, {})["locale"] = lang
    (folder / "overrides.json").write_text(json.dumps(overrides, indent=1), encoding="utf-8")
    page_config = installed / "page_config.json"
    if page_config.is_file():
        (folder / "page_config.json").write_bytes(page_config.read_bytes())
    return folder


def lab_command(
    port: int | None = None,
    no_browser: bool = False,
    token: str | None = None,
    ip: str = "127.0.0.1",
    extra: list[str] | None = None,
    lessons: str = "notebooks",
    lang: str = "en",
    allow_root: bool = True,
) -> list[str]:
    """The JupyterLab command line the course runs under (the browser tests use it too), opening
    on ``lessons`` with its interface in ``lang``. ``allow_root``: as root, add ``--allow-root``
    (the operator's own single-user lab; a workshop learner's server passes False)."""
    root = course_root()
    command = [
        *jupyter_main.command("jupyterlab"),
        f"--ServerApp.root_dir={root}",
        f"--ServerApp.ip={ip}",
        f"--LabApp.default_url=/lab/tree/{lessons}",
        "--ContentsManager.pre_save_hook=slotmap.lab.keep_course_notebooks_clean",
        # Notebooks open with the kernel metadata JupyterLab would add: no "unsaved" marker.
        "--ServerApp.contents_manager_class=slotmap.labserver.CourseContentsManager",
    ]
    if lang != "en":
        command.append(f"--LabApp.app_settings_dir={interface_settings(lang)}")
    if port is not None:
        command += [f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    if no_browser:
        command.append("--no-browser")
    if token is not None:
        command.append(f"--IdentityProvider.token={token}")
    if allow_root and hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    return command + list(extra or [])
