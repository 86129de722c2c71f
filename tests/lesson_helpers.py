"""What the lesson tests share: the solution notebooks' code as a module, a check's failure on
a known-wrong answer, and a figure's items by gid. Test modules import them with
``from lesson_helpers import ...``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

from slotmap.exercises import get_exercise, run_check
from slotmap.exercises.core import Failure

ROOT = Path(__file__).resolve().parents[1]
TRITON_IMPORTS = "import triton\nimport triton.language as tl\n\n"


def code_cells(notebook: Path) -> list[str]:
    """The notebook's code cells, less the ones that run a check."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    sources = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]
    return [source for source in sources if "check(" not in source]


def import_source(path: Path, source: str) -> ModuleType:
    """Write ``source`` to ``path`` and import it: Triton needs a kernel's source file."""
    path.write_text(source + "\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def solution_module(directory: Path, notebook: str) -> ModuleType:
    """``solutions/<notebook>``'s code cells (without the checks) as an importable module."""
    source = "\n\n".join(code_cells(ROOT / "solutions" / notebook))
    return import_source(directory / f"solution{notebook[:2]}.py", source)


def failure(exercise_id: str, candidate) -> Failure:
    """The check's failure on a wrong ``candidate`` (and a test failure if it passed)."""
    result = run_check(get_exercise(exercise_id), candidate)
    assert not result.passed, f"{exercise_id} accepted a wrong answer"
    return result.failure


def by_gid(fig, gid, kind="patch"):
    """The patches (or texts) of the figure's first axes that carry this gid."""
    ax = fig.axes[0]
    items = ax.patches if kind == "patch" else ax.texts
    return [item for item in items if item.get_gid() == gid]


class KernelVariant:
    """A known-wrong (or right) variant of an exercise kernel: ``kernel[grid](...)`` with extra
    constexpr arguments fixed, e.g. ``KernelVariant(_variant_kernel, MISTAKE=3)``. It stands
    where a learner's ``@triton.jit`` kernel would."""

    def __init__(self, kernel, **constants):
        self.kernel = kernel
        self.constants = constants

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            return self.kernel[grid](*args, **kwargs, **self.constants)

        return launch
