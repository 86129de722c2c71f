"""Exercise notebooks are generated from the solutions; learners work in their own copies.

* ``solutions/NN_topic.ipynb`` is the single source. Answer regions sit between
  ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (code) or ``<!-- BEGIN SOLUTION -->`` and
  ``<!-- END SOLUTION -->`` (markdown).
* ``build_exercises`` writes ``exercises/NN_topic.ipynb`` with every region replaced by a stub
  and every output removed; ``stale_exercises`` lists the ones that drifted (a test).
* ``copy_to_workspace`` gives a learner ``my_work/NN_topic.ipynb`` for each exercise they do
  not have yet and never touches one that exists, so no rebuild or update overwrites work.
* ``learner_workspace`` says where the learner's ``my_work/`` is: ``$SLOTMAP_WORKSPACE``, else the
  ``my_work/`` of the course copy the current folder is in, else ``~/slotmap-course/my_work``;
  never a folder that depends on where the package is installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from slotmap.i18n import ENGLISH, N_, _, tr
from slotmap.lab import COURSE_MARKER

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
WORKSPACE_VARIABLE = "SLOTMAP_WORKSPACE"
# Where a learner's course copy goes when nothing else says (the workshop's hub puts it there).
HOME_COURSE = "slotmap-course"


def learner_workspace() -> Path:
    """The learner's ``my_work/``: ``$SLOTMAP_WORKSPACE`` if set, else ``my_work/`` in the
    nearest folder at or above the current one that holds the course's marker file, else
    ``~/slotmap-course/my_work``. It may not exist yet."""
    configured = os.environ.get(WORKSPACE_VARIABLE)
    if configured:
        return Path(configured).expanduser().resolve()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / COURSE_MARKER).is_file():
            return folder / "my_work"
    return Path.home() / HOME_COURSE / "my_work"


BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
MD_BEGIN, MD_END = "<!-- BEGIN SOLUTION -->", "<!-- END SOLUTION -->"
# In the notebook's own language (its metadata's slotmap.language), not the builder's.
STUB_ANSWER = N_("*Your answer here.*")

MY_BANNER = N_(
    "> **Your copy** of `exercises/{name}`, made once by `slotmap exercises copy` (or `make "
    "lab`): edit it freely, nothing overwrites it. Fill in every `# YOUR CODE HERE`, then run "
    "the check cell below it. To start over, delete this file and run `slotmap exercises "
    "copy` again."
)
BANNER = N_(
    "> **Exercise notebook**, generated from `solutions/{name}` by `slotmap exercises build`: "
    "do not edit it here. Work in your own copy, `my_work/{name}` (`slotmap exercises copy` "
    "makes it; `make lab` does that for you). Fill in every `# YOUR CODE HERE`, then run the "
    "check cell below it."
)


def notebook_language(notebook: dict) -> str:
    """The language a notebook is written in: its ``slotmap.language`` metadata (what
    ``slotmap translate build`` writes), else English."""
    return notebook.get("metadata", {}).get("slotmap", {}).get("language", ENGLISH)


def in_language(name: str, lang: str) -> str:
    """A notebook's path under the course's folders in ``lang``: ``01_x.ipynb`` in English,
    ``zh_CN/01_x.ipynb`` in Chinese (``solutions/zh_CN/``, ``my_work/zh_CN/``, ...)."""
    return name if lang == ENGLISH else f"{lang}/{name}"


class SolutionRegionError(ValueError):
    pass


def cut_code(source: str, where: str) -> str:
    """Replace each code answer region by ``# YOUR CODE HERE`` + ``raise NotImplementedError``,
    indented like the region's opening marker."""
    lines, out = source.split("\n"), []
    inside = False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith(BEGIN):
            if inside:
                raise SolutionRegionError(f"{where}, line {number}: nested {BEGIN}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out += [f"{indent}# YOUR CODE HERE", f"{indent}raise NotImplementedError()"]
        elif stripped.startswith(END):
            if not inside:
                raise SolutionRegionError(f"{where}, line {number}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise SolutionRegionError(f"{where}: {BEGIN} is never closed")
    return "\n".join(out)


def cut_markdown(source: str, where: str, stub: str = STUB_ANSWER) -> str:
    """Replace each markdown answer region by a placeholder, ``stub``."""
    out, rest = [], source
    while MD_BEGIN in rest:
        before, _, after = rest.partition(MD_BEGIN)
        if MD_END not in after:
            raise SolutionRegionError(f"{where}: {MD_BEGIN} is never closed")
        out.append(before + stub)
        rest = after.partition(MD_END)[2]
    if MD_END in rest:
        raise SolutionRegionError(f"{where}: {MD_END} without {MD_BEGIN}")
    return "".join(out) + rest


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def exercise_notebook(solution: Path) -> dict:
    """The exercise notebook for one solution notebook, as JSON."""
    notebook = json.loads(solution.read_text(encoding="utf-8"))
    lang = notebook_language(notebook)
    regions = 0
    cells = [
        {
            "cell_type": "markdown",
            "id": "slotmap-banner",
            "metadata": {},
            "source": _lines(tr(BANNER, lang).format(name=in_language(solution.name, lang))),
        }
    ]
    for index, cell in enumerate(notebook["cells"]):
        where = f"{solution.name}, cell {index}"
        source = _source(cell)
        if cell["cell_type"] == "code":
            stub = cut_code(source, where)
            cell = dict(cell, source=_lines(stub), outputs=[], execution_count=None)
        elif cell["cell_type"] == "markdown":
            stub = cut_markdown(source, where, tr(STUB_ANSWER, lang))
            cell = dict(cell, source=_lines(stub))
        else:
            stub = source
        regions += stub != source
        cells.append(cell)
    if regions == 0:
        raise SolutionRegionError(f"{solution.name} has no {BEGIN} region: nothing to exercise")
    metadata = dict(notebook.get("metadata", {}))
    metadata["slotmap"] = {"generated_from": f"solutions/{in_language(solution.name, lang)}"}
    if lang != ENGLISH:
        metadata["slotmap"]["language"] = lang
    return dict(notebook, cells=cells, metadata=metadata)


def _dump(notebook: dict) -> str:
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def solution_notebooks(solutions: Path = SOLUTIONS) -> list[Path]:
    return sorted(solutions.glob("[0-9][0-9]_*.ipynb"))


def build_exercises(solutions: Path = SOLUTIONS, exercises: Path = EXERCISES) -> list[Path]:
    """Write every exercise notebook from its solution; returns the files that changed."""
    exercises.mkdir(parents=True, exist_ok=True)
    changed = []
    for solution in solution_notebooks(solutions):
        target = exercises / solution.name
        text = _dump(exercise_notebook(solution))
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            changed.append(target)
    return changed


def stale_exercises(solutions: Path = SOLUTIONS, exercises: Path = EXERCISES) -> list[str]:
    """What a build would change: missing, outdated and orphaned exercise notebooks."""
    problems = []
    expected = {s.name: _dump(exercise_notebook(s)) for s in solution_notebooks(solutions)}
    for name, text in expected.items():
        target = exercises / name
        if not target.exists():
            problems.append(f"exercises/{name} is missing")
        elif target.read_text(encoding="utf-8") != text:
            problems.append(f"exercises/{name} differs from what solutions/{name} generates")
    for target in sorted(exercises.glob("[0-9][0-9]_*.ipynb")):
        if target.name not in expected:
            problems.append(f"exercises/{target.name} has no solutions/{target.name}")
    return problems


class WorkspaceError(OSError):
    """The learner's workspace cannot hold their copies; the message says why and what to do,
    in one line."""


def _cannot_write(workspace: Path, error: OSError) -> WorkspaceError:
    return WorkspaceError(
        _(
            "cannot write your copies of the exercises in {workspace}: {error}; make "
            "{workspace} a folder you can write to (chmod -R u+w {workspace}) and run again"
        ).format(workspace=workspace, error=error.strerror or error)
    )


def copy_to_workspace(exercises: Path = EXERCISES, workspace: Path | None = None) -> list[str]:
    """Give the learner a copy of each exercise they do not have; never overwrite one.
    ``workspace`` defaults to ``learner_workspace()``.

    Raises ``WorkspaceError`` when ``workspace`` is a file or cannot be written to."""
    if workspace is None:
        workspace = learner_workspace()
    if workspace.exists() and not workspace.is_dir():
        raise WorkspaceError(
            _(
                "{workspace} is a file, not a folder: your copies of the exercises go in a "
                "folder there; rename or remove that file and run again"
            ).format(workspace=workspace)
        )
    try:
        workspace.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _cannot_write(workspace, error) from error
    messages = []
    for exercise in sorted(exercises.glob("[0-9][0-9]_*.ipynb")):
        mine = workspace / exercise.name
        if mine.exists():
            if exercise.stat().st_mtime > mine.stat().st_mtime:
                messages.append(
                    _("kept {mine} (yours): {exercise} changed since you copied it").format(
                        mine=mine, exercise=exercise
                    )
                )
            continue
        notebook = json.loads(exercise.read_text(encoding="utf-8"))
        lang = notebook_language(notebook)
        banner = tr(MY_BANNER, lang).format(name=in_language(exercise.name, lang))
        for cell in notebook["cells"]:
            if cell.get("id") == "slotmap-banner":
                cell["source"] = _lines(banner)
        try:
            mine.write_text(_dump(notebook), encoding="utf-8")
        except OSError as error:
            raise _cannot_write(workspace, error) from error
        messages.append(_("new  {mine}").format(mine=mine))
    return messages
